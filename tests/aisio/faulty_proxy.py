"""An HTTP relay on 127.0.0.1 in front of a real AIStore cluster that cuts object bodies mid-stream.

Clients talk to the relay as if it were the cluster. AIStore redirects object GETs from
the proxy to a target (``301 Location: http://127.0.0.1:TPORT/...``); the relay rewrites
those redirects to ``http://127.0.0.1:RELAY/_t/TPORT/...`` so that the target leg passes
through it too. For the first ``cuts`` GET answers of each object it forwards only
``cut_after`` body bytes and then closes the connection: a genuinely dropped TCP stream,
which the client must resume with an HTTP Range request against the real cluster. With
``drop_range`` it strips Range headers (as a cluster serving an ETL's output would ignore
them); ``on_cut`` runs after each cut, before the client notices it. With ``stall_s``, a
cut body stops flowing for that long before the connection closes (a node that hangs
mid-body). ``busy`` maps path
prefixes to a number of requests the relay answers itself with 503 (a busy node) before
it forwards the rest.

Every request is recorded in ``log`` as (method, path, Range header, status, body bytes
sent), and its query string in ``queries`` (same index).
"""

from __future__ import annotations

import re
import socket
import socketserver
import struct
import threading
from urllib.parse import urlsplit

_TARGET_PREFIX = re.compile(r"^/_t/(\d+)(/.*)$")
_HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "host"}


class FaultyRelay:
    def __init__(self, upstream: str, cut_after: int, cuts: int = 1, object_filter: str = "/v1/objects/",
                 drop_range: bool = False, on_cut=None, busy: dict[str, int] | None = None,
                 stall_s: float = 0.0):
        parts = urlsplit(upstream)
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.upstream_port = parts.port or 80
        self.cut_after = cut_after
        self.cuts = cuts
        self.object_filter = object_filter
        self.drop_range = drop_range  # forward no Range header: the cluster answers the whole object
        self.on_cut = on_cut  # called with the object path after a body is cut, before the client sees it
        self.busy = dict(busy or {})  # path prefix -> 503 answers still to give
        self.stall_s = stall_s
        self._closing = threading.Event()
        self.log: list[tuple[str, str, str | None, int, int]] = []
        self.queries: list[str] = []
        self.cut_count: dict[str, int] = {}
        self._lock = threading.Lock()
        relay = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                relay._serve(self.request)

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()

    # -- one connection = one request (both legs use Connection: close)

    def _serve(self, client: socket.socket) -> None:
        reader = client.makefile("rb")
        request_line = reader.readline().decode("latin-1").rstrip("\r\n")
        if not request_line:
            return
        method, target, version = request_line.split(" ", 2)
        headers = []
        length = 0
        range_header = None
        while True:
            line = reader.readline().decode("latin-1").rstrip("\r\n")
            if not line:
                break
            name, _, value = line.partition(":")
            value = value.strip()
            if name.lower() == "content-length":
                length = int(value)
            if name.lower() == "range":
                range_header = value
            if name.lower() in _HOP_HEADERS or (self.drop_range and name.lower() == "range"):
                continue
            headers.append((name, value))
        body = reader.read(length) if length else b""

        if self._answer_busy(client, method, target, range_header):
            return
        port = self.upstream_port
        match = _TARGET_PREFIX.match(target)
        if match:
            port, target = int(match.group(1)), match.group(2)
        upstream = socket.create_connection((self.upstream_host, port), timeout=30)
        head = [f"{method} {target} {version}", f"Host: {self.upstream_host}:{port}", "Connection: close"]
        head += [f"{n}: {v}" for n, v in headers]
        upstream.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)

        up_reader = upstream.makefile("rb")
        status_line = up_reader.readline().decode("latin-1").rstrip("\r\n")
        status = int(status_line.split(" ", 2)[1])
        out = [status_line]
        while True:
            line = up_reader.readline().decode("latin-1").rstrip("\r\n")
            if not line:
                break
            name, _, value = line.partition(":")
            if name.lower() == "location":
                value = self._rewrite_location(value.strip())
            if name.lower() in ("connection", "keep-alive"):
                continue
            out.append(f"{name}: {value.strip()}")
        out.append("Connection: close")
        client.sendall(("\r\n".join(out) + "\r\n\r\n").encode("latin-1"))

        path, _, query = target.partition("?")
        limit = None
        if method == "GET" and status in (200, 206) and path.startswith(self.object_filter):
            with self._lock:
                done = self.cut_count.get(path, 0)
                if done < self.cuts:
                    self.cut_count[path] = done + 1
                    limit = self.cut_after
        sent = 0
        try:
            while True:
                chunk = up_reader.read1(65536) if limit is None else up_reader.read1(min(65536, limit - sent))
                if not chunk:
                    break
                client.sendall(chunk)
                sent += len(chunk)
                if limit is not None and sent >= limit:
                    # End the target's GET before on_cut: an open GET holds the object
                    # while the relay stops reading, and a PUT replacing it in on_cut would
                    # wait for it (stalls of 15-30 s seen in CI). A shutdown alone leaves
                    # the target writing into a full window; a close with linger 0 resets
                    # the connection, so the target's write fails at once. The client
                    # still sees the cut only after on_cut returns.
                    _reset(upstream, up_reader)
                    if self.on_cut is not None:
                        self.on_cut(path)
                    self._closing.wait(self.stall_s)  # a hung node: nothing more, for a while
                    break  # drop the connection mid-body
        except OSError:
            pass
        finally:
            with self._lock:
                self.log.append((method, path, range_header, status, sent))
                self.queries.append(query)
            upstream.close()
            try:
                client.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _answer_busy(self, client: socket.socket, method: str, target: str, range_header: str | None) -> bool:
        path, _, query = target.partition("?")
        with self._lock:
            prefix = next((p for p, n in self.busy.items() if n > 0 and path.startswith(p)), None)
            if prefix is None:
                return False
            self.busy[prefix] -= 1
            self.log.append((method, path, range_header, 503, 0))
            self.queries.append(query)
        body = b'{"message":"busy (relay)","status":503}'
        client.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        client.shutdown(socket.SHUT_RDWR)
        return True

    def _rewrite_location(self, location: str) -> str:
        parts = urlsplit(location)
        if parts.hostname in ("127.0.0.1", "localhost") and parts.port:
            rest = parts.path + (f"?{parts.query}" if parts.query else "")
            return f"{self.url}/_t/{parts.port}{rest}"
        return location


def _reset(sock: socket.socket, reader) -> None:
    """Close ``sock`` with an RST rather than a FIN (``reader`` holds a reference to it)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    reader.close()
    sock.close()
