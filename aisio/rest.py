"""HTTP requests to AIStore nodes with exact time limits, following redirects, knowing who answered.

The data path (object GETs, listing pages, the cluster map) goes through here rather than
through the SDK's ``requests`` session, for three reasons the fault tests and
``make bench-ais`` show:

- every request gets its own connect and read timeouts (cut to the retry budget left),
  where the SDK fixes them per client and adds retries of its own;
- a GET's 301 from the proxy is followed here, so errors name the target that failed,
  not the proxy that redirected;
- the body is read with ``readinto`` straight into the caller's buffer (http.client),
  without urllib3's decoding layer: see the ``ais://`` rows of ``make bench-ais``.

Connections are kept alive and pooled per process (a forked worker starts with none),
except those that carried a large body (see :meth:`Reply.close`).
"""

from __future__ import annotations

import atexit
import http.client
import os
import socket
import struct
import threading
import time
from urllib.parse import urljoin, urlsplit

from .errors import NoAnswer

_REDIRECTS = (301, 302, 303, 307, 308)
_MAX_REDIRECTS = 4
_MAX_ERROR_BODY = 1 << 16
_MIN_TIMEOUT_S = 0.05
_IDLE_PER_HOST = 8
_KEEP_BODY_MAX = 1 << 20  # see Reply.close
# Errors of a kept-alive connection that the server closed meanwhile: a GET is sent again
# on a new connection, once, before it counts as a failure.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


def node_of(url: str) -> str:
    """``scheme://host:port`` of ``url``."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class _Pool:
    """Idle keep-alive connections per (host, port), for this process only."""

    def __init__(self):
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, int], list[http.client.HTTPConnection]] = {}
        self._pid = os.getpid()

    def take(self, host: str, port: int) -> http.client.HTTPConnection | None:
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's sockets are not ours to use
                self._idle, self._pid = {}, os.getpid()
            conns = self._idle.get((host, port))
            return conns.pop() if conns else None

    def close_all(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
            ours = self._pid == os.getpid()
        for conns in idle.values():
            for conn in conns:
                if ours:
                    conn.close()

    def give(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            conns = self._idle.setdefault((conn.host, conn.port), [])
            if self._pid == os.getpid() and len(conns) < _IDLE_PER_HOST:
                conns.append(conn)
                return
        conn.close()


_POOL = _Pool()
atexit.register(_POOL.close_all)


class Reply:
    """An answer's status and headers, and its body to read (``readinto``, ``read``).

    ``url`` is the URL that answered (after redirects), ``node`` its ``scheme://host:port``.
    Close it: a fully read body gives its connection back to the pool.
    """

    def __init__(self, response: http.client.HTTPResponse, conn: http.client.HTTPConnection, url: str,
                 read_timeout: float):
        self._response = response
        self._conn = conn
        self.url = url
        self.node = node_of(url)
        self.status = response.status
        self.headers = response.headers
        self.read_timeout = read_timeout
        self.stalled_at: float | None = None  # when the body stopped flowing, if it did

    def readinto(self, buffer) -> int:
        """Read into ``buffer``; raise TimeoutError once the body stops flowing for ``read_timeout``.

        Under the kernel's receive timeout (see :func:`_body_timeout`) a read that times out
        returns what it got before: fewer bytes than asked while the body has more to come.
        Those bytes count as they are; the stall is remembered (``stalled_at``, when the
        last of them came) and the next read raises at once.
        """
        if self.stalled_at is not None:
            raise TimeoutError(f"timed out: no data from {self.node} for {self.read_timeout:.1f} s")
        n = self._response.readinto(buffer)
        if n is None:  # the receive timeout passed with nothing read
            raise TimeoutError(f"timed out: no data from {self.node} for {self.read_timeout:.1f} s")
        if 0 < n < len(buffer) and self._response.length:  # cut short by the timeout, more to come
            self.stalled_at = time.monotonic() - self.read_timeout
        return n

    def read(self, size: int = -1) -> bytes:
        return self._response.read(None if size < 0 else size)

    def close(self) -> None:
        """Give the connection back if the body was small and read to its end, else drop it.

        A connection that carried a large body (an object) is not kept: aisnode spent 15-20%
        more CPU per byte served when the same connection went on to the next object than with
        a connection per object (``make bench-ais``, CPU per epoch of the cluster's nodes);
        redirects, listing pages and small objects keep theirs.
        """
        conn, self._conn = self._conn, None
        if conn is None:
            return
        length = self.headers.get("Content-Length")
        small = length is not None and length.isdigit() and int(length) <= _KEEP_BODY_MAX
        if small and self._response.isclosed() and not self._response.will_close:
            _POOL.give(conn)
        else:
            conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def request(method: str, url: str, *, headers: dict[str, str] | None = None, body: bytes | None = None,
            timeouts: tuple[float, float] = (3.0, 15.0), follow: bool = True) -> Reply:
    """Send one request and return the answer, following redirects to other nodes.

    Error statuses are answers, not exceptions: the caller decides. A node that cannot be
    reached or does not answer within ``timeouts`` (connect, read) raises
    :class:`~aisio.errors.NoAnswer` naming it. The read timeout bounds the whole wait for an
    answer, redirects and a retry on a stale pooled connection included; after that, it
    bounds each read of the body.
    """
    headers = headers or {}
    deadline = time.monotonic() + max(timeouts)
    for _ in range(_MAX_REDIRECTS + 1):
        reply = _send(method, url, headers, body, timeouts, deadline)
        if not (follow and reply.status in _REDIRECTS and reply.headers.get("Location")):
            return reply
        location = urljoin(url, reply.headers["Location"])
        _drain(reply)
        url = location
    raise NoAnswer(node_of(url), f"more than {_MAX_REDIRECTS} redirects for {method} {url}")


def _drain(reply: Reply) -> None:
    try:
        reply.read(_MAX_ERROR_BODY)
    except (OSError, http.client.HTTPException):
        pass
    reply.close()


def read_error_body(reply: Reply) -> bytes:
    """An error answer's body (at most 64 KiB); the reply is closed."""
    try:
        return reply.read(_MAX_ERROR_BODY)
    except (OSError, http.client.HTTPException):
        return b""
    finally:
        reply.close()


def _body_timeout(sock: socket.socket, seconds: float) -> None:
    """Limit each read of the body to ``seconds`` with the kernel's receive timeout.

    With a Python socket timeout, every read is a poll() and then a recv(), each letting
    go of the GIL; in a DataLoader2 worker, whose prefetch thread reads while its main
    thread ships samples, that cost 5-10% more CPU per epoch than urllib (which sets no
    timeout) in ``make bench-ais``. SO_RCVTIMEO keeps one recv() per read, and a stall
    still ends: the read returns nothing and :meth:`Reply.readinto` raises TimeoutError.
    """
    seconds = max(seconds, 0.001)
    try:
        whole = int(seconds)
        value = struct.pack("@ll", whole, int((seconds - whole) * 1e6))
        sock.settimeout(None)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    except (OSError, AttributeError, struct.error):  # no SO_RCVTIMEO here: poll() it is
        sock.settimeout(seconds)


def _cut(timeouts: tuple[float, float], deadline: float) -> tuple[float, float]:
    """``timeouts`` (connect, read), each cut to the time left before ``deadline``."""
    left = max(deadline - time.monotonic(), _MIN_TIMEOUT_S)
    return min(timeouts[0], left), min(timeouts[1], left)


def _send(method: str, url: str, headers: dict[str, str], body: bytes | None,
          timeouts: tuple[float, float], deadline: float) -> Reply:
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise NoAnswer(node_of(url), f"only http:// endpoints are supported here, got {url!r}")
    host, port = parts.hostname or "localhost", parts.port or 80
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    conn = _POOL.take(host, port)
    reused = conn is not None
    while True:
        connect_s, read_s = _cut(timeouts, deadline)
        if conn is None:
            conn = http.client.HTTPConnection(host, port, timeout=connect_s)
        try:
            if conn.sock is None:
                conn.timeout = connect_s
                conn.connect()
            sock = conn.sock  # getresponse() drops conn.sock when the server will close it
            sock.settimeout(read_s)
            conn.request(method, target, body=body, headers=headers)
            response = conn.getresponse()
            _body_timeout(sock, read_s)
            return Reply(response, conn, url, read_s)
        except _STALE as exn:
            conn.close()
            if reused and method in ("GET", "HEAD"):
                conn, reused = None, False  # the server closed an idle connection: once more, fresh
                continue
            raise NoAnswer(node_of(url), exn) from exn
        except (OSError, http.client.HTTPException) as exn:
            conn.close()
            raise NoAnswer(node_of(url), exn) from exn
