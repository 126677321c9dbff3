"""The counts are right: bytes are the shards' sizes, samples and batches are what the loop got,
mixtures' draws are the samples' own ``__source__``; under forked and spawned workers, workers
started again each epoch, and every loader."""

from __future__ import annotations

import collections
import os

import pytest
import torch
from builders import write_index
from stack import needs_dataloader2
from stats_data import fork_loader, loader_named, write_shards

import wds_datapipes as wd


def _keys(batches) -> list[str]:
    return [key for batch in batches for key in batch["__key__"]]


@pytest.mark.parametrize(("start", "workers"), [("fork", 2), ("spawn", 1)])  # spawn: one (each imports torch)
def test_bytes_samples_and_batches_equal_what_was_read_and_yielded(tmp_path, stats_on, start, workers):
    """Oracles: the shard files' sizes (os.stat), the samples and batches the loop received,
    the number of shards; the settings reach spawned workers pickled with the pipes."""
    paths = write_shards(tmp_path, 4, 30, size=500)
    dp = wd.ShardLister(paths).load_tar().group_by_key().map_fields({"cls": int}).batch_samples(7)
    loader = torch.utils.data.DataLoader(dp, batch_size=None, num_workers=workers, multiprocessing_context=start)
    batches = list(wd.stats.watch(loader))
    s = wd.stats.snapshot()
    assert s.stages["read"].bytes == sum(os.path.getsize(p) for p in paths)
    assert s.stages["tar"].items == s.stages["transform"].items == len(_keys(batches)) == 120
    assert s.stages["batch"].items == len(batches) and s.stages["open"].items == s.stages["list"].items == 4
    assert sum(src.samples for src in s.sources.values()) == 120 and s.schemes["file"].objects == 4
    assert s.wait.steps + s.wait.starts == len(batches)
    assert sorted((w.rank, w.worker, w.processes) for w in s.workers if w.worker >= 0) == \
        [(0, worker, 1) for worker in range(workers)]
    assert all(s.stages[name].seconds > 0 for name in ("open", "read", "tar", "transform", "batch"))


def test_workers_started_again_each_epoch_add_up(tmp_path, stats_on):
    """Without persistent workers each epoch has new processes: their counts add up per worker
    (oracle: two epochs read the shards twice)."""
    paths = write_shards(tmp_path, 2, 10)
    loader = fork_loader(wd.ShardLister(paths).load_tar().group_by_key().batch_samples(4))
    for _ in range(2):
        assert len(_keys(wd.stats.watch(loader))) == 20
    s = wd.stats.snapshot()
    assert s.stages["tar"].items == 40 and s.stages["read"].bytes == 2 * sum(os.path.getsize(p) for p in paths)
    assert sorted((w.worker, w.processes) for w in s.workers if w.worker >= 0) == [(0, 2), (1, 2)]
    assert s.wait.starts == 2


@pytest.mark.parametrize("shuffle", [False, True])
def test_exact_epochs_by_places_count_every_sample(tmp_path, stats_on, shuffle):
    """Reads by member places, in order (a read a megabyte) and shuffled (a read a sample):
    samples counted equal samples yielded, shards opened equal the shards (oracles: the loop's
    own count, the index)."""
    paths = write_shards(tmp_path, 3, 40, size=2000)
    index = write_index(paths, tmp_path / "index.json", places=True)
    got = list(wd.ExactEpochs(index, batch_size=1, shuffle=shuffle, rank=0, world_size=1))
    s = wd.stats.snapshot()
    assert s.stages["read"].items == len(got) == 120 and s.stages["open"].items == 3
    assert s.sources[str(tmp_path)].samples == 120
    if not shuffle:  # whole reads: exact; a read a sample: the sampled samples' bytes scaled (an estimate)
        assert 120 * 2000 < s.stages["read"].bytes <= sum(os.path.getsize(p) for p in paths)
    else:
        assert s.stages["read"].bytes > 0 and s.stages["read"].timed > 0


def test_mixtures_count_the_draws_of_each_source(tmp_path, stats_on):
    """RandomMix and MixedEpochs: the draws per source are the yielded samples' ``__source__``
    (oracle: counting them), the targets the weights normalised, the realized shares add to 1."""
    a = write_shards(tmp_path / "a", 2, 30, prefix="a")
    b = write_shards(tmp_path / "b", 2, 30, prefix="b")
    mix = wd.RandomMix({"a": wd.ShardLister(a).load_tar().group_by_key(),
                        "b": wd.ShardLister(b).load_tar().group_by_key()}, weights={"a": 3, "b": 1}, seed=0)
    drawn = collections.Counter(sample["__source__"] for sample in mix)
    indexes = {name: write_index(paths, tmp_path / f"{name}.json", places=True) for name, paths in (("a", a), ("b", b))}
    mixed = wd.MixedEpochs(indexes, batch_size=4, weights={"a": 1, "b": 1}, samples_per_epoch=40, rank=0,
                           world_size=1)
    planned = collections.Counter(sample["__source__"] for sample in mixed)
    s = wd.stats.snapshot()
    found = {(m.mixer, m.source): (m.samples, round(m.target, 6)) for m in s.mixtures}
    assert found[("RandomMix", "a")] == (drawn["a"], 0.75) and found[("RandomMix", "b")] == (drawn["b"], 0.25)
    assert found[("MixedEpochs", "a")] == (planned["a"], 0.5) and found[("MixedEpochs", "b")] == (planned["b"], 0.5)
    assert sum(m.realized for m in s.mixtures if m.mixer == "MixedEpochs") == pytest.approx(1.0)
    assert s.sources["a"].objects >= 1 and s.sources["b"].objects >= 1  # each source's reads under its name


@pytest.mark.parametrize("persistent", [False, True], ids=["workers each epoch, set_epoch", "persistent workers"])
def test_mixtures_count_each_epoch_apart_under_loader_workers(tmp_path, stats_on, persistent):
    """Three epochs of a RandomMix under 2 forked DataLoader workers: new workers each epoch told
    the epoch by ``set_epoch`` (as a loader's sampler is), or persistent workers whose mixture
    counts its own epochs. Oracle: each epoch's samples' ``__source__``, counted by the test."""
    a = write_shards(tmp_path / "a", 2, 20, prefix="a")
    b = write_shards(tmp_path / "b", 2, 20, prefix="b")
    mix = wd.RandomMix({"a": wd.ShardLister(a).load_tar().group_by_key(),
                        "b": wd.ShardLister(b).load_tar().group_by_key()}, weights={"a": 2, "b": 1}, seed=0)
    loader = fork_loader(mix, persistent_workers=persistent)
    drawn = {}
    for epoch in range(3):
        if not persistent:
            mix.set_epoch(epoch)
        drawn[epoch] = collections.Counter(s["__source__"] for s in wd.stats.watch(loader))
    s = wd.stats.snapshot()
    found = {(m.epoch, m.source): m.samples for m in s.mixtures if m.mixer == "RandomMix"}
    assert found == {(epoch, name): drawn[epoch][name] for epoch in range(3) for name in "ab"}
    assert len({tuple(sorted(d.items())) for d in drawn.values()}) > 1  # the draws differ between epochs


@pytest.mark.parametrize("loader", ["plain", "DataLoader", "StatefulDataLoader"])
def test_watch_and_the_workers_counts_under_each_loader(tmp_path, stats_on, loader):
    """The same pipeline under each loader: every batch watched, every sample counted
    (oracle: the batches the loop received)."""
    paths = write_shards(tmp_path, 4, 12)
    dp = wd.ShardLister(paths).load_tar().group_by_key().batch_samples(5)
    batches = list(wd.stats.watch(loader_named(loader, dp)))
    s = wd.stats.snapshot()
    assert s.wait.steps + s.wait.starts == len(batches) and s.stages["tar"].items == len(_keys(batches)) == 48
    assert s.stages["batch"].items == len(batches)


@needs_dataloader2
def test_watch_and_the_workers_counts_under_dataloader2(tmp_path, stats_on):
    """DataLoader2 tells its workers no id of torch's: the lister's topology names them."""
    paths = write_shards(tmp_path, 4, 12)
    dp = wd.ShardLister(paths).load_tar().group_by_key().batch_samples(5)
    loader = loader_named("DataLoader2", dp)
    try:
        batches = list(wd.stats.watch(loader))
    finally:
        loader.shutdown()
    s = wd.stats.snapshot()
    assert s.stages["tar"].items == len(_keys(batches)) == 48
    assert sorted(w.worker for w in s.workers if w.worker >= 0) == [0, 1]


def test_watch_under_torchdata_nodes(tmp_path, stats_on):
    """A torchdata.nodes Loader runs the pipe in a thread of the training process: counted there."""
    paths = write_shards(tmp_path, 4, 12)
    dp = wd.ShardLister(paths).load_tar().group_by_key().batch_samples(5)
    loader = loader_named("torchdata.nodes", dp)
    batches = list(wd.stats.watch(loader))
    s = wd.stats.snapshot()
    assert s.stages["tar"].items == len(_keys(batches)) == 48 and s.wait.steps + s.wait.starts == len(batches)


def test_a_sources_secrets_are_never_recorded(stats_on):
    """A source named by a URL with a password or a presigned signature is recorded (and so
    published, reported and observed) with them redacted, as our errors show URLs (oracle:
    ``wds_datapipes.errors.redact``'s rule: the secret's text appears nowhere)."""
    from wds_datapipes.stats.probe import probe

    thread = probe(stats_on)
    thread.target("open", "https", "https://user:hunter2@example.com/a.tar?X-Amz-Signature=f00dfeed")
    text = repr(wd.stats.snapshot().sources)
    assert "hunter2" not in text and "f00dfeed" not in text and "example.com/a.tar" in text
