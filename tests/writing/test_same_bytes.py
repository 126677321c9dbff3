"""The whole output, index and progress record included, is the same bytes for two identical
runs, one worker or two, and a killed-and-resumed run (two ranks: the same shards and index,
each rank with its own record); a shard changed after it was indexed is still told apart (its
stamp no longer matches)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.writing.conftest import make_samples
from wds_datapipes.epochs.exact_epochs import ExactEpochs
from wds_datapipes.epochs.index import ShardIndex
from wds_datapipes.epochs.places import stat_stamp
from wds_datapipes.writing import shard_file, write_shards

N, MAXCOUNT = 60, 7


def _files(folder: Path) -> dict[str, bytes]:
    """Every file of the folder and its bytes: shards, index, side files, the progress record."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _run(folder: Path, **settings) -> None:
    write_shards(make_samples(N, seed=3), str(folder / "s-%03d.tar"), maxcount=MAXCOUNT, fsync=False, **settings)


def _killed_at_rename(folder: Path, nth: int, workers: int) -> None:
    """The run in a forked process, SIGKILLed right after its nth shard rename (renamed, not recorded)."""
    pid = os.fork()
    if pid == 0:
        try:
            replace = os.replace
            count = [0]

            def replacing(src, dst, *args, **kwargs):
                replace(src, dst, *args, **kwargs)
                count[0] += 1
                if count[0] == nth:
                    os.killpg(os.getpgid(0), signal.SIGKILL)

            os.setpgid(0, 0)
            shard_file.os.replace = replacing
            _run(folder, workers=workers)
        finally:
            os._exit(0)
    deadline = time.monotonic() + 60
    while not os.waitpid(pid, os.WNOHANG)[0]:
        assert time.monotonic() < deadline, "the killed run did not end"
        time.sleep(0.01)


@pytest.mark.timeout(120)
def test_identical_runs_one_or_two_workers_and_a_killed_run_write_the_same_bytes(tmp_path):
    """oracle: the first uninterrupted run's files, byte for byte (each later run in the same
    folder path, the earlier one moved aside, so that paths in the record are the same)."""
    out = tmp_path / "out"
    _run(out)
    first = _files(out)
    assert {"index.json", "index.offsets", "index.places.json", "index.places", "index.keys",
            "index.json.rank0-of-1.progress"} <= set(first)
    runs = {"again": {}, "two workers": {"workers": 2}}
    for name, settings in runs.items():
        out.rename(tmp_path / f"before {name}")
        _run(out, **settings)
        assert _files(out) == first, name
    out.rename(tmp_path / "before kills")
    _killed_at_rename(out, 3, workers=1)
    _killed_at_rename(out, 5, workers=2)
    assert len(list(out.glob("*.tar"))) >= 5 and not (out / "index.json").exists()
    _run(out, workers=2)
    assert _files(out) == first
    out.rename(tmp_path / "before ranks")
    _run(out, rank=1, world=2)
    _run(out, rank=0, world=2, join=True)
    records = {name for name in _files(out) if name.endswith(".progress")}
    assert records == {"index.json.rank0-of-2.progress", "index.json.rank1-of-2.progress"}
    assert {k: v for k, v in _files(out).items() if k not in records} == {
        k: v for k, v in first.items() if not k.endswith(".progress")}


def test_each_shard_s_time_is_the_members_mtime_and_a_fraction_from_its_names_and_sizes(tmp_path):
    """oracle: the ``mtime`` setting (seconds) and os.stat; shards of other names or sizes get other stamps."""
    _run(tmp_path, mtime=1_700_000_000)
    stamps = [os.stat(p).st_mtime_ns for p in sorted(tmp_path.glob("*.tar"))]
    assert all(1_700_000_000 * 10**9 <= t < 1_700_000_001 * 10**9 for t in stamps)
    assert len(set(stamps)) == len(stamps)


def test_a_shard_touched_or_rewritten_after_indexing_is_told_apart(tmp_path):
    """oracles: os.stat against the index's stamp; the resume writes the touched shard again;
    ExactEpochs still reads every sample (through the headers where the stamp differs)."""
    _run(tmp_path)
    index = ShardIndex.load(str(tmp_path / "index.json"))
    shards = sorted(tmp_path.glob("*.tar"))
    assert all(index.places.stamp(i) == stat_stamp(os.stat(p)) for i, p in enumerate(shards))
    shards[1].write_bytes(shards[1].read_bytes())  # the same bytes, written again: a new mtime
    assert index.places.stamp(1) != stat_stamp(os.stat(shards[1]))
    keys = [s["__key__"] for s in ExactEpochs(str(tmp_path / "index.json"), batch_size=1, shuffle=False)]
    assert keys == [f"s{i:05d}" for i in range(N)]
    before = shards[1].read_bytes()
    report = write_shards(make_samples(N, seed=3), str(tmp_path / "s-%03d.tar"), maxcount=MAXCOUNT, fsync=False)
    assert report.resumed == len(shards) - 1 and shards[1].read_bytes() == before
    assert ShardIndex.load(str(tmp_path / "index.json")).places.stamp(1) == stat_stamp(os.stat(shards[1]))
