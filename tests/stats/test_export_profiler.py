"""torch.profiler ranges around the stages, read from a real profiler's events: only while it
records, and on the one timeline of the training step's own ops."""

from __future__ import annotations

import collections
import itertools
import json
import time

import torch
import torch.profiler
from stats_data import write_shards

import wds_datapipes as wd


def _slow_int(value: bytes) -> int:
    """A transform of 1.5 ms a sample: past stats' TIME_ALL_NS, so every sample of it is timed."""
    time.sleep(0.0015)
    return int(value)


def _pipeline(paths, convert=int):
    return wd.ShardLister(paths).load_tar().group_by_key().map_fields({"cls": convert}).batch_samples(5)


def _profiled(dp, trace_path=None):
    """One pass over ``dp`` with a CPU matmul after each batch (the training step), under torch.profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        batches = 0
        for _ in dp:
            torch.ones(32, 32) @ torch.ones(32, 32)
            batches += 1
    if trace_path is not None:
        prof.export_chrome_trace(str(trace_path))
    return prof, batches


def test_ranges_show_only_while_a_profiler_records_and_line_up_with_the_steps(tmp_path):
    """Oracles: torch.profiler's own events (prof.events()) and its exported Chrome trace; the
    shards of the profiled pass (one opening each: the pass before, unprofiled, leaves none);
    the samples of a transform slow enough that stats time each one (a range each);
    the loop's order (each batch's range ends before that step's matmul begins, which ends
    before the next batch's range begins)."""
    paths = write_shards(tmp_path, 3, 10, size=500)
    wd.stats.enable(observer=wd.stats.ProfilerRanges())
    try:
        assert sum(1 for _ in _pipeline(paths, _slow_int)) == 6  # unprofiled: nothing opened, nothing left open
        prof, batches = _profiled(_pipeline(paths, _slow_int), tmp_path / "prof.json")
    finally:
        wd.stats.disable()
    ours = [e for e in prof.events() if e.name.startswith("wds_datapipes.")]
    counts = collections.Counter(e.name for e in ours)
    assert counts["wds_datapipes.open"] == 3 and counts["wds_datapipes.batch"] == batches == 6
    assert counts["wds_datapipes.read"] >= 3 and counts["wds_datapipes.list"] >= 3
    assert counts["wds_datapipes.transform"] == 30  # per-sample stages: a range per timed sample
    steps = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                   if e.name in ("wds_datapipes.batch", "aten::mm"))
    assert [name for _, _, name in steps] == ["wds_datapipes.batch", "aten::mm"] * 6
    assert all(end <= later for (_, end, _), (later, _, _) in itertools.pairwise(steps))
    reads = [e for e in ours if e.name == "wds_datapipes.read"]
    opens = sorted((e.time_range.start, e.time_range.end) for e in ours if e.name == "wds_datapipes.open")
    assert all(any(s <= r.time_range.start for s, _ in opens) for r in reads)  # a shard is read after it opens
    exported = json.loads((tmp_path / "prof.json").read_text())["traceEvents"]
    assert collections.Counter(e["name"] for e in exported if e.get("name") == "wds_datapipes.open") == {
        "wds_datapipes.open": 3}


def test_no_profiler_no_range_and_no_stats_no_range(tmp_path):
    """A profiler over a pipeline with stats off (no observer: the hook is None) shows no range
    of ours; with the ranges factory on and the profiler stopped midway, what follows shows none
    (oracle: the profiler's events)."""
    paths = write_shards(tmp_path, 2, 10)
    prof, _ = _profiled(_pipeline(paths))
    assert not [e for e in prof.events() if e.name.startswith("wds_datapipes.")]
    wd.stats.enable(observer=wd.stats.ProfilerRanges(prefix="mine."))
    try:
        dp = iter(_pipeline(paths))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            next(dp)
        rest = sum(1 for _ in dp)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as after:
            torch.ones(4) + 1
    finally:
        wd.stats.disable()
    assert rest == 3
    assert collections.Counter(e.name for e in prof.events() if e.name.startswith("mine."))["mine.open"] == 1
    assert not [e for e in after.events() if e.name.startswith("mine.")]


def test_the_loops_wait_is_a_range_that_holds_the_batch_it_waits_for(tmp_path):
    """Read through ``wd.stats.watch``, each next() is a ``wds_datapipes.wait`` range: one per
    batch and the last (the epoch's end), each ending before that step's matmul begins, each
    holding the batch's own range (the pipe runs inside the loop's next()). Oracle:
    torch.profiler's own events and their times."""
    paths = write_shards(tmp_path, 3, 10, size=500)
    wd.stats.enable(observer=wd.stats.ProfilerRanges())
    try:
        prof, batches = _profiled(wd.stats.watch(_pipeline(paths)))
    finally:
        wd.stats.disable()
    events = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                    if e.name in ("wds_datapipes.wait", "wds_datapipes.batch", "aten::mm"))
    waits = [(s, e) for s, e, name in events if name == "wds_datapipes.wait"]
    built = [(s, e) for s, e, name in events if name == "wds_datapipes.batch"]
    assert len(waits) - 1 == len(built) == batches == 6
    assert [name for _, _, name in events] == ["wds_datapipes.wait", "wds_datapipes.batch", "aten::mm"] * 6 + [
        "wds_datapipes.wait"]
    assert all(ws <= bs and be <= we for (ws, we), (bs, be) in zip(waits, built))
