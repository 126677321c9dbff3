"""A local shard cache with a size limit: a remote shard is read once per machine, not once per epoch.

Off by default. :func:`set_cache` (or ``WDS_CACHE_DIR`` and ``WDS_CACHE_LIMIT``, which
``set_cache`` also sets, so that spawned DataLoader workers find it) turns it on for every
reader of the process: ``load_tar``, ``ExactEpochs``, ``index``. It sits between the
openers and the readers (:func:`~wds_datapipes.shards.openers.set_stream_layer`), so every
scheme gets it. This module turns it on and is that layer; :mod:`.settings` the
settings, :mod:`.store` the ledger, :mod:`~wds_datapipes.shards.files` the directory, files
and locks, :mod:`.streams` what a reader is handed.

- A first read streams to the reader while it is written to ``<key>.part`` (the key: a
  hash of the whole URL); a second reader of a shard being downloaded reads along. At the
  end the part is renamed ``<key>.data``: a half-written file is never complete, and a
  read the source did not call a success, or whose bytes are not a whole tar, is not kept.
- The directory must be the user's own, writable by no one else; no file in it is
  followed through a link (:mod:`~wds_datapipes.shards.files`).
- One download per shard and machine: the downloader holds ``flock`` on ``<key>.lock``
  (the kernel drops it when a process dies: its part is then stale, and cleaned up).
- The limit holds at every moment: bytes are reserved in the ledger (SQLite, in the cache
  directory) before they are written, making room by evicting least recently used
  complete shards that no reader holds (readers hold ``flock`` shared on them). A shard
  evicts only shards used less recently than its own previous read, so a dataset larger
  than the limit keeps the part that fits instead of churning; what does not fit is
  streamed from the source, uncached.
- A hit is checked against the source where it can tell (size, and ETag/version by a HEAD
  request; size and mtime for files): a changed object is fetched again.
- Faults in the cache (disk full, read-only or vanished directory, a corrupted entry) warn
  once and the read goes on from the source.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import logging
import os
import sqlite3
import threading
from collections.abc import Callable

from ..errors import CacheDirectoryError
from ..limits import Limits, get_limits
from ..shards import openers
from ..shards.files import make_directory
from ..stats.recorder import register_counters
from .settings import CacheSettings, parse_size
from .store import DISABLED, Store, fault, verify
from .streams import (
    STATS,
    CacheStats,
)

__all__ = ["CacheSettings", "CacheStats", "cache_stats", "cached_copy", "get_cache", "parse_size", "set_cache",
           "verify_cache"]

logger = logging.getLogger("wds_datapipes")

DIR_ENV, LIMIT_ENV, LOCAL_ENV, REVALIDATE_ENV = "WDS_CACHE_DIR", "WDS_CACHE_LIMIT", "WDS_CACHE_LOCAL", "WDS_CACHE_REVALIDATE"
_NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "beegfs", "gpfs", "ceph", "glusterfs", "9p",
               "afs", "davfs", "sshfs", "fuse")  # "fuse" covers fuse.s3fs, fuse.gcsfuse, fuse.sshfs, ...
_BLOCK = 4096  # entries count in whole blocks: what a file takes on disk


_settings: CacheSettings | None = None
_settings_read = False  # the environment is read at the first use, so spawned workers see what set_cache put there
_stores: dict[tuple[int, str], Store] = {}


def set_cache(directory: str | os.PathLike | None, limit: str | int = "100GB", *, local: str = "network",
              revalidate: bool | float = True) -> CacheSettings | None:
    """Cache remote shards in ``directory``, taking at most ``limit`` (``"200GB"``), from now on
    in this process and in the processes it starts (DataLoader workers, fork or spawn);
    ``None`` turns the cache off. Returns the previous settings. The directory must be the
    user's own and writable by no one else (one made here is ``0700``): a directory that
    exists and is not raises :class:`~wds_datapipes.errors.CacheDirectoryError` here (in a
    worker that reads the setting from the environment, the cache warns and stays off).

    Example:
        >>> wd.set_cache("/local/ssd/shards", "200GB")
    """
    global _settings, _settings_read
    previous = get_cache()
    if directory is None:
        _settings = None
        for name in (DIR_ENV, LIMIT_ENV, LOCAL_ENV, REVALIDATE_ENV):
            os.environ.pop(name, None)
    else:
        settings = CacheSettings(os.path.abspath(os.fspath(directory)), parse_size(limit), local, revalidate)
        if os.path.lexists(settings.directory):  # one someone else made or opened up: CacheDirectoryError now
            make_directory(settings.directory, create=False)
        _settings = settings
        os.environ.update({DIR_ENV: _settings.directory, LIMIT_ENV: str(_settings.limit), LOCAL_ENV: local,
                           REVALIDATE_ENV: _revalidate_text(revalidate)})
    _settings_read = True
    DISABLED.clear()
    _stores.clear()  # not closed here: a thread may still sync or finish a download through one
    return previous


def get_cache() -> CacheSettings | None:
    """The process's cache settings (from :func:`set_cache` or the environment), or None when off."""
    global _settings, _settings_read
    if not _settings_read:
        _settings_read = True
        directory = os.environ.get(DIR_ENV)
        if directory:
            _settings = CacheSettings(os.path.abspath(directory), parse_size(os.environ.get(LIMIT_ENV, "100GB")),
                                      os.environ.get(LOCAL_ENV, "network"),
                                      _revalidate_of(os.environ.get(REVALIDATE_ENV, "1")))
    return _settings


def _revalidate_text(revalidate: bool | float) -> str:
    return ("1" if revalidate else "0") if isinstance(revalidate, bool) else f"{float(revalidate)!r}s"


def _revalidate_of(text: str) -> bool | float:
    """``WDS_CACHE_REVALIDATE``: 1/true/yes, 0/false/no, or seconds (``"300"``, ``"300s"``)."""
    word = text.strip().lower()
    if word in ("1", "true", "yes", ""):
        return True
    if word in ("0", "false", "no"):
        return False
    try:
        return float(word.removesuffix("s"))
    except ValueError:
        raise ValueError(f"{REVALIDATE_ENV}={text!r}: say 1, 0 or a number of seconds") from None


def cache_stats(shared: bool = False) -> CacheStats:
    """This process's counters (a copy); ``shared=True``: every process's, from the ledger, since
    the cache directory was made."""
    if not shared:
        return dataclasses.replace(STATS)
    settings = get_cache()
    if settings is None:
        return CacheStats()
    rows = dict(_store(settings).rows("SELECT name, value FROM counters"))
    return CacheStats(**{f.name: rows.get(f.name, 0) for f in dataclasses.fields(CacheStats)})


def log_cache_stats(what: str = "epoch") -> None:
    """Logs this process's counters (INFO), where the cache is on."""
    if get_cache() is not None:
        logger.info("shard cache, this %s's process so far: %s", what, STATS)


def keeps(url: str) -> bool:
    """Whether the cache is on and keeps ``url`` (any URL but a local file, which only where
    :attr:`CacheSettings.local` says so)."""
    settings = get_cache()
    return settings is not None and settings.directory not in DISABLED and _cacheable(url, settings)


def cached_copy(url: str, limits: Limits | None = None, revalidate: bool = True):
    """The complete cached copy of ``url``, checked as an opening's is (``revalidate=False``:
    not against its source), held against eviction until it is closed; None where the cache
    is off, does not keep ``url``, or holds no complete copy of it. Nothing is downloaded.

    Readers by member places ``pread`` it (:meth:`~.streams.LocalCopy.pread`: from
    the source where the copy fails under a read); its ``size`` and ``version`` are the
    source's when it was downloaded."""
    if not keeps(url):
        return None
    settings = get_cache()
    try:
        return _store(settings).held(url, limits or get_limits(), openers.open_source, revalidate)
    except (OSError, sqlite3.Error, CacheDirectoryError) as exn:
        fault(settings.directory, f"the cache directory cannot be used ({type(exn).__name__}: {exn})", disable=True)
        return None


# ------------------------------------------------------------ the layer over open_shard


def _cached_open(url: str, start: int, limits: Limits | None, open_source: Callable) -> io.RawIOBase:
    settings = get_cache()
    if settings is None or not _cacheable(url, settings) or settings.directory in DISABLED:
        return open_source(url, start, limits)
    try:
        store = _store(settings)
    except (OSError, sqlite3.Error, CacheDirectoryError) as exn:
        fault(settings.directory, f"the cache directory cannot be used ({type(exn).__name__}: {exn})", disable=True)
        return open_source(url, start, limits)
    return store.open(url, start, limits or get_limits(), open_source)  # the URL as given: it may carry settings


def _store(settings: CacheSettings, create: bool = True) -> Store:
    key = (os.getpid(), settings.directory)  # a forked worker opens its own connection
    store = _stores.get(key)
    if store is None or store.settings != settings:
        with _making:  # one per process, however many threads open their first shard at once
            store = _stores.get(key)
            if store is None or store.settings != settings:
                store = _stores[key] = Store(settings, create)
    return store


_making = threading.Lock()
os.register_at_fork(after_in_child=lambda: globals().update(_making=threading.Lock()))


def _cacheable(url: str, settings: CacheSettings) -> bool:
    if openers.url_scheme(url) != "file":
        return True
    if settings.local != "network":
        return settings.local == "all"
    return _on_network_fs(os.path.dirname(os.path.realpath(openers.local_path(url))))


@functools.lru_cache(maxsize=1024)
def _on_network_fs(path: str) -> bool:
    """Whether the directory at ``path`` is on a network filesystem (asked once per directory and process)."""
    best, kind = "", ""
    try:
        with open("/proc/self/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                point = fields[1].replace("\\040", " ")
                if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return False
    return any(kind == name or kind.startswith(name + ".") for name in _NETWORK_FS)



def verify_cache(settings: CacheSettings | None = None, repair: bool = True) -> list[str]:
    """Checks every complete entry's size, mtime and CRC-32 against what was downloaded, and
    that it is a whole tar; returns what is wrong (and, with ``repair``, removes those
    entries: they are fetched again). Makes nothing: a missing or untrusted directory raises
    :class:`~wds_datapipes.errors.CacheDirectoryError`; one without a ledger has nothing to check."""
    settings = settings or get_cache()
    if settings is None:
        return []
    make_directory(settings.directory, create=False)
    if not os.path.exists(os.path.join(settings.directory, "ledger.sqlite")):
        return []
    return verify(_store(settings, create=False), repair)


openers.set_stream_layer(_cached_open, log_cache_stats)
# The cache's own counters, each process's change in stats' snapshots (None while the cache is off: nothing moves).
register_counters("cache", lambda: dict(vars(STATS)) if get_cache() is not None else None)
