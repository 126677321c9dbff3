"""The report's rules on snapshots made by hand: each rule against the numbers that should, and
should not, trigger it (the rules are pure: numbers in, a diagnosis out)."""

from __future__ import annotations

import pytest

from wds_datapipes.stats import (
    ALL_STAGES,
    RanksStats,
    RankStats,
    Snapshot,
    SourceStats,
    StageStats,
    WaitStats,
    diagnose,
    report,
)


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
