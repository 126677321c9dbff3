"""The stall watchdog (``watch(loader, stall_s=...)``): a loop that waits on a hung read gets a log of
what each process does, naming the shard, the server and the byte offset; a loop whose batches
flow, or whose training step is the slow part, gets none; with stats off nothing runs."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest
from shard_server import _LocalServer
from stats_data import fork_loader, write_shards

import wds_datapipes as wd
from wds_datapipes.stats.watchdog import Watchdog

pytestmark = pytest.mark.timeout(120)

SECRET = "s3cr3t-do-not-log"


class StallingServer(_LocalServer):
    """Serves a folder's shards; ``stalled``'s body stops after ``at`` bytes until ``release`` is
    set (30 s at most), then goes on. ``sent_before_stall``: the body bytes it sent before stopping."""

    def __init__(self, folder: str, stalled: str, at: int):
        import http.server

        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                name = self.path.lstrip("/").partition("?")[0]
                with open(os.path.join(server.folder, name), "rb") as f:
                    body = f.read()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    if name == server.stalled and not server.release.is_set():
                        self.wfile.write(body[: server.at])
                        self.wfile.flush()
                        server.sent_before_stall = server.at
                        server.stalling.set()
                        server.release.wait(30)
                        self.wfile.write(body[server.at :])
                    else:
                        self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        super().__init__(Handler)
        self.folder, self.stalled, self.at = folder, stalled, at
        self.release, self.stalling = threading.Event(), threading.Event()
        self.sent_before_stall = None


def _stuck_on(record: logging.LogRecord, url: str) -> list[tuple[dict, dict]]:
    """(process, thread) of a stall warning that reads the shard ``url``."""
    return [(p, t) for p in getattr(record, "stall", {"processes": []})["processes"] for t in p["threads"]
            if t["shard"] and t["shard"]["url"].startswith(url) and t["shard"]["phase"] == "reading"]


class Stalls(logging.Handler):
    """Keeps the stats logger's records; the first stall warning naming the stalled shard releases
    the server (a wait of a loaded machine's before it is no release)."""

    def __init__(self, server: StallingServer | None = None):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.server = server

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if self.server is not None and _stuck_on(record, self.server.url(self.server.stalled)):
            self.server.release.set()


@pytest.fixture
def stall_log():
    logger = logging.getLogger("wds_datapipes.stats")
    handler = Stalls()
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


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
        stall_log.server = server
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
