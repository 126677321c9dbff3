"""The training loop's wait: it agrees with a wall clock taken outside the library, and a loop
whose step is the slow part is told that data is not the limit."""

from __future__ import annotations

import time

import pytest
from stack import needs_dataloader2
from stats_data import fork_loader, loader_named, write_shards

import wds_datapipes as wd


def slow_label(value: bytes) -> int:
    time.sleep(0.004)  # the injected cost of each sample
    return int(value)


@pytest.mark.parametrize("name", ["plain", "DataLoader", "StatefulDataLoader",
                                  pytest.param("DataLoader2", marks=needs_dataloader2), "torchdata.nodes"])
def test_the_measured_wait_agrees_with_a_wall_clock_outside(tmp_path, stats_on, name):
    """Under each loader. Oracles: the test's own clock around each next() and each step. The
    wait within 10% of the sum of the next() calls; the step within the steps' own time and 10%
    of the wait; readiness: the steps whose next() took at most ready_s by the test's clock
    (give or take one, a next() right at 1 ms). Every other step is long (30 ms), so the next
    batch is often ready, and the rest short (2 ms): readiness is neither 0 nor 1 under workers."""
    paths = write_shards(tmp_path, 4, 10)
    dp = wd.ShardLister(paths).load_tar().group_by_key().map_fields({"cls": slow_label}).batch_samples(4)
    loader = loader_named(name, dp)
    waits, steps = [], 0.0
    loop = wd.stats.watch(loader)
    try:
        while True:
            t0 = time.perf_counter()
            try:
                next(loop)
            except StopIteration:
                waits.append(time.perf_counter() - t0)
                break
            t = time.perf_counter()
            waits.append(t - t0)
            time.sleep(0.03 if len(waits) % 2 else 0.002)
            steps += time.perf_counter() - t
    finally:
        getattr(loader, "shutdown", lambda: None)()
    outside = sum(waits)
    wait = wd.stats.snapshot().wait
    measured = wait.blocked_seconds + wait.first_seconds + wait.last_seconds
    assert wait.steps == len(waits) - 2 == 9  # 10 batches: the first and the epoch's end apart
    assert abs(measured - outside) <= 0.10 * outside, (measured, outside)
    assert steps <= wait.step_seconds <= steps + 0.1 * outside
    ready_outside = sum(w <= wait.ready_s for w in waits[1:-1])
    assert abs(wait.ready_steps - ready_outside) <= 1, (wait.ready_steps, [round(w * 1000, 2) for w in waits])
    assert wait.readiness == pytest.approx(wait.ready_steps / wait.steps)


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
