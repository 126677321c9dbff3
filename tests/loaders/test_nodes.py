"""torchdata.nodes (torchdata >= 0.10) as a front door: the recipe, its checkpoint, ranks, composition."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import webdataset as wds
from builders import write_index
from PIL import Image

import wds_datapipes as wd

tn = pytest.importorskip("torchdata.nodes", reason="torchdata < 0.10 has no torchdata.nodes (the newest stack has)")

SIZES = [30, 17, 44, 9, 26]


@pytest.fixture
def jpeg_index(tmp_path) -> str:
    rng = np.random.default_rng(0)
    paths = []
    for shard, n in enumerate(SIZES):
        path = tmp_path / f"j-{shard:03d}.tar"
        with wds.TarWriter(str(path)) as writer:
            for i in range(n):
                image = io.BytesIO()
                Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(image, format="JPEG")
                writer.write({"__key__": f"j{shard}-{i:03d}", "jpg": image.getvalue(), "cls": str(i % 10)})
        paths.append(str(path))
    return write_index(paths, tmp_path / "index.json")


JOB = r'''
import json, sys
import torchdata.nodes as tn
import wds_datapipes as wd

index, method, what, state = sys.argv[1:5]

def loader():
    source = wd.ExactEpochs(index, batch_size=8, seed=0)
    node = tn.IterableWrapper(source)                       # this rank's raw samples
    node = tn.ParallelMapper(node, map_fn=wd.decoding.SampleDecoder("torchrgb8"), num_workers=2,
                             method=method, in_order=True)  # decoded in parallel
    node = tn.Batcher(node, batch_size=8, drop_last=False)
    node = tn.Mapper(node, map_fn=wd.collate)
    return tn.Loader(tn.Prefetcher(node, prefetch_factor=2))

out = []
if what == "whole":
    l = loader()
    out = [[list(b["__key__"]) for b in l] for _ in range(2)]
elif what == "head":
    l = loader()
    it = iter(l)
    out = [list(next(it)["__key__"]) for _ in range(5)]
    json.dump(l.state_dict(), open(state, "w"))
    del it, l  # stops the mapper's and prefetcher's threads: left decoding at exit, they abort it
    import gc; gc.collect()
else:
    l = loader()
    l.load_state_dict(json.load(open(state)))
    out = [[list(b["__key__"]) for b in l] for _ in range(2)]
print(json.dumps(out))
'''


@pytest.mark.parametrize("method", ["thread", "process"])
def test_the_nodes_recipe_resumes_exactly_in_a_new_process_with_parallel_decoding(tmp_path, jpeg_index, method):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    state = str(tmp_path / "state.json")

    def run(what: str) -> list:
        done = subprocess.run([sys.executable, str(job), jpeg_index, method, what, state], capture_output=True,
                              text=True, timeout=240, check=False,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    whole, head, tail = run("whole"), run("head"), run("tail")
    assert len(whole[0]) == 16 and whole[0] != whole[1]  # 126 samples: 15 batches of 8 and one of 6
    assert head + tail[0] == whole[0] and tail[1] == whole[1]


def test_ranks_get_equal_batch_counts_under_nodes(jpeg_index):
    counts = []
    for rank in range(3):
        source = wd.ExactEpochs(jpeg_index, batch_size=8, seed=0, rank=rank, world_size=3)
        loader = tn.Loader(tn.Batcher(tn.IterableWrapper(source), batch_size=8, drop_last=False))
        counts.append((len(list(loader)), source.batches_per_epoch))
    assert counts == [(6, 6)] * 3  # 126 samples: 42 a rank, 6 batches each


def test_nodes_compose_with_the_weighted_sampler_and_resume_it(jpeg_index, tmp_path, sized_shards):
    other = write_index(sized_shards([20, 13], prefix="t"), tmp_path / "t.json")

    def loader():
        sources = {"j": tn.IterableWrapper(wd.ExactEpochs(jpeg_index, batch_size=4, seed=1)),
                   "t": tn.IterableWrapper(wd.ExactEpochs(other, batch_size=4, seed=1))}
        mixed = tn.MultiNodeWeightedSampler(sources, weights={"j": 0.75, "t": 0.25}, seed=3,
                                            stop_criteria="FIRST_DATASET_EXHAUSTED")
        return tn.Loader(tn.Batcher(mixed, batch_size=4))

    whole = [[s["__key__"] for s in batch] for batch in loader()]
    assert {k[0] for batch in whole for k in batch} == {"j", "t"}
    head_loader = loader()
    it = iter(head_loader)
    head = [[s["__key__"] for s in next(it)] for _ in range(7)]
    torch.save(head_loader.state_dict(), tmp_path / "state.pt")  # its sampler's state holds a tensor
    resumed = loader()
    resumed.load_state_dict(torch.load(tmp_path / "state.pt"))
    assert head + [[s["__key__"] for s in batch] for batch in resumed] == whole


@pytest.mark.skipif(not torch.cuda.is_available(), reason="PinMemory pins for a GPU: none on this machine")
def test_pin_memory_after_our_batches(jpeg_index):
    pipe = wd.ExactEpochs(jpeg_index, batch_size=8).decode_batches("torchrgb8", batch_size=8).to_tuple("jpg", "cls")
    batches = list(tn.Loader(tn.PinMemory(tn.IterableWrapper(pipe))))
    assert batches and all(images.is_pinned() for images, _ in batches)


def test_a_shard_lister_pipeline_resumes_under_nodes_by_replaying_its_seeded_epoch(jpeg_index, tmp_path):
    shards = sorted(str(p) for p in tmp_path.glob("j-*.tar"))

    def loader(seed=5):
        pipe = wd.ShardLister(shards, shuffle=True, seed=seed).load_tar().group_by_key().shuffle_samples(20, seed=seed)
        return tn.Loader(tn.IterableWrapper(pipe))

    whole = [[s["__key__"] for s in loader_] for loader_ in [loader()] for _ in range(2)]
    head_loader = loader()
    it = iter(head_loader)
    head = [next(it)["__key__"] for _ in range(40)]
    state = json.loads(json.dumps(head_loader.state_dict()))
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + [s["__key__"] for s in resumed] == whole[0]
    assert [s["__key__"] for s in resumed] == whole[1]
    unseeded = tn.Loader(tn.IterableWrapper(wd.ShardLister(shards, shuffle=True).load_tar().group_by_key()))
    next(iter(unseeded))
    again = tn.Loader(tn.IterableWrapper(wd.ShardLister(shards, shuffle=True).load_tar().group_by_key()))
    again.load_state_dict(json.loads(json.dumps(unseeded.state_dict())))
    with pytest.raises(ValueError, match=r"shard lister \(shuffle=True\)'\] shuffled without a seed.*give them seed="):
        list(again)
