"""ExactEpochs: equal, exact epochs over uneven shards, and resuming them exactly, under every loader."""

from __future__ import annotations

import functools
import http.server
import json
import os
import pickle
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import ClassVar

import pytest
from builders import write_index
from stack import needs_dataloader2
from torch.utils.data import DataLoader
from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES

import wds_datapipes as wd
from wds_datapipes import EpochState, ExactEpochs

UNEVEN = [100, 30, 71, 5, 90, 47, 50]  # 393 samples in 7 shards
JOB = str(Path(__file__).parent.parent / "epoch_job.py")  # the helpers sit in tests/


@pytest.fixture
def uneven_index(tmp_path, sized_shards) -> str:
    return write_index(sized_shards(UNEVEN), tmp_path / "index.json")


@pytest.fixture(params=["offsets", "no-offsets", "places"])
def any_index(request, tmp_path, sized_shards) -> str:
    return write_index(sized_shards(UNEVEN), tmp_path / "index.json", offsets=request.param != "no-offsets",
                       places=request.param == "places")


def _reader(index: str, rank: int, world: int, worker: int, workers: int, **options) -> ExactEpochs:
    """The copy of ExactEpochs that worker ``worker`` of rank ``rank`` holds under a loader."""
    source = ExactEpochs(index, rank=rank, world_size=world, **options)
    source.apply_sharding(workers, worker, SHARDING_PRIORITIES.MULTIPROCESSING)
    return source


def _keys(samples) -> list[str]:
    return [s["__key__"] for s in samples]


def _all_keys() -> list[str]:
    return [f"u{shard}-{i:04d}" for shard, n in enumerate(UNEVEN) for i in range(n)]


# ---------------------------------------------------------------- equal and exact


@pytest.mark.parametrize("world,workers", [(2, 2), (1, 3), (3, 1)])
def test_drop_mode_gives_every_sample_at_most_once_and_equal_batches_to_ranks(any_index, world, workers):
    seen, batches = [], Counter()
    for rank in range(world):
        for worker in range(workers):
            samples = list(_reader(any_index, rank, world, worker, workers, batch_size=8, lanes=4, block=16))
            assert not any(s["__pad__"] for s in samples)
            seen += _keys(samples)
            batches[rank] += -(-len(samples) // 8)
    assert len(seen) == len(set(seen)) == 393 - 393 % world
    assert set(seen) <= set(_all_keys())
    assert len(set(batches.values())) == 1


def test_pad_mode_gives_every_sample_at_least_once_with_the_repeats_flagged(uneven_index):
    samples = [s for rank in range(2) for worker in range(2)
               for s in _reader(uneven_index, rank, 2, worker, 2, batch_size=8, mode="pad")]
    assert sorted({s["__key__"] for s in samples if not s["__pad__"]}) == _all_keys()
    pads = [s["__key__"] for s in samples if s["__pad__"]]
    assert len(pads) == 1 and len(samples) == 394


def test_samples_equal_those_group_by_key_gives(uneven_index, tmp_path):
    expected = {s["__key__"]: s for s in wd.ShardLister(sorted(map(str, tmp_path.glob("u-*.tar"))))
                .load_tar().group_by_key()}
    for sample in ExactEpochs(uneven_index, batch_size=4):
        assert sample.pop("__pad__") is False
        assert sample == expected[sample["__key__"]]


def test_each_epoch_has_a_new_order_that_repeats_with_the_seed(uneven_index):
    first, second = (ExactEpochs(uneven_index, batch_size=8, seed=3) for _ in range(2))
    epochs = [_keys(first) for _ in range(3)]
    assert epochs == [_keys(second) for _ in range(3)]
    assert len({tuple(e) for e in epochs}) == 3 and all(sorted(e) == _all_keys() for e in epochs)
    assert _keys(ExactEpochs(uneven_index, batch_size=8, seed=4)) != epochs[0]


def test_without_shuffle_the_dataset_is_read_in_order(uneven_index):
    assert _keys(ExactEpochs(uneven_index, batch_size=8, shuffle=False)) == _all_keys()


def test_fixed_length_epochs_cover_the_data_evenly_over_time(uneven_index):
    source = ExactEpochs(uneven_index, batch_size=10, samples_per_epoch=100)
    epochs = [_keys(source) for _ in range(8)]
    assert all(len(e) == 100 for e in epochs)
    counts = Counter(k for e in epochs for k in e)
    assert set(counts.values()) <= {2, 3} and len(counts) == 393  # 800 = 2 passes + 14


def test_set_epoch_chooses_the_epoch(uneven_index):
    source = ExactEpochs(uneven_index, batch_size=8)
    epochs = [_keys(source) for _ in range(3)]
    assert _keys(source.set_epoch(1)) == epochs[1]
    assert source.batch_samples(8).set_epoch(2) is None and _keys(source) == epochs[2]


def test_batches_per_epoch_is_what_a_rank_yields(uneven_index):
    source = ExactEpochs(uneven_index, batch_size=8, rank=1, world_size=2)
    assert source.batches_per_epoch == 25 and len(source) == 196
    assert sum(1 for _ in DataLoader(source.batch_samples(8), batch_size=None, num_workers=2)) == 25


def test_the_pipe_pickles_small_with_a_memory_mapped_index(uneven_index):
    dp = ExactEpochs(uneven_index, batch_size=8).batch_samples(8)
    assert len(pickle.dumps(dp)) < 4000
    clone = pickle.loads(pickle.dumps(dp))
    assert [k for batch in clone for k in batch["__key__"]] == _keys(ExactEpochs(uneven_index, batch_size=8))


def test_a_batch_size_other_than_the_plans_is_refused(uneven_index):
    dp = ExactEpochs(uneven_index, batch_size=8).batch_samples(16)
    with pytest.raises(ValueError, match="batches by 16, but ExactEpochs was built with batch_size=8"):
        dp.state_dict()


def test_non_persistent_dataloader_workers_without_set_epoch_raise_a_clear_error(uneven_index):
    loader = DataLoader(ExactEpochs(uneven_index, batch_size=8).batch_samples(8), batch_size=None, num_workers=2)
    assert len(list(loader)) == 50
    with pytest.raises(RuntimeError, match="set_epoch"):
        list(loader)


# ---------------------------------------------------------------- the same epochs under every loader


def _epochs_under(loader, dp, epochs: int = 2) -> list[list[str]]:
    out = []
    for epoch in range(epochs):
        dp.set_epoch(epoch)
        out.append([k for batch in loader for k in batch["__key__"]])
    return out


def test_dataloader_stateful_dataloader_and_direct_iteration_agree(uneven_index):
    from torchdata.stateful_dataloader import StatefulDataLoader

    def dp():
        return ExactEpochs(uneven_index, batch_size=8).batch_samples(8)

    one = dp()
    direct = _epochs_under(one, one)
    two = dp()
    workers2 = _epochs_under(DataLoader(two, batch_size=None, num_workers=2), two)
    three = dp()
    stateful = _epochs_under(StatefulDataLoader(three, batch_size=None, num_workers=2, persistent_workers=True),
                             three)
    assert stateful == workers2
    assert all(sorted(e) == _all_keys() for e in direct + workers2)
    assert direct[0] != direct[1]


@needs_dataloader2
def test_dataloader2_reads_the_same_epochs_as_dataloader(uneven_index):
    from stack import DataLoader2

    dp = ExactEpochs(uneven_index, batch_size=8).batch_samples(8)
    loader = DataLoader2(dp, reading_service=wd.MultiProcessingReadingService(num_workers=2))
    try:
        dl2 = [[k for batch in loader for k in batch["__key__"]] for _ in range(2)]
    finally:
        loader.shutdown()
    dp2 = ExactEpochs(uneven_index, batch_size=8).batch_samples(8)
    assert dl2 == _epochs_under(DataLoader(dp2, batch_size=None, num_workers=2), dp2)


# ---------------------------------------------------------------- resuming in a new process


def _job(tmp_path: Path, name: str, index: str, loader: str, *options: str) -> dict:
    out = tmp_path / f"{name}.json"
    command = [sys.executable, JOB, "--index", index, "--loader", loader, "--out", str(out), *options]
    subprocess.run(command, check=True, timeout=180, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    return json.loads(out.read_text())


def _flat(run: dict) -> list:
    return [batch for epoch in run["epochs"] for batch in epoch]


RESUMES = [
    pytest.param("direct", "0", id="direct"),
    pytest.param("dataloader", "2", id="DataLoader-2-workers"),
    pytest.param("stateful", "0", id="StatefulDataLoader-0-workers"),
    pytest.param("stateful", "2", id="StatefulDataLoader-2-workers"),
    pytest.param("dataloader2", "2", id="DataLoader2-2-workers", marks=needs_dataloader2),
]


@pytest.mark.parametrize(("loader", "workers"), RESUMES)
def test_a_run_resumed_in_a_new_process_continues_batch_for_batch(tmp_path, uneven_index, loader, workers):
    """Oracle: a run of the same loader that no checkpoint touched. One run checkpoints after
    each stop (mid-epoch, in an epoch's last batch, at the boundary, in the next epoch) and
    goes on: it reads the same batches as the untouched run; each checkpoint, resumed in a
    new process, reads exactly the batches after its stop."""
    common = ["--workers", workers, "--epochs", "3", "--batch", "8"]
    whole = _flat(_job(tmp_path, "whole", uneven_index, loader, *common))
    per_epoch = len(whole) // 3
    assert per_epoch == 50
    stops = (5, per_epoch - 1, per_epoch, per_epoch + 17)
    state = tmp_path / "state-{stop}.json"
    saving = _flat(_job(tmp_path, "saving", uneven_index, loader, *common, "--save-at", ",".join(map(str, stops)),
                        "--state-out", str(state)))
    assert saving == whole  # taking a checkpoint changes nothing that follows
    for stop in stops:
        tail = _flat(_job(tmp_path, f"tail-{stop}", uneven_index, loader, *common,
                          "--state-in", str(state).replace("{stop}", str(stop))))
        assert tail == whole[stop:], f"resumed after batch {stop}"


@pytest.mark.parametrize(("loader", "workers"), [RESUMES[1], RESUMES[3]])
def test_an_unshuffled_run_resumes_exactly_too(tmp_path, uneven_index, loader, workers):
    common = ["--workers", workers, "--epochs", "2", "--shuffle", "0"]
    whole = _flat(_job(tmp_path, "whole", uneven_index, loader, *common))
    state = tmp_path / "state.json"
    _job(tmp_path, "head", uneven_index, loader, *common, "--stop-after", "13", "--state-out", str(state))
    assert _flat(_job(tmp_path, "tail", uneven_index, loader, *common, "--state-in", str(state))) == whole[13:]


def test_two_workers_resumed_on_one_read_exactly_the_samples_not_yet_seen(tmp_path, any_index):
    state = tmp_path / "state.json"
    head = _flat(_job(tmp_path, "head", any_index, "dataloader", "--workers", "2", "--epochs", "3",
                      "--stop-after", "21", "--state-out", str(state)))
    tail = _job(tmp_path, "tail", any_index, "direct", "--epochs", "3", "--state-in", str(state))
    seen = [k for batch in head for k in batch[0]]
    rest = [k for batch in tail["epochs"][0] for k in batch[0]]
    assert sorted(seen + rest) == _all_keys()
    # later epochs are plain epochs of the new topology
    plain = _job(tmp_path, "plain", any_index, "direct", "--epochs", "3")
    assert tail["epochs"][1:] == plain["epochs"][1:]


def test_a_state_from_a_stateful_dataloader_resumes_on_other_workers(tmp_path, uneven_index):
    from torchdata.stateful_dataloader import StatefulDataLoader

    dp = ExactEpochs(uneven_index, batch_size=8).batch_samples(8)
    loader = StatefulDataLoader(dp, batch_size=None, num_workers=2)
    iterator = iter(loader)
    seen = [k for _ in range(9) for k in next(iterator)["__key__"]]
    state = EpochState.from_loader_state(loader.state_dict())
    assert state.taken == (40, 32) and state.workers == 2
    resumed = ExactEpochs(uneven_index, batch_size=8).batch_samples(8)
    resumed.load_state_dict(state.to_dict())
    rest = [k for batch in DataLoader(resumed, batch_size=None, num_workers=3, persistent_workers=True)
            for k in batch["__key__"]]
    assert sorted(seen + rest) == _all_keys()


def test_a_state_saved_with_other_settings_is_refused(uneven_index):
    state = ExactEpochs(uneven_index, batch_size=8, seed=1).state_dict()
    with pytest.raises(ValueError, match="other plan settings"):
        ExactEpochs(uneven_index, batch_size=8, seed=2).load_state_dict(state)


def test_the_state_is_small(uneven_index):
    source = ExactEpochs(uneven_index, batch_size=8)
    dp = source.decode().batch_samples(8)
    iterator = iter(dp)
    for _ in range(7):
        next(iterator)
    state = dp.state_dict()
    assert state["taken"] == [56] and state["epoch"] == 0
    assert len(json.dumps(state)) < 400


def _broken_cls(sample: dict) -> dict:
    return {**sample, "cls": b"not a number"} if sample["__key__"].endswith("7") else sample


def test_a_handler_cannot_skip_a_sample_of_an_exact_epoch_one_by_one(uneven_index):
    dp = ExactEpochs(uneven_index, batch_size=8, shuffle=False).map(_broken_cls)
    with pytest.raises(wd.DecodeError, match="exact epoch cannot be skipped.*decode_batches"):
        list(dp.decode(handler=wd.ignore_and_continue))
    with pytest.raises(wd.SampleError, match="exact epoch cannot be skipped"):
        list(ExactEpochs(uneven_index, batch_size=8).to_tuple("cls", "nothing", handler=wd.ignore_and_continue))


def test_decode_batches_skips_keep_every_batch_of_an_exact_epoch_in_its_place(uneven_index):
    dp = ExactEpochs(uneven_index, batch_size=8, shuffle=False).map(_broken_cls)
    batches = list(dp.decode_batches(batch_size=8, handler=wd.ignore_and_continue))
    assert len(batches) == 50
    assert sum(len(b["__key__"]) for b in batches) == 393 - sum(k.endswith("7") for k in _all_keys())


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files with HTTP Range support (206), and counts the ranged requests."""

    ranged: ClassVar[list] = []

    def send_head(self):
        header = self.headers.get("Range")
        if not header:
            return super().send_head()
        path = self.translate_path(self.path)
        start = int(header.removeprefix("bytes=").split("-")[0])
        data = open(path, "rb")  # noqa: SIM115 - closed by copyfile's caller
        size = os.fstat(data.fileno()).st_size
        data.seek(start)
        type(self).ranged.append((os.path.basename(path), start))
        self.send_response(206)
        self.send_header("Content-Type", "application/x-tar")
        self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        self.send_header("Content-Length", str(size - start))
        self.end_headers()
        return data

    def log_message(self, *args):
        pass


def test_exact_epochs_over_http_enter_shards_with_range_requests(tmp_path, sized_shards, monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    shards = sized_shards(UNEVEN, folder=tmp_path / "www")
    handler = type("Handler", (_RangeHandler,), {"ranged": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(tmp_path / "www")))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        urls = [f"{base}/{os.path.basename(s)}" for s in shards]
        index = write_index(urls, tmp_path / "http-index.json")
        assert json.loads(Path(index).read_text())["shardlist"][0]["url"] == urls[0]
        over_http = [k for r in range(2) for w in range(2)
                     for k in _keys(_reader(index, r, 2, w, 2, batch_size=8, lanes=4, block=16))]
        local = write_index(shards, tmp_path / "local-index.json")
        on_disk = [k for r in range(2) for w in range(2)
                   for k in _keys(_reader(local, r, 2, w, 2, batch_size=8, lanes=4, block=16))]
        assert over_http == on_disk
        assert handler.ranged and all(start % 512 == 0 and start > 0 for _, start in handler.ranged)
    finally:
        server.shutdown()
        server.server_close()


def test_the_error_line_torch_adds_shows_the_pipe_s_own_arguments(uneven_index, tmp_path):
    shard = wd.ShardIndex.load(uneven_index).url(1)
    with open(shard, "ab") as f:
        f.write(bytes(512))
    with pytest.raises(wd.IndexMismatchError) as caught:
        list(wd.ExactEpochs(uneven_index, batch_size=4, seed=3, shuffle=False).batch_samples(4))
    line = str(caught.value).splitlines()[-1]
    assert line.startswith("This exception is thrown by __iter__ of ExactEpochs(")
    assert "functools.partial" not in line and "seed=3" in line and "batch_size=4" in line and "ShardIndex(" in line


@pytest.mark.parametrize("places", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_samples_carry_the_shard_url_as_a_plain_str(tmp_path, sized_shards, places, shuffle):
    shards = sized_shards([5, 7])
    index = write_index(shards, tmp_path / "index.json", places=places)
    streamed = list(wd.ShardLister(shards).load_tar().group_by_key())
    exact = list(ExactEpochs(index, batch_size=2, shuffle=shuffle))
    for sample in streamed + exact:
        assert type(sample["__url__"]) is str
        assert pickle.loads(pickle.dumps(sample["__url__"])) == sample["__url__"]
        assert b"ShardUrl" not in pickle.dumps(sample)
    assert {s["__url__"] for s in exact} == {s["__url__"] for s in streamed} == set(shards)
