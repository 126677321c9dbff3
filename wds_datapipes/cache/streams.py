"""The streams the shard cache hands to readers, its locks and its counters (see :mod:`.layer`).

- :class:`Download`: the source's bytes as they arrive, written to the part file on the way;
  the entry is complete only once the whole object has passed (a reader that stops early
  leaves the rest to a thread).
- :class:`ReadAlong`: a part another process is downloading, read as it grows.
- :class:`LocalCopy`: a complete entry, read by ``pread`` from any byte (also handed to
  readers by member places, which ``pread`` it themselves).

Each goes on from the source at the byte it reached where the cache fails under it (a
short or failed read, a download that died): nothing lost, nothing read twice.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ShardReadError, WdsError
from ..limits import Limits
from ..shards import openers
from ..shards.files import probe_alive
from ..tar import iter_tar_members
from ..tar.blocks import CHUNK
from ..tar.headers import BLOCK
from ..tar.sources import compression

logger = logging.getLogger("wds_datapipes")

_DRAIN_NOW = 1 << 20  # at close, up to this much of the rest is read at once; more, by a thread
_GROW = 64 << 20  # bytes reserved at a time where the size is not known (pipe:)


@dataclass
class CacheStats:
    """What the cache did: shards opened (``hits`` from a complete copy, ``read_along`` from a
    download in progress, ``misses`` from the source, ``uncached`` of them not kept: too large
    for the limit, read from the middle, or the cache failed), bytes read from the source and
    from disk, entries evicted, faults (each warned about)."""

    hits: int = 0
    read_along: int = 0
    misses: int = 0
    uncached: int = 0
    source_bytes: int = 0
    disk_bytes: int = 0
    evictions: int = 0
    faults: int = 0


STATS = CacheStats()  # this process's
DOWNLOADS: dict[str, Download] = {}  # this process's downloads in progress, by key


def own_download(key: str) -> bool:
    """Whether the download of ``key`` is fed by this very thread: reading along it here would
    wait for bytes only this thread's other reader can fetch (two lanes of one share in one shard)."""
    download = DOWNLOADS.get(key)
    return download is not None and download.owner == (os.getpid(), threading.get_ident())


def add(db, **deltas: int) -> None:
    """Adds to this process's counters, and to the ledger's in ``db``'s open transaction."""
    for name, n in deltas.items():
        setattr(STATS, name, getattr(STATS, name) + n)
    db.executemany("INSERT INTO counters VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value=value+?",
                   [(name, n, n) for name, n in deltas.items() if n])


def tar_problem(fd: int, url: str) -> str | None:
    """What keeps the bytes of the file at ``fd`` from being a whole tar shard (a cut, no
    end-of-archive block, an HTML error page, a gzip member's bad CRC), or None: its headers
    are walked (plain tars seek over the members' bytes; compressed ones are inflated)."""
    # A plain tar is read a header at a time (the default 1 MiB chunk would read nearly every
    # byte of 100 KB members: 56 -> 40 ms on a 100 MB shard of 2,000 members, page cache warm).
    compressed = compression(os.pread(fd, BLOCK, 0)) is not None
    try:
        for _ in iter_tar_members(_Pread(fd), url, CHUNK if compressed else 8 * BLOCK, skip_data=lambda name: True):
            pass
    except WdsError as exn:
        return str(exn)
    size = os.fstat(fd).st_size
    if not compressed and (size < 2 * BLOCK or any(os.pread(fd, 2 * BLOCK, size - 2 * BLOCK))):
        # The walk stops at the first zero block; a whole tar ends in two (and zero padding).
        return "it ends without the end-of-archive's two zero blocks"
    return None


class _Pread(io.RawIOBase):
    """The file at ``fd`` as a seekable stream from byte 0, read by ``pread`` (the fd's own offset untouched)."""

    def __init__(self, fd: int):
        super().__init__()
        self.fd, self.pos = fd, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = os.preadv(self.fd, [buffer], self.pos)
        self.pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: os.fstat(self.fd).st_size}[whence] + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def fileno(self) -> int:
        return self.fd


class _CacheStream(io.RawIOBase):
    """What the three share: a position, a fall back to the source from it, counters at close."""

    size: int | None = None  # the whole object's, where known: the source is checked to still be it
    version: str | None = None

    def __init__(self, store, url: str, start: int, limits: Limits, open_source: Callable):
        super().__init__()
        self.store, self.url, self.pos, self.limits, self.open_source = store, url, start, limits, open_source
        self.source = None  # the source, once the cache failed under this reader
        self.counts = {"disk_bytes": 0, "source_bytes": 0}

    def readable(self) -> bool:
        return True

    def _from_source(self, buffer, why: str | None) -> int:
        if self.source is None:
            if why:
                self.store.fault(f"{why}; {self.url!r} goes on from its source at byte {self.pos}")
            self._drop_local()
            self.source = self._same_source(self.open_source(self.url, self.pos, self.limits))
        n = self.source.readinto(buffer) or 0
        self.pos += n
        self.counts["source_bytes"] += n
        return n

    def _same_source(self, source):
        """``source``, checked to be the object whose first bytes this reader had from the cache
        (its size and version, where both sides tell them): never a changed object's rest."""
        size, version = openers.stream_stamp(source, self.url)
        if (None not in (size, self.size) and size != self.size) or \
                (None not in (version, self.version) and version != self.version):
            source.close()
            raise ShardReadError(self.url, None, self.pos, f"its cached copy failed under the read and the source "
                                 f"has changed since it was cached ({size} bytes, version {version!r}; "
                                 f"{self.size} bytes, version {self.version!r} cached)")
        return source

    def _drop_local(self) -> None:
        pass

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._drop_local()
            if self.source is not None:
                self.source.close()
        finally:
            super().close()
            self.store.count(**self.counts)


class LocalCopy(_CacheStream):
    """A complete entry, held with a shared ``flock`` (no eviction) until closed."""

    def __init__(self, store, url: str, fd: int, start: int, size: int, version: str | None, limits: Limits,
                 open_source: Callable):
        super().__init__(store, url, start, limits, open_source)
        self.fd: int | None = fd
        self.size, self.version = size, version  # the source's, when it was downloaded
        self.headers = {"Content-Length": str(size)}  # stream_size reads it (no fileno: not the shard's file)

    def pread(self, size: int, offset: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` (fewer only at the end), as ``os.pread`` gives
        them; from the source where the copy fails under the read."""
        if self.fd is not None:
            try:
                data = os.pread(self.fd, size, offset)
            except OSError as exn:
                why = f"reading the cached copy failed ({type(exn).__name__}: {exn})"
            else:
                if len(data) == min(size, max(0, self.size - offset)):
                    self.counts["disk_bytes"] += len(data)
                    return data
                why = f"the cached copy ends at byte {offset + len(data)} of {self.size}"
            self._drop_local()  # its shared lock released first, or the entry could not be evicted
            self.store.drop(self.url)
            self.store.fault(f"{why}; {self.url!r} is read from its source")
        if self.source is not None and self.pos != offset:  # not where the source stream is: open it there
            self.source.close()
            self.source = None
        self.pos = offset
        buffer = bytearray(size)
        got = 0
        while got < size and (n := self._from_source(memoryview(buffer)[got:], None)):
            got += n
        return bytes(buffer[:got])

    def readinto(self, buffer) -> int:
        if self.fd is None:
            return self._from_source(buffer, None)
        view = memoryview(buffer).cast("B")
        want = min(len(view), self.size - self.pos)
        if want <= 0:
            return 0
        try:
            n = os.preadv(self.fd, [view[:want]], self.pos)
        except OSError as exn:
            return self._from_source(buffer, f"reading the cached copy failed ({type(exn).__name__}: {exn})")
        if n == 0:
            self._drop_local()  # its shared lock released first, or the entry could not be evicted
            self.store.drop(self.url)
            return self._from_source(buffer, f"the cached copy ends at byte {self.pos} of {self.size}")
        self.pos += n
        self.counts["disk_bytes"] += n
        return n

    def seekable(self) -> bool:
        return self.fd is not None

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence] + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def _drop_local(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class ReadAlong(_CacheStream):
    """A part another process is downloading, read as it grows; from the source if that one dies."""

    def __init__(self, store, url: str, key: str, fd: int, start: int, limits: Limits, open_source: Callable,
                 size: int | None = None, version: str | None = None):
        super().__init__(store, url, start, limits, open_source)
        self.key, self.fd = key, fd
        self.size, self.version = size, version  # the object's, as its downloader's source said them
        self.patience = max(60.0, 2 * (limits.http_timeout or 60.0))  # a download writing nothing this long died

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        wait, since = 0.0005, time.monotonic()
        while self.fd is not None:
            n = os.preadv(self.fd, [view], self.pos)
            if n:
                self.pos += n
                self.counts["disk_bytes"] += n
                return n
            state = self._state()
            if state == "done":
                return 0
            if state == "gone":
                return self._from_source(buffer, None)  # its downloader stopped: no cache fault
            if time.monotonic() - since > self.patience:
                return self._from_source(buffer, f"the download in another process wrote nothing for "
                                                 f"{self.patience:g} s")
            time.sleep(wait)
            wait = min(wait * 2, 0.02)
        return self._from_source(buffer, None)

    def _state(self) -> str:
        for _ in range(2):  # before and after asking for the lock: the rename comes before its release
            try:
                if os.stat(self.store.path(self.key, "data")).st_ino == os.fstat(self.fd).st_ino:
                    return "done"
            except FileNotFoundError:
                pass
            if probe_alive(self.store.path(self.key, "lock")):
                try:  # a new download replaced the part this one followed (its downloader died): not ours
                    ours = os.stat(self.store.path(self.key, "part"), follow_symlinks=False).st_ino == \
                        os.fstat(self.fd).st_ino
                except FileNotFoundError:
                    continue  # renamed in between: asked again
                return "running" if ours else "gone"
        return "gone"

    def _drop_local(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Download(_CacheStream):
    """The source's bytes, each written to the part file as it passes; complete once all passed.

    A write that fails (disk full, the directory gone) or a shard that outgrows the limit
    ends the caching with a warning; the reader goes on reading the source.
    """

    def __init__(self, store, url: str, key: str, source, fd: int, lock: int, reserved: int, size: int | None,
                 version: str | None, previous_use: float | None):
        super().__init__(store, url, 0, None, None)
        self.key, self.source, self.fd, self.lock = key, source, fd, lock
        self.reserved, self.size, self.version, self.previous_use = reserved, size, version, previous_use
        self.crc, self.written, self.eof = 0, 0, False
        self.owner: tuple[int, int] | None = (os.getpid(), threading.get_ident())  # the thread that reads it
        DOWNLOADS[key] = self

    @property
    def headers(self):
        return getattr(self.source, "headers", None)

    def fileno(self) -> int:
        return self.source.fileno()  # a local source's (a shard on NFS): its size and stamp are the shard's

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        readinto = getattr(self.source, "readinto", None)
        try:
            if readinto is not None:
                n = readinto(view) or 0
            else:
                data = self.source.read(len(view))
                n = len(data)
                view[:n] = data
        except BaseException:  # a source that failed under the read: what it sent is never kept
            self._abandon(None)
            self.eof = True  # nothing more is asked of it
            raise
        self.counts["source_bytes"] += n
        if n == 0:
            self.eof = True
        elif self.fd is not None:
            self._keep(view[:n])
        self.pos += n
        return n

    def _keep(self, data: memoryview) -> None:
        try:
            if self.written + len(data) > self.reserved:
                with self.store.transaction() as db:
                    more = self.store.reserve(db, self.key, self.url, max(len(data), _GROW), self.previous_use,
                                              held=self.reserved)
                if not more:
                    self._abandon(None, seen=True)
                    return
                self.reserved = more
            done = 0
            while done < len(data):
                done += os.write(self.fd, data[done:])
            self.crc = zlib.crc32(data, self.crc)
            self.written += len(data)
        except OSError as exn:
            self._abandon(f"writing the cached copy failed ({type(exn).__name__}: {exn})")

    def _abandon(self, why: str | None, seen: bool = False) -> None:
        fd, self.fd = self.fd, None
        if fd is None:
            return
        self._forget()
        if why:
            self.store.fault(f"{why}; {self.url!r} is read from its source, uncached")
        self.counts["uncached"] = 1
        try:
            self.store.abandon(self.key, fd, self.lock, seen=seen)
        except Exception as exn:  # noqa: BLE001 - the reader goes on; a stale part is cleaned up later
            logger.debug("shard cache: abandoning %r: %s", self.url, exn)

    def close(self) -> None:
        if self.closed:
            return
        done_early = not self.eof  # the reader stopped before the end: the rest is the cache's business
        try:
            if self.fd is not None and not self.eof:
                self._drain(_DRAIN_NOW)
                if not self.eof and self.fd is not None:  # the rest by a thread: the reader goes on now
                    threading.Thread(target=self._finish_later, name="wds-cache-drain", daemon=True).start()
                    io.RawIOBase.close(self)
                    return
            self.source.close()  # a pipe: command's exit status is checked here
        except BaseException as exn:
            self._abandon(None)
            with contextlib.suppress(Exception):
                self.source.close()
            io.RawIOBase.close(self)
            self.store.count(**self.counts)
            if done_early and isinstance(exn, Exception):  # as without the cache: not the reader's error
                logger.warning("shard cache: the rest of %r failed after its reader was done (%s: %s); "
                               "it is not cached", self.url, type(exn).__name__, exn)
                return
            raise
        self._commit()
        io.RawIOBase.close(self)
        self.store.count(**self.counts)

    def _drain(self, most: float) -> None:
        buffer = bytearray(1 << 20)
        passed = 0
        while self.fd is not None and not self.eof and passed < most:
            passed += self.readinto(buffer)

    def _forget(self) -> None:
        if DOWNLOADS.get(self.key) is self:
            del DOWNLOADS[self.key]

    def _finish_later(self) -> None:
        self.owner = None  # fed by this thread now: anyone may read along
        try:
            self._drain(float("inf"))
            self.source.close()
            self._commit()
        except Exception as exn:  # noqa: BLE001 - the reader is gone; the entry is not kept
            logger.warning("shard cache: finishing the download of %r failed (%s: %s); it is not cached",
                           self.url, type(exn).__name__, exn)
            self._abandon(None)
        finally:
            self.store.count(**self.counts)

    def _commit(self) -> None:
        if self.fd is None:
            return
        if self.size is not None and self.written != self.size:
            self._abandon(f"the source sent {self.written} bytes of {self.size}")
            return
        if getattr(self.source, "succeeded", True) is False:  # a pipe: command that did not exit 0
            self._abandon("its source did not say the read succeeded")
            return
        problem = tar_problem(self.fd, self.url)
        if problem is not None:  # an error page, a body cut where nothing could tell
            self._abandon(f"its bytes are not a whole tar ({problem})")
            return
        try:
            self.store.complete(self.key, self.fd, self.lock, self.written, self.version, self.crc)
        except Exception as exn:  # noqa: BLE001
            self._abandon(f"keeping the cached copy failed ({type(exn).__name__}: {exn})")
        else:
            self.fd = None
            self._forget()
