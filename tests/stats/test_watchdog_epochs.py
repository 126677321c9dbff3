"""The stall watchdog over ``ExactEpochs``: a read that hangs is named with its shard, server and
byte offset on each of their read paths: through the tar headers (a stream), by member places in
order and shuffled (positional reads, in a local file or a cached copy), and while a cached
copy's opening asks its source."""

from __future__ import annotations

import os
import threading
import time

import pytest
from builders import write_index
from shard_server import StallingServer
from stall_log import stuck_on
from stats_data import write_shards

import wds_datapipes as wd
from wds_datapipes.cache.store import key_of

pytestmark = pytest.mark.timeout(120)

ORDERS = {"in order": {"shuffle": False}, "shuffled": {"shuffle": True, "seed": 5, "lanes": 2, "block": 8}}


def _keys(pipe) -> list[str]:
    return [s["__key__"] for s in pipe]


def _epochs(index: str, options: dict) -> wd.ExactEpochs:
    return wd.ExactEpochs(index, batch_size=4, rank=0, world_size=1, **options)


def _the_warning(stall_log, url: str, phase: str):
    warnings = [r for r in stall_log.warnings() if stuck_on(r, url, phase)]
    assert len(warnings) == 1, [r.getMessage()[:300] for r in stall_log.records]
    (process, thread), = stuck_on(warnings[0], url, phase)
    assert process["worker"] == -1 and process["pid"] == os.getpid()  # no loader workers: this process
    return warnings[0], thread


def test_a_hung_read_through_the_headers_names_its_shard_server_and_offset(tmp_path, stats_on, stall_log):
    """Remote shards with places but no cache: ExactEpochs reads them through their headers (a
    stream). The server stops one shard's body after 10,037 bytes. Oracles: the server's own count
    of the bytes it sent (the logged offset), its address, and every sample of an unstalled epoch."""
    paths = write_shards(tmp_path / "remote", 4, 12, size=3000)
    with StallingServer(str(tmp_path / "remote"), None, at=10_037) as server:
        urls = [server.url(os.path.basename(p)) for p in paths]
        index = write_index(urls, tmp_path / "index.json", places=True)
        expected = _keys(_epochs(index, ORDERS["in order"]))
        server.stalled = "s-002.tar"
        stall_log.release_on(urls[2], "reading", server.release)
        got = _keys(wd.stats.watch(_epochs(index, ORDERS["in order"]), stall_s=1.5))
    assert got == expected and server.stalling.is_set()
    record, thread = _the_warning(stall_log, urls[2], "reading")
    host = f"127.0.0.1:{server.server_address[1]}"
    assert thread["shard"]["offset"] == server.sent_before_stall == 10_037 and thread["shard"]["host"] == host
    assert any("epochs/reading.py" in line for line in thread["stack"])
    assert "at byte offset 10037" in record.getMessage()


class HungPread:
    """``os.pread``, but the first read of the file ``name`` stops until ``release`` is set (30 s
    at most). ``offset``: where that read began; the file is known by the kernel's name of the
    descriptor (/proc/self/fd), not by the library."""

    def __init__(self, name: str):
        self.name, self.real = name, os.pread
        self.release, self.offset = threading.Event(), None

    def __call__(self, fd: int, size: int, offset: int) -> bytes:
        if self.offset is None and os.readlink(f"/proc/self/fd/{fd}").endswith(os.sep + self.name):
            self.offset = offset
            self.release.wait(30)
        return self.real(fd, size, offset)


@pytest.mark.parametrize("order", ORDERS)
def test_a_hung_read_by_places_names_its_shard_and_the_offset_it_waits_for(tmp_path, stats_on, stall_log,
                                                                          monkeypatch, order):
    """Local shards read by their member places; the first ``pread`` of one shard hangs (as on a
    stuck network filesystem). No stream counts the bytes: the offset is the pending read's, from
    the reading function's frame. Oracles: the offset the hung ``pread`` was asked for, the file
    the kernel says its descriptor is, the test's clock, and every sample of an unstalled epoch."""
    paths = write_shards(tmp_path, 4, 12, size=3000)
    index = write_index(paths, tmp_path / "index.json", places=True)
    expected = _keys(_epochs(index, ORDERS[order]))
    hung = HungPread("s-002.tar")
    monkeypatch.setattr(os, "pread", hung)
    stall_log.release_on(paths[2], "reading", hung.release)
    began = time.monotonic()
    got = _keys(wd.stats.watch(_epochs(index, ORDERS[order]), stall_s=1.5))
    took = time.monotonic() - began
    assert got == expected and hung.offset is not None and hung.offset >= 512
    record, thread = _the_warning(stall_log, paths[2], "reading")
    assert thread["shard"] == {"url": paths[2], "host": "local", "phase": "reading", "offset": hung.offset,
                               "seconds": None}
    assert 1.5 <= record.stall["waited_s"] <= took
    assert any("epochs/placed_" in line for line in thread["stack"])
    assert f"reading {paths[2]} (server local), at byte offset {hung.offset}" in record.getMessage()


@pytest.mark.usefixtures("no_cache_left_on")
@pytest.mark.parametrize("order", ORDERS)
def test_a_hung_check_of_a_cached_copy_names_the_shard_it_opens(tmp_path, stats_on, stall_log, order):
    """Remote shards the cache holds whole, read by places from the copies; each opening asks the
    source whether its copy is current (a HEAD), and the server holds one shard's answer. Oracles:
    the server's own stop (it answered nothing), its address, and every sample of the epoch."""
    paths = write_shards(tmp_path / "remote", 4, 12, size=3000)
    with StallingServer(str(tmp_path / "remote"), None, head=True) as server:
        urls = [server.url(os.path.basename(p)) for p in paths]
        index = write_index(urls, tmp_path / "index.json", places=True)
        wd.set_cache(tmp_path / "cache", "1GB")  # revalidate=True: each opening asks the source
        expected = _keys(_epochs(index, ORDERS[order]))  # through the headers: this downloads the copies
        copies = [tmp_path / "cache" / f"{key_of(url)}.data" for url in urls]
        deadline = time.monotonic() + 10
        while not all(c.exists() for c in copies) and time.monotonic() < deadline:
            time.sleep(0.02)
        gets = sum(server.gets.values())
        server.stalled = "s-002.tar"
        stall_log.release_on(urls[2], "opening", server.release)
        got = _keys(wd.stats.watch(_epochs(index, ORDERS[order]), stall_s=1.5))
    assert got == expected and server.stalling.is_set()
    assert sum(server.gets.values()) == gets  # read by places from the copies: no GET
    record, thread = _the_warning(stall_log, urls[2], "opening")
    host = f"127.0.0.1:{server.server_address[1]}"
    assert thread["shard"]["host"] == host and thread["shard"]["offset"] is None
    assert any("open_usable" in line for line in thread["stack"])
    assert f"opening {urls[2]} (server {host})" in record.getMessage()


def test_a_hung_read_of_a_span_that_starts_inside_its_shard_counts_from_the_shard_s_start(tmp_path, stats_on,
                                                                                         stall_log):
    """Rank 1 of 2 reads the second half of one remote shard through its headers, opened at its
    first sample (a Range request); the server stops after 5,000 bytes of that answer. Oracles:
    tarfile's offset of the header of rank 1's first sample, the Range the server was asked for,
    and the server's count of the bytes it sent: the logged offset is the shard's byte, not the
    answer's."""
    import tarfile

    paths = write_shards(tmp_path / "remote", 1, 24, size=3000)
    with StallingServer(str(tmp_path / "remote"), None, at=5000) as server:
        url = server.url("s-000.tar")
        index = write_index([url], tmp_path / "index.json")  # sample offsets, no places
        server.stalled = "s-000.tar"
        stall_log.release_on(url, "reading", server.release)
        got = _keys(wd.stats.watch(wd.ExactEpochs(index, batch_size=4, rank=1, world_size=2, shuffle=False),
                                   stall_s=1.5))
    with tarfile.open(paths[0]) as tar:
        first = next(m.offset for m in tar if m.name.startswith(got[0] + "."))
    assert len(got) == 12 and first > 0 and server.stalled_from == first
    _, thread = _the_warning(stall_log, url, "reading")
    assert thread["shard"]["offset"] == first + server.sent_before_stall == first + 5000
