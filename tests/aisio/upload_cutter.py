"""A relay on 127.0.0.1 in front of an AIStore cluster that cuts object uploads half-way.

Clients talk to :class:`UploadCutter` as if it were the cluster. AIStore redirects an object
PUT from its proxy to a target (``307 Location: http://127.0.0.1:TPORT/...``); the relay
rewrites those redirects to ``http://127.0.0.1:RELAY/_t/TPORT/...`` so the upload itself
passes through it. The first ``cuts`` PUTs to a target whose path starts with ``prefix``
get half their body forwarded, then a reset on both connections: an upload lost in the
middle, as the target sees it. Everything else is relayed whole, one request per
connection. ``cut`` lists the paths of the uploads cut.
"""

from __future__ import annotations

import re
import socket
import socketserver
import struct
import threading
from urllib.parse import urlsplit

_TARGET = re.compile(r"^/_t/(\d+)(/.*)$")
_HOP = {"connection", "keep-alive", "proxy-connection", "host", "expect"}


class UploadCutter:
    def __init__(self, upstream: str, cuts: int, prefix: str):
        parts = urlsplit(upstream)
        self.host, self.port_up = parts.hostname or "127.0.0.1", parts.port or 80
        self.cuts, self.prefix = cuts, prefix
        self.cut: list[str] = []
        self._lock = threading.Lock()
        relay = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                relay._serve(self.request)

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _serve(self, client: socket.socket) -> None:
        reader = client.makefile("rb")
        method, target, version = reader.readline().decode("latin-1").rstrip("\r\n").split(" ", 2)
        headers, length = [], 0
        while line := reader.readline().decode("latin-1").rstrip("\r\n"):
            name, _, value = line.partition(":")
            if name.lower() == "content-length":
                length = int(value.strip())
            if name.lower() not in _HOP:
                headers.append(f"{name}: {value.strip()}")
        body = reader.read(length) if length else b""
        port, match = self.port_up, _TARGET.match(target)
        if match:
            port, target = int(match.group(1)), match.group(2)
        upstream = socket.create_connection((self.host, port), timeout=30)
        head = "\r\n".join([f"{method} {target} {version}", f"Host: {self.host}:{port}", "Connection: close",
                            *headers]).encode("latin-1") + b"\r\n\r\n"
        if match and method == "PUT" and target.startswith(self.prefix) and self._take_cut(target):
            upstream.sendall(head + body[: len(body) // 2])
            for sock in (upstream, client):  # a reset (linger 0), not a clean close
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            upstream.close()
            return
        upstream.sendall(head + body)
        answer = upstream.makefile("rb")
        out = [answer.readline().decode("latin-1").rstrip("\r\n")]
        while line := answer.readline().decode("latin-1").rstrip("\r\n"):
            name, _, value = line.partition(":")
            if name.lower() in ("connection", "keep-alive"):
                continue
            if name.lower() == "location":
                value = self._rewrite(value.strip())
            out.append(f"{name}: {value.strip()}")
        client.sendall(("\r\n".join([*out, "Connection: close"]) + "\r\n\r\n").encode("latin-1"))
        while chunk := answer.read1(65536):
            client.sendall(chunk)
        upstream.close()

    def _take_cut(self, target: str) -> bool:
        with self._lock:
            if self.cuts <= 0:
                return False
            self.cuts -= 1
            self.cut.append(target.partition("?")[0])
            return True

    def _rewrite(self, location: str) -> str:
        parts = urlsplit(location)
        if parts.hostname in ("127.0.0.1", "localhost") and parts.port:
            return f"{self.url}/_t/{parts.port}{parts.path}" + (f"?{parts.query}" if parts.query else "")
        return location
