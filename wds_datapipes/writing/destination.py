"""Writing straight to storage: shards built in a local spool, uploaded as they close.

A shard pattern with a scheme (``ais://bucket/train-%06d.tar``; ``s3://``, ``gs://``,
``az://`` once their back ends have a ``put``) is written in three steps per shard: the
worker builds it in a spool folder on local disk, the parent hands it to one of a few
upload threads (:class:`Uploads`: the next shards are written meanwhile), and once the
store holds the whole object (its size checked against the file) the spool copy is
removed. At most ``2 * workers + uploads`` shards are spooled at once.

An upload goes through the scheme's back end (:func:`find_put`): ``put(path, url, limits)``
makes the object appear whole or not at all, so no half-written shard is ever visible
under its final name. A failed upload is tried again (``tries`` in all); then the run
stops with a :class:`~wds_datapipes.errors.ShardWriteError` naming the shard.

The progress and the index live at the destination too, so a run survives the loss of
the machine (:class:`RemoteProgress`): one small object per shard, written after the
shard's upload, under ``<index>.rank<r>-of-<w>.progress/``; the index (``index.json``,
its offsets and member places) is uploaded last, side files first.

Every call on the destination (uploads, the HEADs that check an object, the reads of the
records) goes with the run's own object-store settings where ``write_shards(store=...)``
gave them (``stores``: each URL is made a :class:`~wds_datapipes.storage.cloud_settings.StoreUrl`
right before the call), else with the process's.
"""

from __future__ import annotations

import importlib
import json
import os
import posixpath
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, replace

from ..epochs.index import ShardIndex, ShardScan
from ..epochs.places import ShardPlaces
from ..errors import ShardOpenError, ShardWriteError, WdsError
from ..shards.openers import backend_for, open_source, url_scheme
from ..storage.cloud_settings import PipelineStores, StoreArg, with_stores
from ..storage.store_calls import StoreFailure, not_found
from .earlier import settle_earlier
from .progress import (
    GivenKeys,
    Plan,
    ProgressLog,
    WriterSettings,
    check_given_keys,
    join_index,
    object_still_there,
    progress_path,
)
from .shard_file import ShardResult

Put = Callable[..., "str | None"]


def is_remote(location: str) -> bool:
    """Whether ``location`` (a shard pattern, an index) names storage other than a local path."""
    scheme = url_scheme(location)
    if scheme == "pipe":
        raise ValueError(f"shards cannot be written to a pipe: command ({location!r})")
    return scheme != "file"


def find_put(url: str) -> Put:
    """The upload of ``url``'s scheme: its back end's ``put(path, url, limits)``.

    Until the ``ais`` record carries one, ``ais://`` uploads through the package that
    registered the ``ais`` opener (found from the registry's entry, never imported here
    by name): its ``upload.upload_file``.
    """
    try:
        backend = backend_for(url)
    except ShardOpenError as exn:
        raise ShardWriteError(f"no back end can store it: {exn.reason or exn}", shard=url) from None
    if backend.put is not None:
        return backend.put
    if backend.scheme == "ais":
        package = backend.open.__module__.partition(".")[0]
        upload_file = importlib.import_module(f"{package}.upload").upload_file

        def put(path: str, target: str, limits=None) -> str | None:
            upload_file(path, target)
            return None

        return put
    raise ShardWriteError(f"the {backend.scheme!r} back end has no put: shards cannot be uploaded there", shard=url)


def put_whole(path: str, url: str, *, tries: int = 3, wait_s: float = 0.5, limits=None) -> str | None:
    """Uploads the file ``path`` as ``url``, trying ``tries`` times; the object's version
    (as its back end's ``stamp`` says it, else as ``put`` returned it).

    Raises :class:`ShardWriteError` naming ``url``, what failed and how often it was tried.
    """
    put = find_put(url)
    stamp = backend_for(url).stamp
    size = os.path.getsize(path)
    problem = ""
    for attempt in range(1, tries + 1):
        try:
            version = put(path, url, limits)
            if stamp is not None:
                stored, version = stamp(url, limits) or (None, version)
                if stored is not None and stored != size:
                    raise OSError(f"the object has {stored} bytes after the upload, the file {size}")
            return version if version != url else None
        except Exception as exn:  # noqa: BLE001 (any failure of one try: tried again, then reported)
            problem = f"{type(exn).__name__}: {getattr(exn, 'reason', None) or exn}"
            if is_missing(exn):  # a missing bucket does not come back by itself
                raise ShardWriteError(f"uploading {path!r} failed: {problem}", shard=url) from None
        if attempt < tries:
            time.sleep(wait_s * 2 ** (attempt - 1))
    raise ShardWriteError(f"uploading {path!r} failed {tries} times; the last: {problem}", shard=url)


def is_missing(exn: BaseException) -> bool:
    """Whether a failed read or upload says the object or its bucket does not exist (rather
    than that the store failed), by the status alone: a local FileNotFoundError, the kind of
    an object store's failure (:func:`~wds_datapipes.storage.store_calls.not_found`), an HTTP
    status (``status``, ``status_code``, ``code``) of the error or of what caused it, else a
    status in words (``HTTP 404``, ``status code: 404``). Never a ``404`` or "not found" in
    a bucket's, a key's or a path's name (``s3://runs-404/shards/404/x.tar``)."""
    seen: set[int] = set()
    error: BaseException | None = exn
    while error is not None and id(error) not in seen:  # the error, then what caused it
        seen.add(id(error))
        if isinstance(error, FileNotFoundError):
            return True
        if isinstance(error, StoreFailure):
            return not_found(error)
        status = next((value for name in ("status", "status_code", "code")
                       if isinstance(value := getattr(error, name, None), int) and 100 <= value < 600), None)
        if status is not None:
            return status == 404
        error = error.__cause__ or error.__context__
    text = str(getattr(exn, "reason", None) or exn)
    return _STATUS_404.search(text) is not None


# A 404 as a status in words: "HTTP 404", "HTTP Error 404", "status code: 404", "404 Not Found".
_STATUS_404 = re.compile(r"\b(?:HTTP(?:/[\d.]+)?(?: Error)?:?|status(?: code)?:?)\s*404\b|(?<![\w./-])404 Not Found\b",
                         re.IGNORECASE)


class RemoteFiles:
    """Small files (progress records, the index) written to and read from the destination."""

    def __init__(self, spool: str, tries: int = 3, stores: PipelineStores | None = None):
        self.spool, self.tries, self.stores = spool, tries, stores

    def write(self, url: str, data: bytes) -> None:
        handle, path = tempfile.mkstemp(dir=self.spool, suffix=".rec")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            put_whole(path, with_stores(url, self.stores), tries=self.tries)
        finally:
            os.remove(path)

    def read(self, url: str) -> bytes | None:
        """The object's bytes; None where it does not exist."""
        try:
            stream = open_source(with_stores(url, self.stores))
        except (WdsError, OSError) as exn:
            if is_missing(exn):
                return None
            raise
        try:
            return stream.read()
        finally:
            stream.close()

    def read_json(self, url: str) -> dict | None:
        data = self.read(url)
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return None  # cannot happen with whole-object puts; treated as never written


class _Done(dict):
    """The shards recorded complete, read from the destination when first asked about."""

    def __init__(self, progress: RemoteProgress):
        super().__init__()
        self.progress = progress
        self.asked: set[int] = set()

    def __contains__(self, shard: object) -> bool:
        if isinstance(shard, int) and shard not in self.asked and not dict.__contains__(self, shard):
            self.asked.add(shard)
            entry = self.progress.files.read_json(self.progress.record_url(shard))
            if entry is not None and entry.get("run") == self.progress.run and \
                    object_still_there(entry, self.progress.files.stores):
                self[shard] = entry
        return dict.__contains__(self, shard)


class RemoteProgress:
    """A rank's progress kept at the destination (the interface of
    :class:`~wds_datapipes.writing.progress.ProgressLog`): ``settings.json`` (the settings
    and this run's id), one ``<shard>.json`` per shard uploaded, ``end.json``. Records of
    another run (``restart=True`` starts a new one) are ignored."""

    def __init__(self, index: str, rank: int, world: int, settings: WriterSettings, files: RemoteFiles,
                 restart: bool = False):
        self.prefix = progress_path(index, rank, world)
        self.settings, self.files = settings, files
        self.ended: int | None = None
        self.given: GivenKeys | None = None  # with a map: the keys it gave in this rank's shards (the writer's)
        self.earlier_end: int | None = None  # the plan of the run resumed, where it ended
        self.earlier_pattern: str | None = None  # a restart: the pattern of the run it replaces
        earlier = files.read_json(f"{self.prefix}/settings.json")
        self.resumed = earlier is not None and not restart
        self.removed: list[str] = []
        if not self.resumed:
            self.earlier_pattern = None if earlier is None else earlier.get("pattern")
            self.removed = settle_earlier(settings.pattern, rank, world, restart, files.stores,
                                          earlier_pattern=self.earlier_pattern)
            self.run = uuid.uuid4().hex
            files.write(f"{self.prefix}/settings.json",
                        json.dumps({**settings.to_json(), "run": self.run}).encode())
        else:
            self.run = earlier.pop("run")
            before = WriterSettings.from_json(earlier, f"{self.prefix}/settings.json")
            if before != settings:
                changed = {k: (v, getattr(settings, k)) for k, v in asdict(before).items()
                           if getattr(settings, k) != v}
                raise ShardWriteError(f"an earlier run with other settings left {self.prefix!r} ({changed}, "
                                      "earlier -> now); run with the same settings to resume, or restart=True "
                                      "(--restart) to start over")
            end = files.read_json(f"{self.prefix}/end.json")
            self.earlier_end = end["shards"] if end is not None and end.get("run") == self.run else None
        self.done: dict[int, dict] = _Done(self)

    def record_url(self, shard: int) -> str:
        return f"{self.prefix}/{shard:09d}.json"

    check_plan = ProgressLog.check_plan

    def record(self, shard: int, plan: Plan, written: int, skipped: list[tuple[str, str]], scan: ShardScan,
               given: list[str | None] | None = None) -> None:
        entry = {"run": self.run, "shard": shard, **plan.entry(), "written": written, "skipped": skipped,
                 "scan": scan.to_json(), **({} if given is None else {"mapped": given})}
        self.files.write(self.record_url(shard), json.dumps(entry).encode())
        dict.__setitem__(self.done, shard, entry)

    def end(self, shards: int) -> None:
        self.files.write(f"{self.prefix}/end.json", json.dumps({"run": self.run, "shards": shards}).encode())
        self.ended = shards

    def close(self) -> None:
        pass


def join_remote_index(index: str, world: int, files: RemoteFiles, known: dict[int, dict] | None = None,
                      given: GivenKeys | None = None) -> ShardIndex:
    """The index of a finished run from its ranks' records at the destination, uploaded
    to ``index`` (its offsets and places files first); raises naming what is missing, or a
    key a map gave to two shards (:func:`~.progress.check_given_keys`; ``given``: the keys
    of the shards this process checked already). ``known``: records this process holds
    already (not read again)."""
    known = known or {}
    runs, totals = {}, set()
    mapped = False
    for rank in range(world):
        prefix = progress_path(index, rank, world)
        settings = files.read_json(f"{prefix}/settings.json")
        if settings is None:
            raise ShardWriteError(f"rank {rank} of {world} has not started: no {prefix}/settings.json")
        end = files.read_json(f"{prefix}/end.json")
        if end is None or end.get("run") != settings["run"]:
            raise ShardWriteError(f"rank {rank} of {world} has not finished (no {prefix}/end.json of its run)")
        runs[rank] = settings["run"]
        totals.add(end["shards"])
        mapped = mapped or settings.get("map_name") is not None
    if len(totals) != 1:
        raise ShardWriteError(f"the ranks planned different numbers of shards: {sorted(totals)} (different input?)")
    total = totals.pop()
    scans, entries = [], []
    for shard in range(total):
        rank = shard % world
        entry = known.get(shard) if world == 1 else None
        if entry is None:
            entry = files.read_json(f"{progress_path(index, rank, world)}/{shard:09d}.json")
        if entry is None or entry.get("run") != runs[rank]:
            raise ShardWriteError(f"shard {shard} of {total} is in no rank's record")
        scans.append(ShardScan.from_json(entry["scan"]))
        entries.append(entry)
    if mapped:
        check_given_keys(entries, given)
    result = ShardIndex.from_scans(scans)
    folder = tempfile.mkdtemp(dir=files.spool)
    try:
        local = os.path.join(folder, posixpath.basename(index))
        result.save(local)
        names = sorted(os.listdir(folder), key=lambda name: name == os.path.basename(local))  # the index last
        for name in names:
            files.write(posixpath.join(posixpath.dirname(index), name), open_bytes(os.path.join(folder, name)))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return result


def join_any(index: str, world: int, spool: str | None = None, store: StoreArg = None) -> ShardIndex:
    """The index of a finished run, joined from its ranks' records (local or at the destination,
    reached with ``store``'s object-store settings where given, as ``write_shards``'s)."""
    if not is_remote(index):
        return join_index(index, world)
    folder = spool_folder(spool)
    try:
        return join_remote_index(index, world, RemoteFiles(folder, stores=PipelineStores.of(store)))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def open_bytes(path: str) -> bytes:
    with open(path, "rb") as stream:
        return stream.read()


class Uploads:
    """Uploads finished spool shards to ``pattern % shard`` on ``uploads`` threads; hands
    back each shard once its object is stored, its scan pointing at it (``stores``: the
    run's own object-store settings, carried by each URL uploaded to)."""

    def __init__(self, pattern: str, uploads: int = 2, tries: int = 3, stores: PipelineStores | None = None):
        if uploads < 1:
            raise ValueError(f"uploads must be >= 1, not {uploads}")
        self.pattern, self.limit, self.tries, self.stores = pattern, uploads, tries, stores
        self.pool = ThreadPoolExecutor(uploads, thread_name_prefix="wds-upload")
        self.pending: dict[Future, Plan] = {}
        self.stored: list[tuple[ShardResult, Plan]] = []  # finished beside a failure

    def add(self, result: ShardResult, plan: Plan) -> list[tuple[ShardResult, Plan]]:
        """Starts one shard's upload; returns those finished meanwhile (waits while ``uploads`` are under way)."""
        self.pending[self.pool.submit(self._upload, result)] = plan
        finished = []
        while len(self.pending) > self.limit:
            finished += self._wait()
        return finished

    def drain(self) -> list[tuple[ShardResult, Plan]]:
        finished = []
        while self.pending:
            finished += self._wait()
        return finished

    def _wait(self) -> list[tuple[ShardResult, Plan]]:
        done, _ = wait(self.pending, return_when=FIRST_COMPLETED)
        finished, failure = [], None
        for future in done:
            plan = self.pending.pop(future)
            if future.exception() is None:
                finished.append((future.result(), plan))
            else:
                failure = failure or future.exception()
        if failure is not None:
            self.stored += finished
            raise failure
        return finished

    def salvage(self) -> list[tuple[ShardResult, Plan]]:
        """After a failure: the shards stored all the same (those in flight finish first), to record."""
        wait(self.pending)
        stored, self.stored = self.stored, []
        for future, plan in self.pending.items():
            if not future.cancelled() and future.exception() is None:
                stored.append((future.result(), plan))
        self.pending.clear()
        return stored

    def _upload(self, result: ShardResult) -> ShardResult:
        local = str(result.scan.url)
        url = with_stores(self.pattern % result.shard, self.stores)
        try:
            version = put_whole(local, url, tries=self.tries)
        finally:
            os.remove(local)
        scan = result.scan
        places = scan.places
        if places is not None and places.names is not None:
            places = replace(places, version=version) if version is not None else ShardPlaces(None)
        moved = ShardScan(url, scan.nsamples, scan.filesize, scan.offsets, scan.repeated_keys, scan.keys, places)
        return ShardResult(result.shard, moved, result.written, result.skipped, result.mapped)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def spool_folder(spool: str | None) -> str:
    """A fresh folder for this run's spooled shards (inside ``spool`` where given)."""
    if spool is not None:
        os.makedirs(spool, exist_ok=True)
    return tempfile.mkdtemp(prefix="wds-spool-", dir=spool)


__all__ = ["RemoteFiles", "RemoteProgress", "Uploads", "find_put", "is_remote", "join_any", "join_remote_index",
           "put_whole",
           "spool_folder"]
