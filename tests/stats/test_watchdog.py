"""The stall watchdog (``watch(loader, stall_s=...)``): a loop that waits on a hung read gets a log of
what each process does, naming the shard, the server and the byte offset; a loop whose batches
flow, or whose training step is the slow part, gets none; with stats off nothing runs."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest
from shard_server import StallingServer
from stall_log import stuck_on as _stuck_on
from stats_data import fork_loader, write_shards

import wds_datapipes as wd
from wds_datapipes.stats.watchdog import Watchdog

pytestmark = pytest.mark.timeout(120)

SECRET = "s3cr3t-do-not-log"


def _watchdogs() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "wds-stats-watchdog"]


def test_a_hung_read_is_logged_with_its_shard_server_offset_and_stack(tmp_path, stats_on, stall_log):
    """A real DataLoader with 2 forked workers over HTTP; the server stops one shard's body after
    10,037 bytes. Oracles, outside the library: the server's own count of the bytes it sent
    before stopping (the logged offset must equal it), its address (the host), the test's clock
    (the warning came only after the loop had waited stall_s), and every sample read in the end
    (nothing lost by the watchdog)."""
    write_shards(tmp_path, 4, 12, size=3000)
    with StallingServer(str(tmp_path), "s-002.tar", 10_037) as server:
        stall_log.release_on(server.url(server.stalled), "reading", server.release)
        spec = server.url("s-{000..003}.tar") + f"?X-Amz-Signature={SECRET}"
        dp = wd.ShardLister(spec).load_tar().group_by_key().batch_samples(4)
        began = time.monotonic()
        batches = list(wd.stats.watch(fork_loader(dp), stall_s=1.5))
        took = time.monotonic() - began
    assert sum(len(b["__key__"]) for b in batches) == 48
    warnings = [r for r in stall_log.records if _stuck_on(r, server.url("s-002.tar"))]
    assert len(warnings) == 1 and server.stalling.is_set(), [r.getMessage()[:200] for r in stall_log.records]
    found, text = warnings[0].stall, warnings[0].getMessage()
    assert 1.5 <= found["waited_s"] <= took and warnings[0].levelno == logging.WARNING
    assert found["silent"] == []
    workers = [p for p in found["processes"] if p["worker"] >= 0]
    assert {p["worker"] for p in workers} == {0, 1} and all(p["pid"] != os.getpid() for p in workers)
    stuck = _stuck_on(warnings[0], server.url("s-002.tar"))
    assert len(stuck) == 1 and stuck[0][0] in workers, text
    _, thread = stuck[0]
    host = f"127.0.0.1:{server.server_address[1]}"
    assert thread["shard"]["offset"] == server.sent_before_stall == 10_037 and thread["shard"]["host"] == host
    assert any("wds_datapipes/storage/resuming.py" in line and "readinto" in line for line in thread["stack"])
    assert any("wds_datapipes/tar/" in line for line in thread["stack"])
    assert f"at byte offset {server.sent_before_stall}" in text and f"server {host}" in text
    assert server.url("s-002.tar") in text and "resuming.py" in text
    assert SECRET not in text and "X-Amz-Signature=***" in text
    deadline = time.monotonic() + 5
    while _watchdogs() and time.monotonic() < deadline:  # it ends with the loop
        time.sleep(0.05)
    assert _watchdogs() == []


def slow_step() -> None:
    time.sleep(2.5)


def test_no_stall_is_logged_while_batches_flow_or_the_step_is_slow(tmp_path, stats_on, stall_log):
    """Batches from 2 workers over local shards, read through at once, then again with a training
    step (2.5 s of sleep) longer than stall_s (2 s): no batch comes for 2.5 s, but the loop is
    not waiting for one (its 4 batches wait for it). Oracle: the logger's records (none)."""
    paths = write_shards(tmp_path, 2, 16, size=500)
    dp = wd.ShardLister(paths).load_tar().group_by_key().batch_samples(8)
    assert sum(1 for _ in wd.stats.watch(fork_loader(dp), stall_s=2)) == 4
    for _ in wd.stats.watch(fork_loader(dp, prefetch_factor=4), stall_s=2):
        slow_step()
    assert [r.getMessage()[:200] for r in stall_log.records if hasattr(r, "stall")] == []


def test_a_long_wait_goes_on_being_logged_and_stops_with_the_loop(stats_on, stall_log):
    """A watchdog whose loop waits (its ``waiting_since`` set by hand, 4 s ago's clock read by the
    test): logged at once, not again before twice the wait; stopped, its thread ends."""
    dog = Watchdog(stats_on, 0.2)
    try:
        dog.waiting_since = time.perf_counter_ns() - 4 * 10**9
        deadline = time.monotonic() + 10
        while dog.stalls < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the next warning is due at 0.4 s of wait: long passed, but logged once for now
        assert dog.stalls == 1
        dog.waiting_since = 0
    finally:
        dog.stop()
    dog._thread.join(5)
    assert not dog._thread.is_alive()
    text = next(r.getMessage() for r in stall_log.records if hasattr(r, "stall"))
    assert text.startswith("no batch for 4.") and "the training process" in text


def test_with_stats_off_no_watchdog_runs(tmp_path):
    """Stats off: watch(..., stall_s=...) is iter(loader); no thread starts. Oracle: threading's list."""
    paths = write_shards(tmp_path, 1, 4)
    before = set(threading.enumerate())
    dp = wd.ShardLister(paths).load_tar().group_by_key()
    assert len(list(wd.stats.watch(dp, stall_s=0.01))) == 4
    assert _watchdogs() == [] and not [t for t in set(threading.enumerate()) - before if t.name.startswith("wds")]
