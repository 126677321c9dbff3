"""The sampler by position (reads by member places in a shuffled order): the tallies it leaves
equal those of each timed sample counted at once, however many of them it keeps before moving
them into the tallies."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import wds_datapipes as wd
from wds_datapipes.stats import meters
from wds_datapipes.stats.probe import Probe
from wds_datapipes.stats.recorder import Recorder
from wds_datapipes.stats.tallies import FLUSH_READS

# a loop's timed samples: (positions since the last one timed, the sample's ns, its bytes);
# ns stay under CAP_FLOOR_NS, so that no timed sample is capped
_TIMED = st.lists(st.tuples(st.integers(1, 200), st.integers(1, meters.CAP_FLOOR_NS - 1), st.integers(0, 5000)),
                  max_size=4 * FLUSH_READS + 3)


def test_by_position_counts_equal_each_timed_sample_counted_at_once():
    """Oracle: the tallies summed here from the loop's own positions, clock readings and bytes, the
    way the docstrings of StageTally and SourceTally define them (each timed sample stands for
    the samples since the one timed before it; the rest of the loop is counted, not weighted). While
    the loop runs, fewer than FLUSH_READS timed samples are missing from the tallies."""
    run = wd.stats.enable()
    try:
        _check(run)
    finally:
        wd.stats.disable()


def _check(run) -> None:
    @settings(max_examples=60, deadline=None)
    @given(start=st.integers(0, 10_000), timed=_TIMED, tail=st.integers(0, 300))
    def check(start: int, timed: list[tuple[int, int, int]], tail: int) -> None:
        probe = Probe(Recorder(run))
        target = probe.target("read", "file", "here")
        sampler = probe.sampler("read", source=target.source, label="here", io=target)
        clock = [10**13]
        now = meters._now
        meters._now = lambda: clock[0]
        try:
            assert sampler.first_at(start) >= start
            position = start - 1
            for i, (gap, ns, nbytes) in enumerate(timed, 1):
                position += gap
                t0 = sampler.start()
                clock[0] += ns
                assert sampler.stop_at(t0, position, nbytes) > position
                assert i - target.source.timed_reads < FLUSH_READS  # at most FLUSH_READS - 1 kept back
            end = position + 1 + tail
            sampler.finish_at(end)
        finally:
            meters._now = now
        weighted = sum(gap * ns for gap, ns, _ in timed)
        counted = sum(gap for gap, _, _ in timed)
        nbytes = sum(gap * b for gap, _, b in timed)
        stage = probe.stages["read"]
        assert (stage.items, stage.calls) == (end - start, end - start)
        assert (stage.timed, stage.ns) == (len(timed), sum(ns for _, ns, _ in timed))
        assert (stage.weighted_calls, stage.weighted_ns, stage.bytes) == (counted, weighted, nbytes)
        assert probe.accounted == weighted
        for tally in (target.source, target.scheme):
            assert (tally.sampled_reads, tally.timed_reads, tally.sampled_ns) == (counted, len(timed), weighted)
            assert tally.bytes == nbytes
        assert target.source.samples == end - start

    check()
