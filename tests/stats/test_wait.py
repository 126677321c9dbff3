"""The training loop's wait: it agrees with a wall clock taken outside the library, and a loop
whose step is the slow part is told that data is not the limit."""

from __future__ import annotations

import time

from stats_data import fork_loader, write_shards

import wds_datapipes as wd


def slow_label(value: bytes) -> int:
    time.sleep(0.004)  # the injected cost of each sample
    return int(value)


def test_the_measured_wait_agrees_with_a_wall_clock_outside(tmp_path, stats_on):
    """Oracle: the loop's wall clock less the time its own steps took, both read by the test
    around the loop and around each step; within 10%."""
    paths = write_shards(tmp_path, 4, 10)
    dp = wd.ShardLister(paths).load_tar().group_by_key().map_fields({"cls": slow_label}).batch_samples(4)
    steps = 0.0
    began = time.perf_counter()
    for _ in wd.stats.watch(fork_loader(dp)):
        t = time.perf_counter()
        time.sleep(0.002)
        steps += time.perf_counter() - t
    outside = time.perf_counter() - began - steps
    wait = wd.stats.snapshot().wait
    measured = wait.blocked_seconds + wait.first_seconds + wait.last_seconds
    assert abs(measured - outside) <= 0.10 * outside, (measured, outside)
    assert steps <= wait.step_seconds <= steps + 0.1 * outside


def test_a_slow_training_step_means_data_is_not_the_limit(tmp_path, stats_on):
    """Oracle: the injected step (80 ms of sleep a batch, a small model's) against samples of
    microseconds; the loop's batches are waiting for it (4 a worker ahead: a machine this
    loaded may leave a woken worker waiting for a core for tens of milliseconds)."""
    paths = write_shards(tmp_path, 2, 48)
    dp = wd.ShardLister(paths).load_tar().group_by_key().batch_samples(4)
    for _ in wd.stats.watch(fork_loader(dp, prefetch_factor=4)):
        time.sleep(0.08)
    s = wd.stats.snapshot()
    d = wd.stats.diagnose(s)
    assert d.data_limits is False and d.setting is None, wd.stats.report(s)
    assert s.wait.step_seconds >= 0.08 * s.wait.steps and s.wait.wait_share < 0.1
    assert "data is NOT the limit" in wd.stats.report(s)
