"""An HTTP server of the shards in a folder, for the cache's tests and benchmark: it counts
what it is asked and sends (GETs and HEADs per object, bytes), answers HEAD and Range
requests with an ETag, and sends at most ``rate`` bytes per second per connection (0: as
fast as it can)."""

from __future__ import annotations

import collections
import http.server
import os
import threading
import time


class ShardServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, folder: str, rate: float = 0):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.folder, self.rate = folder, rate
        self.gets: collections.Counter[str] = collections.Counter()
        self.heads: collections.Counter[str] = collections.Counter()
        self.sent = 0
        self.counting = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/{name}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _object(self) -> tuple[str, os.stat_result] | None:
        path = os.path.join(self.server.folder, self.path.lstrip("/"))
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
