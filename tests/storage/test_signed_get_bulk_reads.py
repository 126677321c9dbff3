"""Bulk reads of a presigned body (``signed_get._Body``): each read of a body of
``BULK_BODY_BYTES`` or more waits, by the socket's receive low-water mark, for a bulk of
bytes (up to ``RECEIVE_LOW_WATER``, never past the body's end) instead of taking whatever
one recv() finds; a slow body is still read whole, a
stalled one still ends after the read timeout, and a kept connection reads its next answer
at once.

Oracles: the bytes a small HTTP/1.1 server of this file sends (its own pacing: pieces and
pauses), and the read timeout given to each request.
"""

from __future__ import annotations

import random
import socket
import socketserver
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wds_datapipes.storage import signed_get
from wds_datapipes.storage.signed_get import SignedUrl, open_signed
from wds_datapipes.storage.store_calls import TRANSIENT, StoreFailure

pytestmark = pytest.mark.timeout(120)


class PacedServer(socketserver.ThreadingTCPServer):
    """HTTP/1.1 with keep-alive: ``GET /NAME`` answers 206 from the Range's first byte of
    ``bodies[NAME]``, written in pieces of ``piece`` bytes with ``pause`` seconds between them;
    after ``stop_after`` bytes of a body (if set) it sends nothing more and keeps the connection."""

    allow_reuse_address = True
    daemon_threads = True

    def __init__(self):
        self.bodies: dict[str, bytes] = {}
        self.piece, self.pause, self.stop_after = 1 << 16, 0.0, None
        self.requests_per_connection: list[int] = []
        self.done = threading.Event()
        server = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                index = len(server.requests_per_connection)
                server.requests_per_connection.append(0)
                while True:
                    line = self.rfile.readline()
                    if not line:
                        return
                    start = 0
                    while (header := self.rfile.readline()) not in (b"\r\n", b""):
                        name, _, value = header.decode("latin-1").partition(":")
                        if name.strip().lower() == "range":
                            start = int(value.strip().removeprefix("bytes=").split("-")[0])
                    server.requests_per_connection[index] += 1
                    body = server.bodies[line.split()[1].decode().lstrip("/").split("?")[0]]
                    rest = body[start:]
                    self.wfile.write(f"HTTP/1.1 206 Partial Content\r\nContent-Length: {len(rest)}\r\n"
                                     f"Content-Range: bytes {start}-{len(body) - 1}/{len(body)}\r\n"
                                     f'ETag: "e"\r\n\r\n'.encode())
                    sent = 0
                    while sent < len(rest):
                        if server.stop_after is not None and sent >= server.stop_after:
                            server.done.wait(30)  # a stall: the connection stays open, silent
                            return
                        piece = rest[sent:sent + server.piece]
                        self.wfile.write(piece)
                        self.wfile.flush()
                        sent += len(piece)
                        if server.pause:
                            time.sleep(server.pause)

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def url(self, name: str) -> SignedUrl:
        return SignedUrl(f"http://127.0.0.1:{self.server_address[1]}/{name}?X-Amz-Signature=s")


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setattr(signed_get, "BULK_BODY_BYTES", 1)  # every body with a length: small ones keep the tests short
    server = PacedServer()
    yield server
    server.done.set()
    server.shutdown()
    server.server_close()


def _read_all(body, sizes=(1 << 20,)) -> tuple[bytes, list[int]]:
    """Every byte of ``body`` read with readinto (views of ``sizes`` in turn); the count each read gave."""
    out, counts, i = bytearray(), [], 0
    while True:
        view = memoryview(bytearray(sizes[i % len(sizes)]))
        i += 1
        n = body.readinto(view)
        if not n:
            return bytes(out), counts
        out += view[:n]
        counts.append(n)


def _read_object(server, name: str, read_s: float = 10.0, sizes=(1 << 20,)) -> tuple[bytes, list[int]]:
    """The object ``name`` opened by its signed URL and read whole (see :func:`_read_all`)."""
    opened = open_signed(server.url(name), 0, None, (5.0, read_s))
    try:
        return _read_all(opened.body, sizes)
    finally:
        opened.body.close()


@pytest.mark.skipif(not hasattr(socket, "SO_RCVLOWAT"), reason="no SO_RCVLOWAT on this system")
def test_a_large_presigned_body_is_read_in_bulk_not_a_recv_at_a_time(server):
    """8 MiB written in 32 KiB pieces 1 ms apart: each read waits for up to 1 MiB (the mark
    starting at 64 KiB, doubling) rather than returning each piece as it lands."""
    data = random.Random(1).randbytes(8 << 20)
    server.bodies["big"] = data
    server.piece, server.pause = 32 << 10, 0.001
    got, counts = _read_object(server, "big")
    assert got == data
    assert len(counts) <= 24, counts  # one recv() a piece would be ~256 reads
    assert sum(counts[6:]) / len(counts[6:]) >= 512 << 10


def test_a_body_under_the_bulk_size_is_read_a_recv_at_a_time(server, monkeypatch):
    """Below BULK_BODY_BYTES (2-4 MB shards read slower in bulk) each read takes what landed."""
    monkeypatch.setattr(signed_get, "BULK_BODY_BYTES", 16 << 20)
    data = random.Random(5).randbytes(4 << 20)
    server.bodies["small"] = data
    server.piece, server.pause = 32 << 10, 0.001
    got, counts = _read_object(server, "small")
    assert got == data
    assert len(counts) > 48  # about a read a piece (128 pieces)


def test_a_body_slower_than_the_mark_is_read_whole_without_a_stall(server, monkeypatch):
    """2 KB every 20 ms (~100 KB/s): the mark is not reached within LOW_WATER_WAIT_S, so the
    read takes what came and the body goes on one recv() at a time; no read times out."""
    monkeypatch.setattr(signed_get, "LOW_WATER_WAIT_S", 0.2)
    data = random.Random(2).randbytes(200_000)
    server.bodies["slow"] = data
    server.piece, server.pause = 2000, 0.02
    got, counts = _read_object(server, "slow", 1.0, (1 << 20, 100_000))
    assert got == data
    assert len(counts) > 20  # read as it came, not in bulk


@pytest.mark.parametrize("read_s", [1.0, 0.3])
def test_a_body_that_stops_is_a_stall_after_the_read_timeout_not_before(server, monkeypatch, read_s):
    """300 KB, then silence with the connection open: the read that waits ends in a transient
    StoreFailure (the stream resumes from its position) after the read timeout, whether the
    timeout is longer or shorter than the wait for the mark."""
    monkeypatch.setattr(signed_get, "LOW_WATER_WAIT_S", 0.5)
    data = random.Random(3).randbytes(1 << 20)
    server.bodies["stops"] = data
    server.piece, server.stop_after = 50_000, 300_000
    opened = open_signed(server.url("stops"), 0, None, (5.0, read_s))
    got = bytearray()
    try:
        with pytest.raises(StoreFailure) as failure:
            while True:
                view = memoryview(bytearray(1 << 20))
                began = time.monotonic()
                n = opened.body.readinto(view)
                got += view[:n]
    finally:
        opened.body.close()
    waited = time.monotonic() - began
    assert failure.value.kind == TRANSIENT and "stalled" in failure.value.message
    assert bytes(got) == data[:300_000]
    assert read_s * 0.9 <= waited < read_s + 1.5


def test_a_kept_connection_reads_its_next_answer_at_once_after_a_bulk_body(server, monkeypatch):
    """After a body read in bulk, the connection goes back to the pool with its mark at 1: the
    next answer on it (a 100-byte body) is read at once, not after LOW_WATER_WAIT_S or a stall."""
    monkeypatch.setattr(signed_get, "LOW_WATER_WAIT_S", 3.0)
    server.bodies["big"] = random.Random(4).randbytes(4 << 20)
    server.bodies["small"] = b"x" * 100
    opened = open_signed(server.url("big"), 0, None, (5.0, 10.0))
    assert _read_all(opened.body)[0] == server.bodies["big"]
    opened.body.close()
    began = time.monotonic()
    opened = open_signed(server.url("small"), 0, None, (5.0, 10.0))
    assert _read_all(opened.body)[0] == b"x" * 100
    opened.body.close()
    assert time.monotonic() - began < 1.5
    assert server.requests_per_connection[-1] == 2  # the same connection answered both


VIEW_SIZES = st.lists(st.sampled_from([1, 511, 8192, 8193, 65_536, 300_000, 1 << 20]), min_size=1, max_size=6)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(0, 1_500_000), start=st.integers(0, 2_000), sizes=VIEW_SIZES,
       piece=st.sampled_from([4096, 8192, 1 << 16, 1 << 20]), pause=st.sampled_from([0.0, 0.0, 0.001]),
       wait=st.sampled_from([0.01, 0.5]))
def test_bulk_reads_give_every_byte_once_whatever_the_views_and_pacing(server, monkeypatch, size, start, sizes,
                                                                      piece, pause, wait):
    """Oracle: the server's bytes from ``start``. Views above and below http.client's buffer,
    pieces and pauses that reach or miss the mark within the wait (``wait`` 0.01 s makes many
    reads fall back to one recv() at a time)."""
    monkeypatch.setattr(signed_get, "LOW_WATER_WAIT_S", wait)
    data = random.Random(size).randbytes(size + start + 1)
    server.bodies["o"] = data
    server.piece, server.pause = piece, pause
    opened = open_signed(server.url("o"), start, None, (5.0, 10.0))
    try:
        got, _ = _read_all(opened.body, sizes)
    finally:
        opened.body.close()
    assert got == data[start:]
