"""The shard cache's ledger and files, as one process sees them (see :mod:`.layer`).

``ledger.sqlite`` (SQLite: one writer on the machine at a time, ``BEGIN IMMEDIATE``) holds
one row per URL: ``part`` (a download, the bytes reserved for it), ``done`` (a complete
entry: its size, the source's version, its mtime on disk, its CRC-32, its last read, when
it was last checked against its source, and until its bytes are synced to the disk the
boot they were written in: a machine that went down before that drops it) or
``seen`` (no copy; the time of its last read, so that it may come back only in place of
less recently read ones), and the counters. Files, named by a hash of the whole URL:
``<key>.part`` (a download), ``<key>.data`` (complete), ``<key>.lock`` (held by the
downloader while it runs). The ledger's own files count against the limit.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import logging
import os
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable

from ..limits import Limits
from ..shards import openers
from ..shards.files import (
    create_new,
    make_directory,
    open_existing,
    probe_alive,
    publish,
    release_lock,
    try_lock,
    unlink,
)
from ..storage.cloud_settings import object_identity
from .settings import CacheSettings
from .streams import (
    STATS,
    Download,
    LocalCopy,
    ReadAlong,
    add,
    own_download,
    tar_problem,
)

logger = logging.getLogger("wds_datapipes")

_BLOCK = 4096  # entries count in whole blocks: what a file takes on disk
_WAL_PAGES = 256  # the ledger's write-ahead log is checkpointed at this many pages, and cut back to 1 MB after
LEDGER_ROOM = 2 << 20  # kept off the limit for that log and its shared-memory index; the ledger's own file is counted
DISABLED: set[str] = set()  # directories that failed in this process: read from the source


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


BOOT = _boot_id()  # this boot of the machine (Linux), or None


def key_of(url: str) -> str:
    """The entry's name: a hash of the whole URL (every ``pipe:`` command, bucket and query its
    own), with an object store's endpoint where settings name one (``object_identity``)."""
    return hashlib.sha256(object_identity(url).encode("utf-8", "surrogateescape")).hexdigest()[:40]


def fault(directory: str, message: str, disable: bool = False) -> None:
    STATS.faults += 1
    if disable:
        DISABLED.add(directory)
    logger.warning("shard cache %s: %s; reading from the source", directory, message)


# ------------------------------------------------------------ the ledger


class Store:
    """One cache directory, seen from one process: its ledger, its files, its locks."""

    def __init__(self, settings: CacheSettings, create: bool = True):
        self.settings = settings
        self.dir = settings.directory
        make_directory(self.dir, create)  # CacheDirectoryError where it cannot be trusted
        self.db = sqlite3.connect(os.path.join(self.dir, "ledger.sqlite"), timeout=120, isolation_level=None,
                                  check_same_thread=False)
        self.lock = threading.RLock()  # one connection per process: its statements one at a time
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute(f"PRAGMA wal_autocheckpoint={_WAL_PAGES}")
        self.db.execute(f"PRAGMA journal_size_limit={1 << 20}")
        _until_unlocked(lambda: self.db.execute("PRAGMA journal_mode=WAL"))  # asks no busy handler: tried again
        with self.transaction() as db:  # one process makes the tables (or adds what an earlier version lacked)
            db.execute("CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, url TEXT, state TEXT, bytes INTEGER,"
                       " size INTEGER, version TEXT, mtime_ns INTEGER, crc INTEGER, used REAL, checked REAL,"
                       " unsynced TEXT)")
            db.execute("CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER)")
            columns = {row[1] for row in db.execute("PRAGMA table_info(entries)")}
            for name, kind in (("checked", "REAL"), ("unsynced", "TEXT")):
                if name not in columns:
                    db.execute(f"ALTER TABLE entries ADD COLUMN {name} {kind}")
        self.clean()

    def path(self, key: str, kind: str) -> str:
        return os.path.join(self.dir, f"{key}.{kind}")

    def transaction(self):
        return _Transaction(self)

    def one(self, query: str, *args) -> tuple | None:
        """The first row of a read (the connection is this process's: one statement at a time)."""
        with self.lock:
            return self.db.execute(query, args).fetchone()

    def rows(self, query: str, *args) -> list[tuple]:
        with self.lock:
            return self.db.execute(query, args).fetchall()

    # -- opening

    def held(self, url: str, limits: Limits, open_source: Callable, revalidate: bool = True,
             start: int = 0) -> LocalCopy | None:
        """The complete copy of ``url`` from byte ``start``, checked against the ledger and
        (unless not ``revalidate``) its source, held against eviction until closed; None where
        there is none."""
        key = key_of(url)
        row = self.one("SELECT state, size, version, mtime_ns, checked FROM entries WHERE key=?", key)
        if row is None or row[0] != "done":
            return None
        return self._hit(url, key, row, start, limits, open_source, revalidate)

    def open(self, url: str, start: int, limits: Limits, open_source: Callable) -> io.RawIOBase:
        key = key_of(url)
        for _ in range(200):  # a claim races a download that just ended: a few turns at most
            try:
                stream = self._try_open(url, key, start, limits, open_source)
            except (OSError, sqlite3.Error) as exn:  # the directory is gone, or the ledger broken: not again
                fault(self.dir, f"{type(exn).__name__}: {exn}",
                       disable=isinstance(exn, sqlite3.Error) or not os.path.isdir(self.dir))
                return open_source(url, start, limits)
            if stream is not None:
                return stream
            time.sleep(0.01)
        return self._uncached(url, key, start, limits, open_source)

    def _try_open(self, url, key, start, limits, open_source):
        copy = self.held(url, limits, open_source, start=start)
        if copy is not None:
            return copy
        lock = try_lock(self.path(key, "lock"))
        if lock is None:  # someone downloads it: read along, from where the part has got to
            return self._follow(url, key, start, limits, open_source)
        try:
            row = self.one("SELECT state FROM entries WHERE key=?", key)
            if row is not None and row[0] == "done" and os.path.exists(self.path(key, "data")):
                release_lock(self.path(key, "lock"), lock)
                return None  # it was completed in between: a hit on the next turn
            if start:  # a read from the middle is not cached: its first bytes are not read
                release_lock(self.path(key, "lock"), lock)
                return self._uncached(url, key, start, limits, open_source)
            return self._download(url, key, lock, limits, open_source)
        except BaseException:
            release_lock(self.path(key, "lock"), lock)
            raise

    def _hit(self, url, key, row, start, limits, open_source, revalidate: bool = True) -> LocalCopy | None:
        _, size, version, mtime_ns, checked = row
        after = self.settings.check_after
        now = time.time()
        ask = revalidate and after is not None and (checked is None or now - checked >= after)
        try:
            fd = open_existing(self.path(key, "data"))
        except FileNotFoundError:
            return None  # evicted, or being renamed into place
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # from here on no one evicts it
            info = os.fstat(fd)
            if info.st_nlink == 0:
                os.close(fd)
                return None  # evicted while this opened it
            if info.st_size != size or info.st_mtime_ns != mtime_ns:
                os.close(fd)
                fault(self.dir, f"the cached copy of {url!r} changed on disk ({info.st_size} bytes, "
                       f"{size} expected); it is fetched again")
                self._drop(key)
                return None
            same = self._same_at_source(url, size, version, limits) if ask else None
            if same is False:
                os.close(fd)
                logger.info("shard cache: %r changed at its source; fetching it again", url)
                self._drop(key)
                return None
        except BaseException:
            os.close(fd)
            raise
        with self.transaction() as db:
            db.execute("UPDATE entries SET used=?, checked=? WHERE key=?", (now, now if same else checked, key))
            add(db, hits=1)
        return LocalCopy(self, url, fd, start, size, version, limits, open_source)

    def _same_at_source(self, url, size, version, limits) -> bool | None:
        """Whether the source still has the object as cached; None where it cannot say (the copy is used)."""
        try:
            stamp = openers.source_stamp(url, limits)
        except Exception as exn:  # noqa: BLE001 - the source cannot say now: the copy is used
            logger.debug("shard cache: cannot ask the source of %r (%s); using the cached copy", url, exn)
            return None
        if stamp is None:
            return None
        now_size, now_version = stamp
        return (now_size is None or now_size == size) and (now_version is None or version is None
                                                           or now_version == version)

    def _follow(self, url, key, start, limits, open_source):
        if own_download(key):  # its bytes come only as this thread reads them elsewhere: from the source
            return self._uncached(url, key, start, limits, open_source)
        try:
            fd = open_existing(self.path(key, "part"))
        except FileNotFoundError:  # not made yet, or already renamed: ask again
            return None if probe_alive(self.path(key, "lock")) or os.path.exists(self.path(key, "data")) \
                else self._uncached(url, key, start, limits, open_source)
        fcntl.flock(fd, fcntl.LOCK_SH)
        if os.fstat(fd).st_size < start:  # the download has not reached it: from the source
            os.close(fd)
            return self._uncached(url, key, start, limits, open_source)
        self.count(read_along=1)
        row = self.one("SELECT size, version FROM entries WHERE key=? AND state='part'", key) or (None, None)
        return ReadAlong(self, url, key, fd, start, limits, open_source, *row)

    def _download(self, url, key, lock, limits, open_source) -> io.RawIOBase:
        part = self.path(key, "part")
        fd = create_new(part)  # made first: readers wait on it
        try:
            source = open_source(url, 0, limits)
        except BaseException:
            self.abandon(key, fd, lock)
            raise
        size, version = openers.stream_stamp(source, url)
        with self.transaction() as db:
            seen = db.execute("SELECT used FROM entries WHERE key=? AND state='seen'", (key,)).fetchone()
            reserved = self.reserve(db, key, url, _blocks(size) if size is not None else 64 << 20,
                                    seen[0] if seen else None)
            if reserved:  # what readers along it report of the object
                db.execute("UPDATE entries SET size=?, version=? WHERE key=?", (size, version, key))
            add(db, misses=1, uncached=0 if reserved else 1)
        if not reserved:
            self.abandon(key, fd, lock, seen=True)
            return source
        return Download(self, url, key, source, fd, lock, reserved, size, version, seen[0] if seen else None)

    def _uncached(self, url, key, start, limits, open_source):
        self.count(misses=1, uncached=1)
        return open_source(url, start, limits)

    # -- space

    def reserve(self, db, key: str, url: str, need: int, previous_use: float | None, held: int = 0) -> int:
        """Makes ``key`` a part of ``held + need`` bytes where the limit allows (evicting); 0 if not."""
        used = db.execute("SELECT COALESCE(SUM(bytes), 0) FROM entries WHERE state IN ('part', 'done')"
                          " AND key != ?", (key,)).fetchone()[0] + self.ledger_bytes()
        total = held + need
        if used + total > self.settings.limit:
            used -= self._make_room(db, used + total - self.settings.limit, previous_use)
        if used + total > self.settings.limit:
            db.execute("INSERT OR REPLACE INTO entries (key, url, state, bytes, used) VALUES (?, ?, 'seen', 0, ?)",
                       (key, url, time.time()))
            return 0
        db.execute("INSERT OR REPLACE INTO entries (key, url, state, bytes, used) VALUES (?, ?, 'part', ?, ?)",
                   (key, url, total, time.time()))
        return total

    def ledger_bytes(self) -> int:
        """What the ledger takes: its file, and room for its write-ahead log."""
        try:
            return LEDGER_ROOM + _blocks(os.stat(os.path.join(self.dir, "ledger.sqlite")).st_size)
        except FileNotFoundError:
            return LEDGER_ROOM

    def _make_room(self, db, wanted: int, previous_use: float | None) -> int:
        freed = 0
        for key, nbytes in db.execute("SELECT key, bytes FROM entries WHERE state='part'").fetchall():
            if not probe_alive(self.path(key, "lock")):  # its downloader died
                unlink(self.path(key, "part"))
                db.execute("DELETE FROM entries WHERE key=?", (key,))
                freed += nbytes
        rows = db.execute("SELECT key, bytes, used FROM entries WHERE state='done' ORDER BY used").fetchall()
        for key, nbytes, used in rows:
            if freed >= wanted or (previous_use is not None and used >= previous_use):
                break  # used since this shard's previous read: it stays, this one is streamed
            if self._evict(db, key):
                freed += nbytes
        return freed

    def _evict(self, db, key: str) -> bool:
        path = self.path(key, "data")
        try:
            fd = open_existing(path)
        except FileNotFoundError:
            db.execute("DELETE FROM entries WHERE key=?", (key,))
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(path)
        except BlockingIOError:
            return False  # a reader has it open
        finally:
            os.close(fd)
        # Kept as 'seen', with the time of its last read: it may come back only in place of less recent ones.
        db.execute("UPDATE entries SET state='seen', bytes=0 WHERE key=?", (key,))
        add(db, evictions=1)
        return True

    def _drop(self, key: str) -> None:
        """Removes a bad or stale complete entry (if no reader holds it; it is then not used again)."""
        with self.transaction() as db:
            if not self._evict(db, key):
                db.execute("DELETE FROM entries WHERE key=?", (key,))

    def abandon(self, key: str, fd: int, lock: int, seen: bool = False) -> None:
        """Ends a download that is not kept: its part, its reservation (a shard that did not fit
        keeps its 'seen' row, the time of its read), its lock."""
        os.close(fd)
        unlink(self.path(key, "part"))
        try:
            with self.transaction() as db:
                if not seen:
                    db.execute("DELETE FROM entries WHERE key=? AND state='part'", (key,))
        finally:
            release_lock(self.path(key, "lock"), lock)

    def complete(self, key: str, fd: int, lock: int, size: int, version: str | None, crc: int) -> None:
        """Makes a finished part a complete entry: the ledger says so, then the part is renamed
        (a reader that finds the entry before the rename reads the part along).

        Its bytes are then synced to the disk by a thread (~8 ms a file here, whatever its
        size: the reader goes on meanwhile; the process waits for it at exit); until then
        the ledger holds the boot they were written in, and a machine that went down before
        the sync drops the entry when the cache is next opened (:meth:`clean`)."""
        if BOOT is None:  # no boot to tell by: synced before the ledger calls it complete
            os.fdatasync(fd)
        mtime_ns = os.fstat(fd).st_mtime_ns
        now = time.time()
        with self.transaction() as db:
            db.execute("UPDATE entries SET state='done', bytes=?, size=?, version=?, mtime_ns=?, crc=?, used=?,"
                       " checked=?, unsynced=? WHERE key=?",
                       (_blocks(size), size, version, mtime_ns, crc, now, now, BOOT, key))
        publish(self.path(key, "part"), self.path(key, "data"))
        release_lock(self.path(key, "lock"), lock)
        if BOOT is None:
            os.close(fd)
            return
        try:
            threading.Thread(target=self._sync, args=(key, fd, mtime_ns), name="wds-cache-sync").start()
        except RuntimeError:  # no thread to be had: synced here
            self._sync(key, fd, mtime_ns)

    def _sync(self, key: str, fd: int, mtime_ns: int) -> None:
        """Syncs a complete entry's bytes to the disk, then says so in the ledger."""
        try:
            os.fdatasync(fd)
            with self.transaction() as db:
                db.execute("UPDATE entries SET unsynced=NULL WHERE key=? AND mtime_ns=?", (key, mtime_ns))
        except (OSError, sqlite3.Error) as exn:  # it stays unsynced: dropped only if the machine goes down
            logger.debug("shard cache: syncing %s: %s", key, exn)
        finally:
            os.close(fd)

    def count(self, **deltas: int) -> None:
        """Adds to the counters, this process's and the ledger's."""
        if any(deltas.values()):
            try:
                with self.transaction() as db:
                    add(db, **deltas)
            except sqlite3.Error as exn:
                logger.debug("shard cache: counting: %s", exn)

    def fault(self, message: str) -> None:
        fault(self.dir, message)

    def drop(self, url: str) -> None:
        self._drop(key_of(url))

    def clean(self) -> None:
        """Removes what crashed downloads left (parts whose lock no one holds), files the ledger
        lost, and complete entries whose bytes were not synced before the machine went down."""
        with self.transaction() as db:
            known = {}
            for key, state, unsynced in db.execute("SELECT key, state, unsynced FROM entries").fetchall():
                if state == "part" and not probe_alive(self.path(key, "lock")):
                    db.execute("DELETE FROM entries WHERE key=?", (key,))
                    continue
                if state == "done" and not os.path.exists(self.path(key, "data")):
                    db.execute("DELETE FROM entries WHERE key=?", (key,))
                    continue
                if state == "done" and unsynced is not None and unsynced != BOOT:  # its file goes below
                    logger.info("shard cache %s: dropping %s: the machine went down before its bytes were synced",
                                self.dir, key)
                    continue
                known[key] = state
            for name in os.listdir(self.dir):
                key, _, kind = name.partition(".")
                if kind == "part" and known.get(key) != "part" and not probe_alive(self.path(key, "lock")):
                    unlink(os.path.join(self.dir, name))
                elif kind == "data" and known.get(key) != "done":
                    self._evict(db, key)


class _Transaction:
    """``BEGIN IMMEDIATE`` .. ``COMMIT`` on the store's connection: one writer on the machine at a time."""

    def __init__(self, store: Store):
        self.store = store

    def __enter__(self) -> sqlite3.Connection:
        self.store.lock.acquire()
        try:
            self.store.db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self.store.lock.release()
            raise
        return self.store.db

    def __exit__(self, kind, value, tb) -> None:
        try:
            self.store.db.execute("COMMIT" if kind is None else "ROLLBACK")
        finally:
            self.store.lock.release()


def _until_unlocked(statement: Callable[[], object], patience: float = 120.0) -> None:
    """Runs ``statement`` again while another connection holds the ledger locked (at most ``patience`` s)."""
    deadline = time.monotonic() + patience
    while True:
        try:
            statement()
            return
        except sqlite3.OperationalError as exn:
            if ("locked" not in str(exn) and "busy" not in str(exn)) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _blocks(size: int) -> int:
    return -(-size // _BLOCK) * _BLOCK


def verify(store: Store, repair: bool = True) -> list[str]:
    """Checks every complete entry's size, mtime, CRC-32 and that it is a whole tar; returns
    what is wrong (and, with ``repair``, removes those entries)."""
    problems = []
    rows = store.rows("SELECT key, url, size, mtime_ns, crc FROM entries WHERE state='done'")
    for key, url, size, mtime_ns, crc in rows:
        problem = None
        try:
            fd = open_existing(store.path(key, "data"))
        except OSError as exn:
            problem = f"{url}: {type(exn).__name__}: {exn}"
        else:
            try:
                info = os.fstat(fd)
                got = 0
                with os.fdopen(os.dup(fd), "rb") as f:
                    while chunk := f.read(1 << 20):
                        got = zlib.crc32(chunk, got)
                if (info.st_size, info.st_mtime_ns, got) != (size, mtime_ns, crc):
                    problem = (f"{url}: the cached copy differs from what was downloaded ({info.st_size} bytes, "
                               f"{size} expected; CRC-32 {got:08x}, {crc:08x} expected)")
                elif (why := tar_problem(fd, url)) is not None:
                    problem = f"{url}: the cached copy is not a whole tar: {why}"
            except OSError as exn:
                problem = f"{url}: {type(exn).__name__}: {exn}"
            finally:
                os.close(fd)
        if problem is None:
            continue
        problems.append(problem)
        if repair:
            store._drop(key)
    return problems
