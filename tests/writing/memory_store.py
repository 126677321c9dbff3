"""In-memory stores the writer's tests register as back ends: ``MemoryStore`` (open, stamp, put,
with failures on demand: ``memtest://`` in test_write_to_storage) and ``ListingStore`` (a glob
list beside them, no delete: ``memlist://``, the ``store`` fixture of conftest.py)."""

from __future__ import annotations

import fnmatch
import io
import os
import threading
import time


class MemoryStore:
    """Objects in a dict; ``put`` stores a whole file or raises (``fail[name]`` times)."""

    def __init__(self):
        self.objects: dict[str, bytes] = {}
        self.puts: list[str] = []
        self.fail: dict[str, int] = {}
        self.slow = 0.0
        self.spool_seen: list[int] = []
        self.spool: str | None = None
        self.lock = threading.Lock()

    def open(self, url: str, start: int = 0):
        if url not in self.objects:
            raise FileNotFoundError(f"{url} does not exist")
        stream = io.BytesIO(self.objects[url][start:])
        stream.size, stream.version = len(self.objects[url]), str(hash(self.objects[url]))
        return stream

    def stamp(self, url: str, limits=None):
        if url not in self.objects:
            raise FileNotFoundError(f"{url} does not exist")
        return len(self.objects[url]), str(hash(self.objects[url]))

    def put(self, path: str, url: str, limits=None):
        name = url.rsplit("/", 1)[-1]
        if self.spool is not None and name.endswith(".tar"):
            self.spool_seen.append(sum(n.endswith((".tar", ".part")) for _, _, names in os.walk(self.spool)
                                       for n in names))
        time.sleep(self.slow)
        with self.lock:
            if self.fail.get(name, 0) > 0:
                self.fail[name] -= 1
                raise ConnectionResetError(f"reset while uploading {name}")
            with open(path, "rb") as stream:
                self.objects[url] = stream.read()
            self.puts.append(name)
        return str(hash(self.objects[url]))


class ListingStore(MemoryStore):
    """test_write_to_storage's in-memory store (open, stamp, put), with a list of the URLs a glob matches."""

    def list(self, spec: str, limits=None):
        return iter(sorted(url for url in self.objects if fnmatch.fnmatchcase(url, str(spec))))

    def shards(self) -> list[str]:
        return sorted(url.rsplit("/", 1)[1] for url in self.objects if url.endswith(".tar"))
