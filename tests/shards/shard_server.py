"""An HTTP server of the shards in a folder, for the cache's tests and benchmark: it counts
what it is asked and sends (GETs and HEADs per object, bytes), answers HEAD and Range
requests with an ETag, and sends at most ``rate`` bytes per second per connection (0: as
fast as it can)."""

from __future__ import annotations

import collections
import http.server
import io
import os
import tarfile
import threading
import time


class _LocalServer(http.server.ThreadingHTTPServer):
    """An HTTP server on a free port of 127.0.0.1, serving from a thread inside ``with``."""

    daemon_threads = True

    def __init__(self, handler: type):
        super().__init__(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/{name}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()


class ShardServer(_LocalServer):
    def __init__(self, folder: str, rate: float = 0):
        super().__init__(_Handler)
        self.folder, self.rate = folder, rate
        self.gets: collections.Counter[str] = collections.Counter()
        self.heads: collections.Counter[str] = collections.Counter()
        self.sent = 0
        self.counting = threading.Lock()



class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _object(self) -> tuple[str, os.stat_result] | None:
        path = os.path.join(self.server.folder, self.path.lstrip("/").partition("?")[0])  # a query: settings
        try:
            return path, os.stat(path)
        except OSError:
            self.send_error(404)
            return None

    def _headers(self, info: os.stat_result, start: int, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(info.st_size - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{info.st_size - 1}/{info.st_size}")
        self.send_header("ETag", f'"{info.st_size}-{info.st_mtime_ns}"')
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_HEAD(self):
        found = self._object()
        with self.server.counting:
            self.server.heads[self.path.lstrip("/")] += 1
        if found:
            self._headers(found[1], 0, 200)

    def do_GET(self):
        found = self._object()
        if not found:
            return
        path, info = found
        asked = self.headers.get("Range")
        start = int(asked.split("=")[1].rstrip("-")) if asked else 0
        server: ShardServer = self.server
        with server.counting:
            server.gets[self.path.lstrip("/")] += 1
        self._headers(info, start, 206 if start else 200)
        chunk = 64 << 10
        began = time.monotonic()
        sent = 0
        try:
            with open(path, "rb") as f:
                f.seek(start)
                while data := f.read(chunk):
                    self.wfile.write(data)
                    sent += len(data)
                    with server.counting:
                        server.sent += len(data)
                    if server.rate:
                        ahead = sent / server.rate - (time.monotonic() - began)
                        if ahead > 0:
                            time.sleep(ahead)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class StallingServer(ShardServer):
    """A :class:`ShardServer` whose answer for ``stalled`` stops once, until ``release`` is set
    (30 s at most), then goes on: a GET's body after ``at`` of its bytes, or with ``head=True`` a
    HEAD's answer before its status line. ``stalling`` is set when it stops;
    ``sent_before_stall``: the body bytes it had sent then (from the Range's start,
    ``stalled_from``).
    ``stalled=None`` stops nothing (set it later to arm the server)."""

    def __init__(self, folder: str, stalled: str | None, at: int = 0, head: bool = False):
        super().__init__(folder)
        self.RequestHandlerClass = _StallingHandler
        self.stalled, self.at, self.head = stalled, at, head
        self.release, self.stalling = threading.Event(), threading.Event()
        self.sent_before_stall: int | None = None
        self.stalled_from: int | None = None  # the byte the stopped GET's Range began at (0: none)

    def stops(self, name: str, head: bool) -> bool:
        """Whether this request stops now (once: the first one asked after arming)."""
        with self.counting:
            if name != self.stalled or head != self.head or self.stalling.is_set():
                return False
            self.stalling.set()
            return True


class _StallingHandler(_Handler):
    def do_HEAD(self):
        if self.server.stops(self.path.lstrip("/").partition("?")[0], head=True):
            self.server.release.wait(30)
        super().do_HEAD()

    def do_GET(self):
        server: StallingServer = self.server
        name = self.path.lstrip("/").partition("?")[0]
        if name != server.stalled or server.head or server.stalling.is_set():
            super().do_GET()
            return
        found = self._object()
        if not found:
            return
        asked = self.headers.get("Range")
        start = int(asked.split("=")[1].rstrip("-")) if asked else 0
        self._headers(found[1], start, 206 if start else 200)
        with open(found[0], "rb") as f:
            f.seek(start)
            body = f.read()
        try:
            self.wfile.write(body[: server.at])
            self.wfile.flush()
            server.sent_before_stall, server.stalled_from = server.at, start
            if server.stops(name, head=False):
                server.release.wait(30)
            self.wfile.write(body[server.at :])
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


# ---------------------------------------------------------------- a server that fails, cuts and changes answers

FAULTS = ("ok", "503", "cut", "cut-unsized", "stall", "late-tail", "change")
_HTML_503 = b"<html><head><title>503 Service Unavailable</title></head><body>Try again later.</body></html>\n"


class FaultyShardServer(_LocalServer):
    """Serves in-memory objects, each GET answered as ``schedule(name, request number)`` says:

    ``ok``; ``503`` (an HTML page, as a busy proxy sends it); ``cut`` (the body stops at
    a random byte, Content-Length sent: the client can tell); ``cut-unsized`` (HTTP/1.0, no
    Content-Length, the body stops at a random byte: only the bytes can tell); ``stall`` (no
    byte after a random one for ``stall`` seconds, then the connection closes);
    ``late-tail`` (the last 512 bytes come ``late`` seconds after the rest); ``change`` (the
    object is replaced by its next version, whose samples differ, before this answer);
    ``ignore-range`` (the whole object, 200, whatever Range was asked for; not in ``FAULTS``).
    HEAD requests answer plainly (size, ETag of the current version). Range requests are
    answered from the current version. ``versions[name]`` is every version an object had,
    in order: what a reader may see of it.
    """

    def __init__(self, versions: dict[str, list[bytes]], schedule, stall: float = 1.0, late: float = 0.2,
                 seed: int = 0):
        super().__init__(_FaultyHandler)
        import random

        self.versions = versions
        self.current = dict.fromkeys(versions, 0)
        self.schedule, self.stall, self.late = schedule, stall, late
        self.random = random.Random(seed)
        self.requests: collections.Counter[str] = collections.Counter()
        self.answers: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def body(self, name: str) -> bytes:
        return self.versions[name][self.current[name]]



class _FaultyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _name(self) -> str | None:
        name = self.path.lstrip("/")
        if name not in self.server.versions:
            self.send_error(404)
            return None
        return name

    def _head(self, status: int, body: bytes, start: int, name: str, sized: bool = True) -> None:
        import hashlib

        self.send_response(status)
        if sized:
            self.send_header("Content-Length", str(len(body) - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.send_header("ETag", f'"{hashlib.sha1(body).hexdigest()[:16]}"')
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Connection", "close")
        self.end_headers()

    def do_HEAD(self):
        name = self._name()
        if name is not None:
            with self.server.lock:
                body = self.server.body(name)
            self._head(200, body, 0, name)

    def do_GET(self):
        server: FaultyShardServer = self.server
        name = self._name()
        if name is None:
            return
        self.close_connection = True
        with server.lock:
            number = server.requests[name]
            server.requests[name] += 1
            fault = server.schedule(name, number)
            server.answers.append((name, fault))
            if fault == "change" and server.current[name] + 1 < len(server.versions[name]):
                server.current[name] += 1
            body = server.body(name)
            at = server.random.randrange(1, len(body))
        asked = self.headers.get("Range")
        start = min(int(asked.split("=")[1].rstrip("-")), len(body)) if asked and fault != "ignore-range" else 0
        try:
            if fault == "503":
                self.send_response(503)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(_HTML_503)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(_HTML_503)
                return
            if fault == "cut-unsized":
                self.protocol_version = "HTTP/1.0"  # the status line says so; the body ends at the close
            self._head(206 if start else 200, body, start, name, sized=fault != "cut-unsized")
            rest = body[start:]
            if fault in ("cut", "cut-unsized", "stall"):
                self.wfile.write(rest[: max(0, at - start)])
                self.wfile.flush()
                if fault == "stall":
                    time.sleep(server.stall)
                return
            if fault == "late-tail":
                self.wfile.write(rest[:-512])
                self.wfile.flush()
                time.sleep(server.late)
                self.wfile.write(rest[-512:])
                return
            self.wfile.write(rest)
        except (BrokenPipeError, ConnectionResetError):
            pass


def tarfile_samples(data: bytes) -> list[tuple[str, dict[str, bytes]]]:
    """(key, {field: bytes}) of each sample, as tarfile reads a shard's bytes: the oracle of
    the fault tests."""
    samples: list[tuple[str, dict[str, bytes]]] = []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar:
            key, _, field = member.name.partition(".")
            if not samples or samples[-1][0] != key:
                samples.append((key, {}))
            samples[-1][1][field] = tar.extractfile(member).read()
    return samples
