"""Stats off (the default): nothing is collected, no file or folder is made, no thread started;
importing the package changes nothing; turning stats off removes the run."""

from __future__ import annotations

import glob
import os
import pickle
import subprocess
import sys
import tempfile
import textwrap
import threading

import torch
from stats_data import fork_loader, write_shards

import wds_datapipes as wd
from wds_datapipes.stats import recorder


def _run_folders() -> set[str]:
    """This process's run folders (named by the pid that made them: other test workers make theirs)."""
    return {path for parent in ("/dev/shm", tempfile.gettempdir())
            for path in glob.glob(f"{parent}/wds-stats-{os.getpid()}-*")}


def test_with_stats_off_nothing_is_counted_made_or_started(tmp_path):
    """Oracles: the file system's listing of the places a run folder goes, the threads (none of
    the publisher's), and the recorder registry; the samples are every shard's, twice."""
    assert not wd.stats.enabled()
    paths = write_shards(tmp_path, 3, 20)
    folders = _run_folders()

    def pipeline():
        return wd.ShardLister(paths).load_tar().group_by_key().decode().map_fields({"cls": int}).batch_samples(8)

    dp = pipeline()
    assert all(getattr(p, "_stats", None) is None for p in (dp, dp.source_datapipe, dp.source_datapipe.source_datapipe))
    got = [b["__key__"] for b in fork_loader(dp)] + [b["__key__"] for b in wd.stats.watch(pipeline())]
    assert sorted(k for batch in got for k in batch) == sorted(2 * [f"s{s:03d}-{i:04d}" for s in range(3)
                                                                    for i in range(20)])
    assert _run_folders() == folders
    assert not [t for t in threading.enumerate() if t.name == "wds-stats"]  # a loader's own threads may linger
    assert recorder.current_recorder() is None
    snapshot = wd.stats.snapshot()
    assert not snapshot.enabled and snapshot.processes == 0 and snapshot.stages == {}
    assert wd.stats.report(snapshot).startswith("stats are off")


def test_disable_removes_the_run_and_later_pipes_measure_nothing(tmp_path):
    """Oracle: the run folder on disk, and the counts of a pipe built after ``disable``."""
    settings = wd.stats.enable()
    assert os.path.isdir(settings.directory) and oct(os.stat(settings.directory).st_mode & 0o777) == "0o700"
    paths = write_shards(tmp_path, 1, 5)
    assert sum(1 for _ in wd.ShardLister(paths).load_tar().group_by_key()) == 5
    assert wd.stats.snapshot().stages["tar"].items == 5
    wd.stats.disable()
    assert not os.path.exists(settings.directory)
    dp = wd.ShardLister(paths).load_tar().group_by_key()
    assert sum(1 for _ in dp) == 5 and dp._stats is None and recorder.current_recorder() is None


def test_a_pipe_pickled_before_stats_existed_loads_and_measures_nothing(tmp_path, stats_on):
    """A pickle without the ``_stats`` attribute (as every pipe pickled by an earlier version)
    loads, reads its samples, and counts nothing."""
    paths = write_shards(tmp_path, 1, 4)
    dp = wd.ShardLister(paths).load_tar().group_by_key()
    for pipe in (dp, dp.source_datapipe):
        del pipe.__dict__["_stats"]
    again = pickle.loads(pickle.dumps(dp))
    assert sum(1 for _ in again) == 4
    assert wd.stats.snapshot().stages["tar"].items == 0


IMPORT_ONLY = textwrap.dedent("""
    import glob, os, sys, tempfile, threading
    mine = f"/wds-stats-{os.getpid()}-*"  # other test workers make their own run folders
    before = {p for d in ("/dev/shm", tempfile.gettempdir()) for p in glob.glob(d + mine)}
    import torch
    if sys.argv[1] == "import":
        import wds_datapipes
        import wds_datapipes.stats
    from torch.utils.data import DataLoader
    from torch.utils.data.datapipes.iter import IterableWrapper
    items = [list(b) for b in DataLoader(IterableWrapper(range(20)).batch(4), batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")]
    after = {p for d in ("/dev/shm", tempfile.gettempdir()) for p in glob.glob(d + mine)}
    ours = [t.name for t in threading.enumerate() if t.name.startswith("wds")]
    print(items, ours, sorted(after - before))
""")


def test_importing_changes_nothing_for_code_without_our_pipes():
    """Oracle: the same program without the import (its items, threads of ours, its files)."""
    runs = [subprocess.run([sys.executable, "-c", IMPORT_ONLY, mode], capture_output=True, text=True, timeout=120,
                           check=True).stdout for mode in ("import", "plain")]
    assert runs[0] == runs[1]
    assert runs[0].rstrip().endswith("[] []")


def test_snapshots_pickle_and_subtract(tmp_path, stats_on):
    """A snapshot is plain numbers: it pickles, and ``since`` subtracts the counts of an earlier one
    (oracle: the counts of the two reads apart)."""
    paths = write_shards(tmp_path, 2, 6)
    sum(1 for _ in wd.ShardLister(paths).load_tar().group_by_key())
    first = wd.stats.snapshot()
    sum(1 for _ in wd.ShardLister(paths[:1]).load_tar().group_by_key())
    second = pickle.loads(pickle.dumps(wd.stats.snapshot()))
    delta = second.since(first)
    assert (first.stages["tar"].items, second.stages["tar"].items, delta.stages["tar"].items) == (12, 18, 6)
    assert delta.stages["open"].items == 1 and delta.stages["read"].bytes == os.path.getsize(paths[0])
    assert isinstance(delta.stages["read"].seconds, float) and torch is not None
