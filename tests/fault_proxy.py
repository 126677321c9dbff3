"""A fault-injecting HTTP proxy on 127.0.0.1, in front of any HTTP server of the tests.

Clients talk to :class:`FaultProxy` as if it were the server: point their endpoint at
``proxy.url`` (``ObjectServer.through(proxy)`` in :mod:`object_servers` does so for the
object stores). Each request is read whole (a chunked request body and ``Expect:
100-continue`` included), forwarded on a fresh upstream connection, and the answer relayed
with ``Connection: close`` (one request per client connection: the relay needs no framing
of its own, and every client reconnects on its own). Headers pass unchanged, ``Host``
included, so a signature the client made for the proxy's address (S3 SigV4 signs ``Host``;
Azure SharedKey and the GCS emulator do not look at it) reaches the server as signed, and
URLs the server builds from ``Host`` point back at the proxy. ``Location`` headers naming
another port of 127.0.0.1 (AIStore redirects a GET from its proxy node to a target) are
rewritten to ``<proxy>/_t/<port>/...`` so that the second leg passes through it too.
Range requests pass through as they are (``drop_range`` strips them instead).

What each request meets is ``schedule(request)`` (a :class:`Request`: method, path, query,
Range header, the number of earlier requests of that method and path), one of :data:`FAULTS`:

- ``ok``: forwarded and relayed whole;
- ``reset``: the connection is reset (RST) before any answer byte;
- ``500`` / ``503``: the proxy answers that status itself, with ``Retry-After`` (seconds,
  ``retry_after``) and a short body; the server never sees the request;
- ``stall``: the answer's head and part of its body are relayed, then nothing for
  ``stall_s`` seconds (make it longer than the client's read timeout), then the connection
  closes;
- ``stall-head``: nothing at all for ``stall_s`` seconds, then the connection closes;
- ``cut``: the body stops at a random byte and the connection closes; ``Content-Length``
  is sent, so a client can tell;
- ``cut-unsized``: as ``cut``, but the answer goes out as HTTP/1.0 without
  ``Content-Length`` (its end is the close): only the bytes can tell.

Body faults (``stall``, ``cut``, ``cut-unsized``) fall back to ``ok`` on answers without a
body to cut (not a 200/206 to a GET), and ``cut`` / ``stall`` also where the client leaves
before the cut point: ``injected`` counts only faults a client met (``cut-unsized`` is met
at the head, which lacks ``Content-Length``), and is counted before the client can see the
fault; reading ``log`` waits for the connections being served to end (``with`` exits
after they end, too), so it holds every request a client has finished.
:func:`random_faults` makes a seeded schedule; :func:`first_faults` fails the first
requests of each path. ``injected`` (a Counter by fault) and ``log`` (one
:class:`Exchange` per request) let a test assert what the clients lived through.
"""

from __future__ import annotations

import collections
import random
import re
import socket
import socketserver
import struct
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from urllib.parse import urlsplit

FAULTS = ("ok", "reset", "500", "503", "stall", "stall-head", "cut", "cut-unsized")
BODY_FAULTS = ("stall", "cut", "cut-unsized")
_REASONS = {500: "Internal Server Error", 503: "Service Unavailable"}
_TARGET_PREFIX = re.compile(r"^/_t/(\d+)(/.*)$")
_DROPPED = {"connection", "keep-alive", "proxy-connection", "expect"}


@dataclass(frozen=True)
class Request:
    """What a schedule is asked about: a request as the client sent it (``path`` without
    the ``/_t/PORT`` prefix of a rewritten redirect), and how many requests of that method
    and path came before it."""

    method: str
    path: str
    query: str
    range: str | None
    number: int


@dataclass
class Exchange:
    """One request and what became of it: the fault met, the upstream status (0 where the
    server was not asked) and the body bytes relayed to the client."""

    method: str
    path: str
    range: str | None
    fault: str
    status: int
    sent: int


Schedule = Callable[[Request], str]


def no_faults(request: Request) -> str:
    """The schedule of a plain relay."""
    return "ok"


def random_faults(seed: int, rate: float, kinds: Collection[str] = ("reset", "503", "stall", "cut"),
                  methods: Collection[str] = ("GET",)) -> Schedule:
    """A schedule failing each request of ``methods`` with probability ``rate``, the fault
    drawn from ``kinds``; the same seed gives the same draws in the same request order."""
    unknown = set(kinds) - set(FAULTS)
    if unknown:
        raise ValueError(f"unknown faults {sorted(unknown)}; known: {FAULTS}")
    draws = random.Random(seed)
    lock = threading.Lock()
    kinds = tuple(kinds)

    def schedule(request: Request) -> str:
        if request.method not in methods:
            return "ok"
        with lock:
            return draws.choice(kinds) if draws.random() < rate else "ok"

    return schedule


def first_faults(fault: str, times: int = 1, methods: Collection[str] = ("GET",)) -> Schedule:
    """A schedule answering the first ``times`` requests of each path (of ``methods``) with ``fault``."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {FAULTS}")
    return lambda r: fault if r.method in methods and r.number < times else "ok"


class FaultProxy:
    """The proxy (see the module's docstring); a context manager serving from threads.

    ``upstream`` is ``http://HOST:PORT`` (a path in it is ignored: clients send full paths).
    ``seed`` fixes where bodies are cut and stalled. ``on_cut(path)`` runs after a body is
    cut or stalled and its upstream connection closed, before the client sees the cut.
    ``cut_at(request, body_length)`` overrides where a body stops (bytes after the head; None
    or a point past the end: not at all, the fault becomes ``ok``). It is asked only once the
    answer is known to have a body to cut (a 200/206 to a GET).
    ``translate`` (an object with ``request(method, target, headers, body)``, answering the
    request to send instead or None to leave it, and ``answer(status, headers, body)``) lets
    the proxy stand in for an API the server lacks (``object_servers.GcsXmlPut``).
    """

    def __init__(self, upstream: str, schedule: Schedule = no_faults, *, seed: int = 0,
                 stall_s: float = 5.0, retry_after: int = 0, drop_range: bool = False,
                 on_cut: Callable[[str], None] | None = None,
                 cut_at: Callable[[Request, int | None], int | None] | None = None, translate=None):
        parts = urlsplit(upstream)
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.upstream_port = parts.port or 80
        self.schedule = schedule
        self.stall_s, self.retry_after, self.drop_range = stall_s, retry_after, drop_range
        self.on_cut, self.cut_at, self.translate = on_cut, cut_at, translate
        self.injected: collections.Counter[str] = collections.Counter()
        self.exchanges: list[Exchange] = []
        self.queries: list[str] = []  # the query string of each entry of log
        self._numbers: collections.Counter[tuple[str, str]] = collections.Counter()
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._idle = threading.Condition()
        self._active = 0  # connections being served
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                with proxy._idle:
                    proxy._active += 1
                try:
                    proxy._serve(self.request)
                finally:
                    with proxy._idle:
                        proxy._active -= 1
                        proxy._idle.notify_all()

        class Server(socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def log(self) -> list[Exchange]:
        """What became of each request, in the order they ended. Waits (up to 10 s) for the
        connections being served to end first: a client can have read a whole answer before
        the thread serving it has noted it, and a test asking right after would miss it."""
        with self._idle:
            self._idle.wait_for(lambda: self._active == 0, timeout=10)
        return self.exchanges

    @property
    def faults(self) -> int:
        """How many faults were injected so far (all kinds)."""
        with self._lock:
            return sum(n for fault, n in self.injected.items() if fault != "ok")

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closing.set()  # ends stalls at once
        self._server.shutdown()
        with self._idle:  # the connections being served end (their entries in log with them)
            self._idle.wait_for(lambda: self._active == 0, timeout=30)
        self._server.server_close()

    # -- one client connection = one request

    def _serve(self, client: socket.socket) -> None:
        reader = client.makefile("rb")
        try:
            head = _read_head(reader)
            if head is None:
                return
            request_line, headers = head
            method, target, version = request_line.split(" ", 2)
            if any(n.lower() == "expect" and v.lower() == "100-continue" for n, v in headers):
                client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = _read_body(reader, headers)
        except (OSError, ValueError):
            reader.close()
            return
        port = self.upstream_port
        match = _TARGET_PREFIX.match(target)
        if match:
            port, target = int(match.group(1)), match.group(2)
        path, _, query = target.partition("?")
        range_header = next((v for n, v in headers if n.lower() == "range"), None)
        with self._lock:
            number = self._numbers[method, path]
            self._numbers[method, path] += 1
        request = Request(method, path, query, range_header, number)
        fault = self.schedule(request)
        if fault not in FAULTS:
            raise ValueError(f"the schedule answered {fault!r}; known: {FAULTS}")
        record = Exchange(method, path, range_header, fault, 0, 0)
        try:
            if fault in ("reset", "500", "503", "stall-head"):
                self._count(fault)
                self._answer_itself(client, fault)
                return
            forwarded = [(n, v) for n, v in headers if n.lower() not in _DROPPED
                         and not (self.drop_range and n.lower() == "range")]
            changed = self.translate.request(method, target, forwarded, body) if self.translate else None
            if changed is not None:
                self._relay_translated(client, record, changed, version, port)
                return
            self._relay(client, request, fault, record, f"{method} {target} {version}", forwarded, body, port)
        except OSError:
            pass
        finally:
            with self._lock:
                self.exchanges.append(record)
                self.queries.append(query)
            if fault != "reset":  # a FIN after what was sent; a reset closes with linger 0 (an RST)
                try:
                    client.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            reader.close()
            client.close()

    def _count(self, fault: str) -> None:
        with self._lock:
            self.injected[fault] += 1

    def _answer_itself(self, client: socket.socket, fault: str) -> None:
        if fault == "reset":
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return  # the close in _serve sends the RST
        if fault == "stall-head":
            self._closing.wait(self.stall_s)
            return
        status = int(fault)
        body = f"injected {status} (fault proxy)\n".encode()
        client.sendall(
            f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: {self.retry_after}\r\nConnection: close\r\n\r\n"
            .encode("latin-1") + body)

    def _relay(self, client: socket.socket, request: Request, fault: str, record: Exchange, request_line: str,
               headers: list[tuple[str, str]], body: bytes, port: int) -> None:
        upstream = socket.create_connection((self.upstream_host, port), timeout=60)
        try:
            lines = [request_line, *(f"{n}: {v}" for n, v in headers), "Connection: close"]
            upstream.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
            up_reader = upstream.makefile("rb")
            head = _read_head(up_reader)
            if head is None:
                return
            status_line, answer = head
            while status_line.split(" ", 2)[1] == "100":  # an interim answer of the server's own
                head = _read_head(up_reader)
                if head is None:
                    return
                status_line, answer = head
            status = record.status = int(status_line.split(" ", 2)[1])
            length = next((int(v) for n, v in answer if n.lower() == "content-length"), None)
            if fault in BODY_FAULTS and not (request.method == "GET" and status in (200, 206) and length != 0):
                fault = record.fault = "ok"  # nothing to cut: the answer goes out whole
            limit = None
            if fault != "ok":
                limit = self._cut_point(request, length)
                if limit is None or (length is not None and limit >= length):
                    fault = record.fault = "ok"  # the schedule's cut_at chose to leave it whole
                    limit = None
            out = [status_line]
            if fault == "cut-unsized":
                out = ["HTTP/1.0 " + status_line.split(" ", 1)[1]]
            for name, value in answer:
                lower = name.lower()
                if lower in ("connection", "keep-alive") or (fault == "cut-unsized" and lower == "content-length"):
                    continue
                if lower == "location":
                    value = self._rewrite_location(value)
                out.append(f"{name}: {value}")
            out.append("Connection: close")
            client.sendall(("\r\n".join(out) + "\r\n\r\n").encode("latin-1"))
            if fault == "cut-unsized":
                self._count(fault)  # the client meets it at the head: no Content-Length
            try:
                while limit is None or record.sent < limit:
                    chunk = up_reader.read1(65536 if limit is None else min(65536, limit - record.sent))
                    if not chunk:
                        break
                    client.sendall(chunk)
                    record.sent += len(chunk)
            except OSError:
                if fault in ("cut", "stall"):
                    record.fault = "ok"  # the client left before the cut: it never met it
                raise
            if limit is not None and record.sent < limit:
                if fault != "cut-unsized":
                    fault = record.fault = "ok"  # the body ended before the cut (chunked, shorter than it said)
            elif limit is not None:
                if fault != "cut-unsized":
                    self._count(fault)
                _reset(upstream, up_reader)  # the server stops sending at once (a GET may hold the object)
                if self.on_cut is not None:
                    self.on_cut(request.path)
                if fault == "stall":
                    self._closing.wait(self.stall_s)
        finally:
            upstream.close()

    def _relay_translated(self, client: socket.socket, record: Exchange, changed, version: str, port: int) -> None:
        """Sends the translated request, reads its whole answer, and relays that as translated back."""
        method, target, headers, body = changed
        with socket.create_connection((self.upstream_host, port), timeout=60) as upstream:
            lines = [f"{method} {target} {version}", *(f"{n}: {v}" for n, v in headers),
                     f"Content-Length: {len(body)}", "Connection: close"]
            upstream.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
            with upstream.makefile("rb") as up_reader:
                head = _read_head(up_reader)
                if head is None:
                    return
                status_line, answer = head
                content = up_reader.read()
        status, answer, content = self.translate.answer(int(status_line.split(" ", 2)[1]), answer, content)
        record.status, record.sent = status, len(content)
        out = [f"HTTP/1.1 {status} {'OK' if status < 300 else 'Error'}", *(f"{n}: {v}" for n, v in answer),
               f"Content-Length: {len(content)}", "Connection: close"]
        client.sendall(("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + content)

    def _cut_point(self, request: Request, length: int | None) -> int | None:
        if self.cut_at is not None:
            return self.cut_at(request, length)
        with self._lock:
            return self._random.randrange(0, length) if length else self._random.randrange(0, 1 << 16)

    def _rewrite_location(self, location: str) -> str:
        parts = urlsplit(location)
        if parts.hostname in ("127.0.0.1", "localhost") and parts.port and parts.port != self.port:
            rest = parts.path + (f"?{parts.query}" if parts.query else "")
            return f"{self.url}/_t/{parts.port}{rest}"
        return location


def _read_head(reader) -> tuple[str, list[tuple[str, str]]] | None:
    """The start line and the headers of a request or an answer; None at a closed connection."""
    first = reader.readline(65537).decode("latin-1").rstrip("\r\n")
    if not first:
        return None
    headers = []
    while True:
        line = reader.readline(65537).decode("latin-1").rstrip("\r\n")
        if not line:
            return first, headers
        name, _, value = line.partition(":")
        headers.append((name.strip(), value.strip()))


def _read_body(reader, headers: list[tuple[str, str]]) -> bytes:
    """A request's body, raw as it came: by Content-Length, or chunks up to the last (and its trailers)."""
    values = {n.lower(): v for n, v in headers}
    if "chunked" in values.get("transfer-encoding", "").lower():
        raw = bytearray()
        while True:
            size_line = reader.readline(65537)
            raw += size_line
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, up to the empty line
                    line = reader.readline(65537)
                    raw += line
                    if line in (b"\r\n", b"\n", b""):
                        return bytes(raw)
            raw += reader.read(size + 2)
    length = int(values.get("content-length", "0") or 0)
    return reader.read(length) if length else b""


def _reset(sock: socket.socket, reader) -> None:
    """Close ``sock`` with an RST rather than a FIN (``reader`` holds a reference to it)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    reader.close()
    sock.close()
