"""The report's rules on snapshots made by hand: each rule against the numbers that should, and
should not, trigger it (the rules are pure: numbers in, a diagnosis out)."""

from __future__ import annotations

import pytest

from wds_datapipes.stats import (
    ALL_STAGES,
    STAGES,
    RanksStats,
    RankStats,
    Snapshot,
    SourceStats,
    StageStats,
    WaitStats,
    build,
    diagnose,
    report,
)
from wds_datapipes.stats.tallies import SourceTally, StageTally


def _snapshot(seconds: dict[str, float], *, wait: WaitStats | None = None, sources=(), schemes=("file",),
              cache: dict | None = None, threads: int = 0, opened: int = 10, read_bytes: int = 10 << 30,
              ranks: RanksStats | None = None) -> Snapshot:
    stages = {name: StageStats(name, seconds=seconds.get(name, 0.0)) for name in ALL_STAGES}
    stages["decode"] = StageStats("decode", seconds=seconds.get("decode", 0.0), threads=threads)
    stages["open"] = StageStats("open", items=opened, seconds=seconds.get("open", 0.0))
    stages["read"] = StageStats("read", bytes=read_bytes, seconds=seconds.get("read", 0.0))
    return Snapshot(enabled=True, processes=2, stages=stages, sources={s.name: s for s in sources},
                    schemes={name: SourceStats(name) for name in schemes}, cache=cache or {}, wait=wait,
                    ranks=ranks, cpus=8)


WAITING = WaitStats(steps=100, blocked_seconds=5.0, step_seconds=5.0, ready_steps=10)
NOT_WAITING = WaitStats(steps=100, blocked_seconds=0.05, step_seconds=10.0, ready_steps=99)


def test_a_loop_that_waits_under_a_tenth_of_its_time_is_not_limited_by_data():
    d = diagnose(_snapshot({"decode": 9.0, "read": 1.0}, wait=NOT_WAITING))
    assert d.data_limits is False and d.setting is None and d.stage == "decode"
    assert report(_snapshot({"decode": 9.0}, wait=NOT_WAITING)).startswith("data is NOT the limit")
    edge = WaitStats(steps=10, blocked_seconds=1.0, step_seconds=9.0)  # exactly a tenth: data limits
    assert diagnose(_snapshot({"decode": 9.0}, wait=edge)).data_limits is True


@pytest.mark.parametrize(("seconds", "threads", "stage", "setting"), [
    ({"decode": 9.0, "read": 1.0}, 0, "decode", "decode_threads"),
    ({"decode": 9.0, "read": 1.0}, 4, "decode", "workers"),
    ({"transform": 5.0, "decode": 1.0}, 0, "transform", "transform"),
    ({"other": 5.0, "decode": 1.0}, 0, "other", "transform"),
    ({"tar": 5.0, "read": 1.0}, 0, "tar", "workers"),
    ({"batch": 5.0, "read": 1.0}, 0, "batch", "workers"),
    ({"list": 5.0, "read": 1.0}, 0, "list", "index"),
    ({"decode": 1.0, "handover": 6.0}, 0, "handover", "handover"),  # the workers sit idle while the loop waits
])
def test_the_busiest_stage_and_its_setting(seconds, threads, stage, setting):
    d = diagnose(_snapshot(seconds, wait=WAITING, threads=threads))
    assert (d.data_limits, d.stage, d.setting) == (True, stage, setting)
    assert d.shares[stage] == pytest.approx(seconds[stage] / sum(seconds.values()))


def test_reading_names_a_slow_source_small_shards_or_the_cache():
    fast = SourceStats("fast", bytes=10 << 30, read_seconds=10.0)
    slow = SourceStats("slow", bytes=100 << 20, read_seconds=20.0)
    d = diagnose(_snapshot({"read": 30.0}, wait=WAITING, sources=[fast, slow]))
    assert (d.stage, d.source, d.setting) == ("read", "slow", "source")
    even = SourceStats("even", bytes=5 << 30, read_seconds=12.0)  # no source 3 times slower than another
    assert diagnose(_snapshot({"read": 30.0}, wait=WAITING, sources=[fast, even])).setting == "workers"
    small = _snapshot({"open": 6.0, "read": 4.0}, wait=WAITING, opened=1000, read_bytes=1000 << 20)
    assert diagnose(small).setting == "shard_size"
    remote = _snapshot({"read": 9.0}, wait=WAITING, schemes=("http",))
    assert diagnose(remote).setting == "cache"
    cached = _snapshot({"read": 9.0}, wait=WAITING, schemes=("http",), cache={"hits": 3, "misses": 1})
    assert diagnose(cached).setting == "workers"


def test_without_a_watched_loop_the_report_says_it_cannot_tell():
    d = diagnose(_snapshot({"decode": 1.0}))
    assert d.data_limits is None and d.stage == "decode" and d.setting == "decode_threads"
    assert report(_snapshot({"decode": 1.0})).startswith("no training loop was watched")
    assert "no pipe measured anything" in report(Snapshot(enabled=True))


def test_a_straggler_of_the_last_gather_is_named():
    ranks = RanksStats((RankStats(0, 10, 0.001), RankStats(1, 10, 0.2)), 0.001, 0.1, 0.2, straggler=1)
    d = diagnose(_snapshot({"decode": 1.0}, wait=WAITING, ranks=ranks))
    assert d.straggler == 1 and "straggler: rank 1 waits 200.0 ms a batch" in report(
        _snapshot({"decode": 1.0}, wait=WAITING, ranks=ranks))


def test_since_subtracts_counts_and_keeps_settings():
    early = _snapshot({"decode": 2.0}, wait=WaitStats(steps=10, blocked_seconds=1.0, step_seconds=2.0,
                                                      longest_seconds=0.5))
    late = _snapshot({"decode": 5.0}, wait=WaitStats(steps=30, blocked_seconds=1.5, step_seconds=8.0,
                                                     longest_seconds=0.7))
    delta = late.since(early)
    assert delta.stages["decode"].seconds == pytest.approx(3.0)
    assert (delta.wait.steps, delta.wait.blocked_seconds, delta.wait.step_seconds) == pytest.approx((20, 0.5, 6.0))
    assert delta.wait.longest_seconds == 0.7 and delta.wait.ready_s == late.wait.ready_s


def _record(pid: int, worker: int, *, main: bool = False, wall_s: float = 10.0, decode_ns: int = 0,
            sampled: tuple[int, int, int] = (0, 0, 0), threads: int = 0, mix: int = 0) -> dict:
    stage = dict.fromkeys(StageTally.FIELDS, 0)
    rows = {name: [0] * len(StageTally.FIELDS) for name in STAGES}
    stage.update(exact_ns=decode_ns, calls=sampled[0], timed=sampled[1], ns=sampled[2], threads=threads, items=5)
    rows["decode"] = [stage[f] for f in StageTally.FIELDS]
    source = [1] * len(SourceTally.FIELDS)
    return {"v": 1, "pid": pid, "token": "t", "main": main, "rank": 0, "world": 1, "worker": worker, "workers": 2,
            "wall_ns": int(wall_s * 1e9), "other_ns": 0, "pulls": 0, "stages": rows, "sources": {"web": source},
            "schemes": {"file": source}, "mixtures": [["RandomMix", 0, "web", mix, 0.25]],
            "counters": {"cache": {"hits": 2}}}


def test_build_sums_the_processes_records():
    """Oracle: the arithmetic by hand. A worker started again (a new process) adds to its worker;
    a stage's sampled time scales by calls/timed; the largest thread pool is kept; the training
    process's own rest of the wall clock is no hand-over."""
    records = [_record(1, 0, decode_ns=2_000_000_000, threads=2, mix=3),
               _record(2, 0, sampled=(100, 10, 300_000_000), threads=4, mix=1),
               _record(3, 1, decode_ns=1_000_000_000),
               _record(4, -1, main=True, decode_ns=1_000_000_000, wall_s=50.0)]
    s = build(records, cpus=4)
    assert s.processes == 4 and s.stages["decode"].seconds == pytest.approx(2 + 3 + 1 + 1)
    assert (s.stages["decode"].items, s.stages["decode"].threads) == (20, 4)
    assert [(w.worker, w.processes) for w in s.workers] == [(-1, 1), (0, 2), (1, 1)]
    assert s.stages["handover"].seconds == pytest.approx((10 - 2) + (10 - 3) + (10 - 1))  # not the main's 49
    assert s.sources["web"].samples == 4 and s.cache == {"hits": 8}
    assert s.mixtures[0].samples == 4 and s.mixtures[0].realized == 1.0
