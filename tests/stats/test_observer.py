"""The hook exporters build on: an observer made in each process that measures sees every timed
interval of the workers, on the one clock all processes of a machine share."""

from __future__ import annotations

import collections
import os
import time

from stats_data import fork_loader, write_shards

import wds_datapipes as wd


class SpanFiles:
    """An observer factory (picklable: it travels to the workers with the settings): each process
    writes its intervals to its own file, and says each begin and end (``live``, as the ranges
    of a profiler need)."""

    def __init__(self, folder: str):
        self.folder = folder

    def __call__(self, process: dict) -> _Spans:
        return _Spans(os.path.join(self.folder, f"spans-{process['pid']}.txt"))


class _Spans:
    live = True

    def __init__(self, path: str):
        self.out = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as its process

    def begin(self, stage: str, label: str) -> None:
        self.out.write(f"begin\t{stage}\n")

    def end(self, stage: str, label: str) -> None:
        self.out.write(f"end\t{stage}\n")

    def span(self, stage: str, label: str, start: int, end: int) -> None:
        self.out.write(f"span\t{stage}\t{start}\t{end}\n")


def test_each_worker_observes_its_timed_intervals(tmp_path):
    """Oracles: the training process's own clock around the loop (every span lies inside it),
    the shards read (one opening each), and begins and ends that pair up."""
    paths = write_shards(tmp_path / "data", 4, 10)
    folder = tmp_path / "spans"
    folder.mkdir()
    wd.stats.enable(observer=SpanFiles(str(folder)))
    try:
        dp = wd.ShardLister(paths).load_tar().group_by_key().batch_samples(4)
        began = time.perf_counter_ns()
        batches = len(list(wd.stats.watch(fork_loader(dp))))
        ended = time.perf_counter_ns()
    finally:
        wd.stats.disable()
    own = folder / f"spans-{os.getpid()}.txt"  # the training process read no pipe: its loop's waits only
    lines = [line.split("\t") for line in own.read_text().splitlines()]
    assert [kind for kind, *_ in lines] == ["begin", "end", "span"] * batches + ["begin", "end"]  # the epoch's end
    assert {stage for _, stage, *_ in lines} == {"wait"} and batches == 10
    assert all(began <= int(start) <= int(end) <= ended for kind, _, *rest in lines if kind == "span"
               for start, end in [rest])
    files = sorted(set(folder.iterdir()) - {own})
    assert len(files) == 2  # the two workers
    opened = 0
    for path in files:
        lines = [line.split("\t") for line in path.read_text().splitlines()]
        spans = [(stage, int(start), int(end)) for kind, stage, *rest in lines if kind == "span"
                 for start, end in [rest]]
        assert {"list", "open", "read", "tar", "batch"} <= {stage for stage, _, _ in spans}
        assert all(began <= start <= end <= ended for _, start, end in spans)
        opened += sum(stage == "open" for stage, _, _ in spans)
        depth = collections.Counter()
        for kind, stage, *_ in lines:
            if kind in ("begin", "end"):
                depth[stage] += 1 if kind == "begin" else -1
                assert depth[stage] in (0, 1)
        assert set(depth.values()) <= {0}
    assert opened == 4
