"""Streams that cut, reset and stall: HTTP shards resume from the byte they reached, give up
with our error naming the URL, and a shard cut inside a sample never yields that sample."""

from __future__ import annotations

import http.server
import io
import os
import socket
import struct
import tarfile
import threading
import time
from pathlib import Path

import pytest
import webdataset as wds

from wds_datapipes import (
    Limits,
    ShardFormatError,
    ShardLister,
    ShardOpenError,
    ShardReadError,
    TarLoader,
    WdsError,
    WebDatasetGrouper,
    warn_and_continue,
)
from wds_datapipes.shards.openers import open_shard

FAST = Limits(http_timeout=0.5, http_retries=2)


def _shard(path: Path, samples: int = 6) -> bytes:
    """A shard of ``samples`` samples, each a small ``cls`` and a 20 KB ``bin``; returns its bytes."""
    with wds.TarWriter(str(path)) as writer:
        for i in range(samples):
            writer.write({"__key__": f"k{i}", "cls": str(i).encode(), "bin": os.urandom(20_000)})
    return path.read_bytes()


def _between_fields(data: bytes, key: str) -> int:
    """The offset where sample ``key``'s second member's headers start: a cut there leaves
    the sample with its first field only."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getmembers()
    first = next(i for i, m in enumerate(names) if m.name.startswith(key + "."))
    return names[first + 1].offset


class _FaultyServer(http.server.ThreadingHTTPServer):
    """Serves one object; request ``i`` follows ``faults[i]`` (then plain answers):

    ``cut`` (the body stops at byte ``at``, Content-Length sent), ``cut-unsized`` (the same,
    no Content-Length), ``cut-chunked`` (chunked, stopped mid-chunk), ``reset`` (a TCP reset
    at ``at``), ``stall`` (no byte after ``at`` for ``stall`` s), ``stall-headers``,
    ``ignore-range`` (the whole object, 200), ``changed`` (another ETag).
    """

    daemon_threads = True

    def __init__(self, payload: bytes, faults: list[str], at: int, stall: float = 3.0):
        super().__init__(("127.0.0.1", 0), _FaultyHandler)
        self.payload, self.faults, self.at, self.stall = payload, faults, at, stall
        self.ranges: list[str | None] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/shard-000.tar"


class _FaultyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        server: _FaultyServer = self.server
        index = len(server.ranges)
        requested = self.headers.get("Range")
        server.ranges.append(requested)
        fault = server.faults[index] if index < len(server.faults) else None
        if fault == "stall-headers":
            time.sleep(server.stall)
            return
        start = int(requested.split("=")[1].rstrip("-")) if requested and fault != "ignore-range" else 0
        body = server.payload[start:]
        if fault == "cut-chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"%x\r\n" % len(body) + body[: server.at])
            self._drop()
            return
        self.send_response(206 if start else 200)
        if fault != "cut-unsized":
            self.send_header("Content-Length", str(len(body)))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(server.payload) - 1}/{len(server.payload)}")
        self.send_header("ETag", '"v2"' if fault == "changed" else '"v1"')
        self.send_header("Connection", "close")
        self.end_headers()
        if fault in ("cut", "cut-unsized", "reset", "stall"):
            self.wfile.write(body[: max(0, server.at - start)])
            self.wfile.flush()
            if fault == "stall":
                time.sleep(server.stall)
            self._drop(reset=fault == "reset")
            return
        self.wfile.write(body)

    def _drop(self, reset: bool = False) -> None:
        self.wfile.flush()
        if reset:  # SO_LINGER 0: close() sends a TCP reset (once the client has read what came)
            time.sleep(0.3)
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            self.connection.shutdown(socket.SHUT_WR)
        self.connection.close()
        self.close_connection = True


@pytest.fixture
def serve(monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    servers = []

    def start(payload: bytes, faults: list[str], at: int = 0, stall: float = 3.0) -> _FaultyServer:
        server = _FaultyServer(payload, faults, at, stall)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _samples(urls, handler=None, limits: Limits = FAST, fused: bool = True) -> list[dict]:
    members = TarLoader(ShardLister(urls), **({"handler": handler} if handler else {}), limits=limits)
    if not fused:  # group_by_key over a plain pipe of tuples: the same rule must hold
        members = _Tuples(members)
    return list(WebDatasetGrouper(members, **({"handler": handler} if handler else {})))


class _Tuples:
    def __init__(self, source):
        self.source = source

    def __iter__(self):
        yield from self.source


def _plain(samples: list[dict]) -> list[dict]:
    return [{k: v for k, v in s.items() if k != "__url__"} for s in samples]


# ---------------------------------------------------------------- HTTP: resuming


@pytest.mark.parametrize("fault", ["cut", "cut-chunked", "reset", "stall", "ignore-range"])
def test_http_shard_resumes_where_the_connection_broke(serve, tmp_path, fault):
    payload = _shard(tmp_path / "s.tar")
    at = _between_fields(payload, "k2") + 700
    faults = [fault] if fault != "ignore-range" else ["cut", "ignore-range"]
    server = serve(payload, faults, at=at, stall=2.0)
    assert _plain(_samples([server.url])) == _plain(_samples([str(tmp_path / "s.tar")]))
    assert server.ranges[0] is None
    if fault != "cut-chunked":  # a chunked body's cut is noticed at a chunk boundary, not at ``at``
        assert server.ranges[1] == f"bytes={at}-"
    assert len(server.ranges) == 2


def test_http_shard_that_keeps_breaking_gives_up_naming_the_url(serve, tmp_path):
    payload = _shard(tmp_path / "s.tar")
    server = serve(payload, ["cut", "cut", "cut", "cut"], at=30_000)
    started = time.monotonic()
    with pytest.raises(ShardReadError, match="gave up after 2 retries") as caught:
        _samples([server.url])
    assert caught.value.url == server.url and caught.value.offset is not None
    assert len(server.ranges) == 3 and time.monotonic() - started < 10


@pytest.mark.parametrize("fault", ["cut", "cut-chunked", "reset"])
def test_a_broken_http_stream_reaches_the_handler_as_our_error(serve, tmp_path, fault):
    payload = _shard(tmp_path / "s.tar")
    server = serve(payload, [fault], at=_between_fields(payload, "k2"))
    seen: list[BaseException] = []

    def record(exn: BaseException) -> bool:
        seen.append(exn)
        return True

    samples = _samples([server.url, str(tmp_path / "s.tar")], handler=record, limits=FAST.replace(http_retries=0))
    assert len(seen) == 1 and isinstance(seen[0], WdsError) and seen[0].url == server.url
    assert [s["__key__"] for s in samples] == ["k0", "k1"] + [f"k{i}" for i in range(6)]


def test_http_server_that_never_answers_gives_an_error_after_the_timeout(serve, tmp_path):
    server = serve(b"", ["stall-headers"] * 3, stall=5.0)
    started = time.monotonic()
    with pytest.raises(ShardOpenError, match="gave up after 1 retries") as caught:
        open_shard(server.url, limits=Limits(http_timeout=0.3, http_retries=1))
    assert caught.value.url == server.url
    assert time.monotonic() - started < 4


def test_http_object_that_changed_between_requests_is_not_spliced(serve, tmp_path):
    payload = _shard(tmp_path / "s.tar")
    server = serve(payload, ["cut", "changed"], at=30_000)
    with pytest.raises(ShardReadError, match="changed while it was read") as caught:
        _samples([server.url])
    assert caught.value.url == server.url


# ---------------------------------------------------------------- a cut inside a sample


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "tuples"])
@pytest.mark.parametrize("how", ["http-unsized", "http-sized", "pipe-exits-early"])
def test_a_stream_cut_between_two_fields_never_yields_that_sample(serve, tmp_path, how, fused):
    path = tmp_path / "s.tar"
    payload = _shard(path)
    cut = _between_fields(payload, "k3")
    if how == "pipe-exits-early":
        url = f"pipe:head -c {cut} {path}"
    else:
        url = serve(payload, ["cut-unsized" if how == "http-unsized" else "cut"], at=cut).url
    with pytest.warns(UserWarning, match="skipped"):
        samples = _samples([url, str(path)], handler=warn_and_continue, limits=FAST.replace(http_retries=0),
                           fused=fused)
    keys = [s["__key__"] for s in samples]
    assert keys == ["k0", "k1", "k2"] + [f"k{i}" for i in range(6)]  # k3 had its cls only: dropped
    assert all({"cls", "bin"} <= s.keys() for s in samples)


def test_a_shard_cut_without_a_handler_raises_and_yields_no_partial_sample(tmp_path):
    path = tmp_path / "s.tar"
    payload = _shard(path)
    cut_path = tmp_path / "cut.tar"
    cut_path.write_bytes(payload[: _between_fields(payload, "k3")])
    got = []
    with pytest.raises(ShardFormatError, match="truncated"):
        got.extend(ShardLister([str(cut_path)]).load_tar().group_by_key())
    assert [s["__key__"] for s in got] == ["k0", "k1", "k2"]


# ---------------------------------------------------------------- pipe: commands that stay alive


def test_a_pipe_command_that_closes_its_output_but_stays_alive_is_stopped_and_reported(tmp_path):
    """Read to the end of its output (a gzipped shard is read to its last trailer), the
    command owes an exit status: one that lingers past pipe_grace is stopped and reported."""
    path = tmp_path / "s.tar"
    _shard(path, samples=2)
    pid_file = tmp_path / "sleeper.pid"
    url = f"pipe:gzip -c {path}; exec >&-; sleep 60 & echo $! > {pid_file}; wait"
    started = time.monotonic()
    with pytest.raises(ShardOpenError, match="still running") as caught:
        _samples([url], limits=Limits(pipe_grace=0.5))
    assert caught.value.url == url
    assert time.monotonic() - started < 10
    sleeper = int(pid_file.read_text())
    assert _gone(sleeper), "the command's own child was left running"


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "tuples"])
def test_a_pipe_command_still_running_is_reported_to_the_handler_with_its_samples_kept(tmp_path, fused):
    path = tmp_path / "s.tar"
    _shard(path, samples=2)
    url = f"pipe:gzip -c {path}; exec >&-; sleep 60"
    with pytest.warns(UserWarning, match="still running"):
        samples = _samples([url, str(path)], handler=warn_and_continue, limits=Limits(pipe_grace=0.3), fused=fused)
    # The tar was read whole before the command was stopped: every sample of it came.
    assert [s["__key__"] for s in samples] == ["k0", "k1", "k0", "k1"]


def _gone(pid: int, wait: float = 3.0) -> bool:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
            if state == "Z":
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.05)
    return False


def test_a_pipe_command_that_writes_its_shard_and_lingers_gives_its_samples_at_once(tmp_path):
    path = tmp_path / "s.tar"
    _shard(path, samples=50)
    url = f"pipe:cat {path}; sleep 30"
    started = time.monotonic()
    pipe = WebDatasetGrouper(TarLoader(ShardLister([url]), limits=Limits(pipe_grace=10)))
    arrived = [time.monotonic() - started for _ in pipe]
    assert len(arrived) == 50
    assert arrived[-1] < 5, f"the last sample came after {arrived[-1]:.1f} s: it waited for the command to exit"
    # The reader is done at the end-of-archive block: the command is stopped then, and that is no error.
    assert time.monotonic() - started < 5


def test_a_pipe_command_that_stalls_mid_shard_fails_naming_it_within_its_timeout(tmp_path):
    path = tmp_path / "s.tar"
    _shard(path, samples=50)
    pid_file = tmp_path / "sleeper.pid"
    url = f"pipe:head -c 300000 {path}; sleep 60 & echo $! > {pid_file}; wait"
    started = time.monotonic()
    got = []
    samples = iter(WebDatasetGrouper(TarLoader(ShardLister([url]), limits=Limits(pipe_timeout=1.0))))
    with pytest.raises(ShardReadError, match=r"wrote nothing for 1 s \(Limits.pipe_timeout\)") as caught:
        got.extend(samples)
    assert caught.value.url == url and caught.value.offset > 0
    assert 0 < len(got) < 50 and time.monotonic() - started < 10
    assert _gone(int(pid_file.read_text())), "the stalled command was left running"
