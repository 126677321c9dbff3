"""``write_shards``: sample dicts in, indexed tar shards out, in parallel and resumable.

The parent reads the input once, checks each sample (its key and field names, required
fields, keys seen twice), plans which shard it goes to (:mod:`.plan`: by count and
bytes, or by place for a row source such as Parquet without ``maxsize``; the same for any
number of workers and ranks) and hands each of its rank's shards, whole,
to one worker process (or writes it itself with ``workers=1``): a sample goes to one
worker only, through a queue holding at most two shards per worker. Each shard is
written to ``<name>.part`` and renamed when complete, with its offsets and member places
taken in the same pass (:mod:`.shard_file`), and recorded in the progress log
(:mod:`.progress`); a run started again writes only the shards the log does not hold.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import posixpath
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field

import numpy as np

from ..epochs.index import ShardIndex
from ..errors import ShardWriteError
from ..handlers import Handler, reraise_exception
from ..storage.cloud_settings import PipelineStores, StoreArg
from . import destination as dest
from .compress import check_compression, compression_of
from .earlier import check_no_more_shards
from .plan import Counted, ShardPlanner, row_shard, sample_cost, writes_shard
from .progress import (
    GivenKeys,
    Plan,
    ProgressLog,
    WriterSettings,
    check_given_keys,
    join_index,
    progress_path,
)
from .shard_file import PROBLEMS, FileBytes, MemberOptions, ShardResult, check_fields, write_shard

logger = logging.getLogger("wds_datapipes")


@dataclass
class WriteReport:
    """What a run (of one rank) did: inputs read, samples written, inputs skipped and why.

    ``read == written + len(skipped)`` always; shards complete before a resume count too.
    A rank counts the inputs of its own shards: over the ranks, ``read`` adds up to the input.
    """

    read: int = 0
    written: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (input, why)
    shards: int = 0  # shards of this rank, complete
    resumed: int = 0  # of them, complete before this run started
    bytes: int = 0
    seconds: float = 0.0
    index: ShardIndex | None = None  # the joined index (None for a rank that did not join)
    removed: list[str] = field(default_factory=list)  # a restart: the earlier run's shards it removed

    def summary(self) -> str:
        """A few lines for people: counts, rate, and every skipped input with its reason."""
        seconds = self.seconds or float("inf")
        lines = [(f"read {self.read} samples: wrote {self.written}, skipped {len(self.skipped)}; "
                  f"{self.shards} shards ({self.resumed} from an earlier run), {self.bytes / 1e6:.1f} MB "
                  f"in {self.seconds:.1f} s, {self.written / seconds:.0f} samples/s, "
                  f"{self.bytes / seconds / 1e6:.1f} MB/s")]
        lines += [f"  skipped {source}: {why}" for source, why in self.skipped]
        if self.removed:
            lines.append(f"removed {len(self.removed)} shards of an earlier run (restart): "
                         + ", ".join(self.removed[:5]) + (" ..." if len(self.removed) > 5 else ""))
        return "\n".join(lines)


def write_shards(samples: Iterable[dict], pattern: str, *, maxcount: int | None = None,
                 maxsize: int | None = None, index: str | None = None, workers: int = 1,
                 map: Callable[[dict], dict | None] | None = None, handler: Handler = reraise_exception,
                 require: Sequence[str] = (), rank: int = 0, world: int = 1, mtime: int = 0, mode: int = 0o444,
                 allow_pickle: bool = False, fsync: bool = True, restart: bool = False, join: bool | None = None,
                 progress: Callable[[int, int], None] | None = None, compression: str | None = None,
                 max_field_bytes: int | None = None, spool: str | None = None, uploads: int = 2,
                 tries: int = 3, store: StoreArg = None) -> WriteReport:
    """Writes ``samples`` into shards named ``pattern % n`` with their index; returns a :class:`WriteReport`.

    Args:
        samples: dicts with ``__key__`` and fields (bytes, str, numbers, arrays, images, ...:
            encoded by suffix, see :mod:`wds_datapipes.decoding.encoding`; a
            :class:`FileBytes` is copied from its file by the OS); ``__source__``, where
            given, names the input in errors and in the report. A row source (an iterable
            with ``for_rank(rank, world, maxcount)``: ``parquet.parquet_samples``)
            without ``maxsize`` is planned by place: every row, skipped or not, takes one of
            a shard's ``maxcount`` places, and this rank reads only the rows of its shards.
        pattern: the shards' paths, e.g. ``"out/train-%06d.tar"``.
        maxcount, maxsize: a shard's most samples, most bytes (judged by the input's sizes,
            before ``map``).
        index: the index to write (default: ``index.json`` beside the shards).
        workers: processes writing shards at once (1: this process).
        map: a function applied to each sample in the workers (decode-check, resize,
            re-encode); returning None leaves the sample out (reported). Its output is written.
        handler: for a bad input (an unreadable file, a missing required field, a key seen
            twice, a name that would read back as another key): raise (the default), or a
            skip (``warn_and_continue``), listed in the report.
        require: field names each sample must have.
        rank, world: this process's part of a multi-machine run: it writes shards
            ``n % world == rank``. The index is joined once every rank has finished
            (``join_index``, or ``join=True`` on the last).
        mtime, mode: the members' header fields (deterministic defaults). Each shard file's
            modification time is ``mtime`` too, plus under a second drawn from what it holds:
            0 is 1970, which a scratch file system's purge by modification time takes for
            old; give a fixed time of your own (the dataset's release, the run's first day),
            the same on every resume (docs/writing-resume.md).
        fsync: sync each shard to disk before its rename (a machine that goes down then
            never leaves a renamed shard with missing bytes).
        restart: start over: ignore an earlier run's progress, remove its shards (those named
            like ``pattern % n`` of this rank, and those its record names), write everything
            again. Only the writer's own are removed: a file named like a shard that the writer
            did not leave (see ``wds_datapipes.writing.earlier``) is refused, never removed; at
            a remote destination, where nothing is deleted, a restart is refused while earlier
            shards are there. Without it, a run beside shards no record accounts for is
            refused, and a resume checks the input against each recorded shard's samples.
        join: write the index when this rank is done; default: when ``world == 1``.
        progress: called with (samples, bytes) after each shard.
        compression: ``"gzip"``, ``"bzip2"``, ``"xz"`` or ``"zstd"``; default: what the
            pattern's suffix names (``.tar.gz``, ``.tgz``, ``.tar.bz2``, ``.tar.xz``,
            ``.tar.zst``), else plain tars. The index of compressed shards has no sample
            offsets nor member places (a compressed stream is read from its start).
        max_field_bytes: a field (a file, bytes, text) bigger than this is a bad input
            (to the handler: an error, or a listed skip).
        spool, uploads, tries: for a pattern with a scheme (``ais://bucket/train-%06d.tar``;
            see :mod:`.destination`): each shard is built in a fresh folder inside ``spool``
            (default: the system's temp folder), uploaded on one of ``uploads`` threads
            while the next shards are written, tried ``tries`` times, then removed there.
            The progress records and the index are kept at the destination.
        store: this run's own settings for an ``s3://``, ``gs://`` or ``az://`` destination
            (a :class:`~wds_datapipes.storage.cloud_settings.StoreSettings`, or ``{prefix:
            StoreSettings}``), ahead of the process's ``set_store_settings``, as the readers'
            ``store=``: the uploads, the HEADs that check an uploaded or recorded shard, and
            the progress records and index written there go through them (the workers only
            build shards in the spool: every call on the store is made by this process). The
            :attr:`WriteReport.index` returned reads its shards with them too.
    """
    started = time.monotonic()
    stores = PipelineStores.of(store)
    check_pattern_and_mtime(pattern, mtime)
    index = index or os.path.join(shards_folder(pattern), "index.json")
    compression = check_compression(compression or compression_of(pattern))
    settings = WriterSettings(pattern, maxcount, maxsize, rank, world, mtime, mode, allow_pickle,
                              None if map is None else f"{map.__module__}.{map.__qualname__}", compression)
    remote = dest.is_remote(pattern)
    for location in (pattern, index):
        if dest.is_remote(location):
            dest.find_put(location)  # a scheme that cannot store objects fails here, before anything is written
    folder = dest.spool_folder(spool) if remote or dest.is_remote(index) else None
    files = dest.RemoteFiles(folder, tries, stores) if folder is not None else None
    try:
        if not remote:
            os.makedirs(shards_folder(pattern), exist_ok=True)
        if files is not None and dest.is_remote(index):
            log = dest.RemoteProgress(index, rank, world, settings, files, restart)
        else:
            log = ProgressLog(progress_path(index, rank, world), settings, restart, stores)
        options = MemberOptions(mtime, mode, allow_pickle, fsync and not remote, compression)
        local = os.path.join(folder, posixpath.basename(pattern)) if remote else pattern
        report = WriteReport(removed=log.removed)
        publish = dest.Uploads(pattern, uploads, tries, stores) if remote else None
        try:
            with _Shards(workers, options, handler, map, local, publish) as pool:
                log.given = pool.given
                if pool.given is not None and isinstance(log, ProgressLog):  # an earlier run's shards first: a
                    # new shard that repeats one of their keys is then the one removed, in whatever order
                    check_given_keys([log.done[n] for n in sorted(log.done)], pool.given)
                try:
                    total = _run(samples, settings, require, handler, log, pool, report, progress, max_field_bytes)
                    for result, plan in pool.drain():
                        _record(log, report, result, plan, progress)
                except BaseException:
                    for result, plan in publish.salvage() if publish is not None else ():
                        with contextlib.suppress(Exception):  # kept for the resume; the first error is raised
                            log.record(result.shard, plan, result.written, result.skipped, result.scan,
                                       result.mapped)
                    raise
            check_no_more_shards(pattern, rank, world, log, total, stores)
            log.end(total)
        finally:
            log.close()
            if publish is not None:
                publish.close()
        if join if join is not None else world == 1:
            joined = (dest.join_remote_index(index, world, files, log.done, log.given)
                      if isinstance(log, dest.RemoteProgress) else join_index(index, world, own=log))
            report.index = joined.with_store(stores)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    report.seconds = time.monotonic() - started
    return report


def shards_folder(pattern: str) -> str:
    """The folder of a shard pattern's files (``%%`` there is a ``%``, as ``pattern % n`` makes it)."""
    return os.path.dirname(pattern).replace("%%", "%") or "."


def check_pattern_and_mtime(pattern: str, mtime: int) -> None:
    """Raises :class:`ShardWriteError` naming the pattern where its shard number is in the folder
    part (``out/%d/s.tar``: an earlier run's shards are found by listing one folder), and
    :class:`ValueError` where ``mtime`` is no time a tar header holds (0 to 8**11 - 1 seconds)."""
    folder = os.path.dirname(pattern)
    if "%" in folder.replace("%%", ""):
        raise ShardWriteError(f"the pattern's folder {folder!r} holds a % field: the shard number goes in the file "
                              "name (out/s-%06d.tar), so that an earlier run's shards are found in one folder "
                              "(what a resume, a restart and a fresh run check)", shard=pattern)
    if type(mtime) is not int or not 0 <= mtime < 8**11:
        raise ValueError(f"mtime must be whole seconds since 1970 from 0 to {8**11 - 1} (a tar header's field), "
                         f"not {mtime!r}")


class _Skipped:
    """An input the checks refused, holding its place in a plan by place (its shard stays a sample short)."""

    __slots__ = ("source", "why")

    def __init__(self, source: str, why: str):
        self.source, self.why = source, why


def _run(samples: Iterable[dict], settings: WriterSettings, require: Sequence[str], handler: Handler,
         log: ProgressLog, pool: _Shards, report: WriteReport, progress, max_field_bytes: int | None = None) -> int:
    """Plans every sample and hands this rank's shards to the pool; the plan's shard count.

    A row source (``for_rank``: :class:`~.parquet.ParquetSamples`) without ``maxsize`` is
    planned by place (:func:`~.plan.row_shard`): it reads only the row groups of this
    rank's shards, the others' rows counted from its footers."""
    current: list[dict | None] = []
    facts: list[tuple[str, list]] = []  # (key, [(field, size), ...]) of each of this rank's samples in the shard
    shard = -1
    skips: list[tuple[int, str, str]] = []  # (shard being filled, input, why)
    by_place = settings.maxsize is None and callable(getattr(samples, "for_rank", None))
    planner: ShardPlanner | None = None  # None: planned by place
    if by_place:
        inputs: Iterable = samples.for_rank(settings.rank, settings.world, settings.maxcount)  # type: ignore[attr-defined]
        checked = _checked(inputs, require, handler, skips, lambda: max(shard, 0), max_field_bytes, by_place=True)
    else:
        if settings.world > 1 and callable(getattr(samples, "for_rank", None)):
            logger.warning("maxsize: each of the %d ranks reads every Parquet row group (the plan needs each "
                           "row's size, known only by reading it)", settings.world)
        planner = ShardPlanner(settings.maxcount, settings.maxsize)
        checked = _checked(samples, require, handler, skips, lambda: max(shard, 0), max_field_bytes)
    mine = False
    for row, (item, cost, sizes) in enumerate(checked):
        number = row_shard(row, settings.maxcount) if planner is None else planner.shard_of(cost)
        if number != shard:
            if shard >= 0:
                _dispatch(shard, current, facts, settings, log, pool, report, progress)
            shard, current, facts = number, [], []
            mine = writes_shard(number, settings.rank, settings.world)
        if isinstance(item, _Skipped):  # by place: its place stays empty
            if mine:
                report.read += 1
                report.skipped.append((item.source, item.why))
        elif isinstance(item, Counted):
            if mine:
                raise ShardWriteError(f"input {item.key!r} of shard {number} was not read by rank {settings.rank}, "
                                      "which writes it (the row source and the plan disagree)", key=item.key)
            current.append(None)
        elif mine:
            current.append(item)
            facts.append((item["__key__"], sizes))  # type: ignore[index]
        else:
            current.append(None)  # another rank's: only counted
    if shard >= 0:
        _dispatch(shard, current, facts, settings, log, pool, report, progress)
    for number, source, why in skips:
        if writes_shard(number, settings.rank, settings.world):
            report.read += 1
            report.skipped.append((source, why))
    return shard + 1


def _checked(samples: Iterable, require: Sequence[str], handler: Handler,
             skips: list[tuple[int, str, str]], filling: Callable[[], int],
             max_field_bytes: int | None = None, by_place: bool = False) -> Iterator[tuple[object, int, list | None]]:
    """(sample, planned bytes, its (field, size) pairs) of each input that passes the checks;
    the others go to the handler.
    ``by_place``: a refused input yields a :class:`_Skipped` (it keeps its place), a
    :class:`~.plan.Counted` passes unchecked, and every input's key counts as seen, even a
    refused one's (so each rank, seeing every key, refuses the same repeats)."""
    seen: set[str] = set()
    for sample in samples:
        if isinstance(sample, Counted):
            if isinstance(sample.key, str):
                seen.add(sample.key)
            yield sample, 0, None
            continue
        key = sample.get("__key__")
        try:
            fields = [name for name in sample if not name.startswith("_")]
            problems = sample.get(PROBLEMS)
            problem = "; ".join(problems) if problems else check_fields(key, fields)
            missing = [name for name in require if name not in sample] if require else None
            if problem is None and missing:
                problem = f"the required field(s) {missing} are missing (it has {fields})"
            if problem is None and key in seen:
                problem = "its key was seen before (keys must be unique: readers would merge or repeat them)"
            if problem is not None:
                raise ShardWriteError(problem, key=key if isinstance(key, str) else None,
                                      source=str(sample.get("__source__", key)))
            sizes = [(name, _size(sample[name])) for name in fields]
            if max_field_bytes is not None:
                over = [(name, size) for name, size in sizes if size > max_field_bytes]
                if over:
                    raise ShardWriteError(f"field {over[0][0]!r} has {over[0][1]} bytes, over the limit of "
                                          f"{max_field_bytes} (max_field_bytes)", key=key,
                                          source=str(sample.get("__source__", key)))
            cost = sample_cost(key, sizes)
        except (ShardWriteError, OSError) as exn:
            source = str(sample.get("__source__", key))
            error = exn if isinstance(exn, ShardWriteError) else ShardWriteError(
                f"{type(exn).__name__}: {exn}", key=key if isinstance(key, str) else None, source=source)
            handler(error)
            if by_place:
                if isinstance(key, str):
                    seen.add(key)
                yield _Skipped(source, error.reason or str(error)), 0, None
            else:
                skips.append((filling(), source, error.reason or str(error)))
            continue
        seen.add(key)
        yield sample, cost, sizes


def _size(value: object) -> int:
    """A field's planned size: exact for bytes, text, files, integers, arrays and JSON;
    a guess for other values (images to encode: their pixels' bytes)."""
    if isinstance(value, FileBytes):
        return value.size if value.size is not None else os.stat(value.path).st_size
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogateescape"))
    if isinstance(value, int):
        return len(str(value))
    if isinstance(value, np.ndarray):
        return value.nbytes + 128  # an npy header (version 1, small shapes)
    if isinstance(value, (dict, list)):
        try:
            return len(json.dumps(value, sort_keys=True, separators=(",", ":")).encode())
        except (TypeError, ValueError):
            return 64
    return int(getattr(value, "nbytes", 64))


def _dispatch(shard: int, samples: list[dict | None], facts: list, settings: WriterSettings, log: ProgressLog,
              pool: _Shards, report: WriteReport, progress) -> None:
    """Writes (or hands on) one planned shard of this rank; another rank's is passed by."""
    if not writes_shard(shard, settings.rank, settings.world):
        return
    plan = Plan.of(facts)
    if shard in log.done:
        log.check_plan(shard, plan)
        entry = log.done[shard]
        if pool.given is not None and shard not in pool.given.shards:  # (a remote record: read as reached)
            pool.given.add_entry(entry)
        report.read += entry["planned"]
        report.written += entry["written"]
        report.skipped += [tuple(s) for s in entry["skipped"]]
        report.shards += 1
        report.resumed += 1
        report.bytes += entry["scan"]["filesize"]
        if progress is not None:
            progress(entry["planned"], entry["scan"]["filesize"] or 0)
        return
    for result, done_plan in pool.submit(shard, samples, plan):
        _record(log, report, result, done_plan, progress)


def _record(log: ProgressLog, report: WriteReport, result: ShardResult, plan: Plan, progress) -> None:
    log.record(result.shard, plan, result.written, result.skipped, result.scan, result.mapped)
    report.read += plan.planned
    report.written += result.written
    report.skipped += result.skipped
    report.shards += 1
    report.bytes += result.scan.filesize or 0
    if progress is not None:
        progress(plan.planned, result.scan.filesize or 0)


# ------------------------------------------------------------ the workers

Finished = tuple[ShardResult, Plan]  # a shard done, and its plan

_worker: dict = {}


def _start_worker(options: MemberOptions, handler: Handler, map_fn) -> None:
    _worker.update(options=options, handler=handler, map_fn=map_fn)


def _write_in_worker(shard: int, path: str, samples: list[dict]) -> ShardResult:
    return write_shard(shard, path, samples, _worker["options"], _worker["handler"], _worker["map_fn"], True)


class _Shards:
    """Writes shards here (one worker) or in worker processes, at most two queued per worker;
    with ``publish`` (:class:`.destination.Uploads`), each finished shard is uploaded and
    handed back once stored."""

    def __init__(self, workers: int, options: MemberOptions, handler: Handler, map_fn, pattern: str,
                 publish: dest.Uploads | None = None):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, not {workers}")
        self.workers, self.options, self.handler, self.map_fn = workers, options, handler, map_fn
        self.pattern, self.publish = pattern, publish
        self.plans: dict[int, Plan] = {}
        self.given = GivenKeys() if map_fn is not None else None  # with a map: the keys it gave, over every shard
        self.pending: set[Future] = set()
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self):
        if self.workers > 1:
            methods = multiprocessing.get_all_start_methods()
            context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
            self.pool = ProcessPoolExecutor(self.workers, mp_context=context, initializer=_start_worker,
                                            initargs=(self.options, self.handler, self.map_fn))
        return self

    def submit(self, shard: int, samples: list[dict], plan: Plan) -> list[Finished]:
        """Hands on one shard; returns the shards finished meanwhile, with their plans."""
        self.plans[shard] = plan
        path = self.pattern % shard
        if self.pool is None:
            return self._published([write_shard(shard, path, samples, self.options, self.handler, self.map_fn,
                                                True)])
        self.pending.add(self.pool.submit(_write_in_worker, shard, path, samples))
        finished = []
        while len(self.pending) >= 2 * self.workers:
            done, self.pending = wait(self.pending, return_when=FIRST_COMPLETED)
            finished += [future.result() for future in done]
        return self._published(finished)

    def drain(self) -> Iterator[Finished]:
        while self.pending:
            done, self.pending = wait(self.pending, return_when=FIRST_COMPLETED)
            yield from self._published([future.result() for future in done])
        if self.publish is not None:
            yield from self.publish.drain()

    def _published(self, results: list[ShardResult]) -> list[Finished]:
        """The shards finished: written (local), or stored (a remote destination)."""
        finished = []
        for result in results:
            plan = self.plans.pop(result.shard)
            if self.given is not None:
                self._check_mapped(result, plan)
            finished += [(result, plan)] if self.publish is None else self.publish.add(result, plan)
        return finished

    def _check_mapped(self, result: ShardResult, plan: Plan) -> None:
        """Stops the run where the map gave a key of this shard in another shard too (each
        shard's worker checks its own; an earlier run's shards are added first, or, recorded at
        a remote destination, as the plan reaches them): this shard, finished second, is
        removed, not recorded, whatever the handler (both are written by then: neither sample
        can be skipped any more)."""
        try:
            final = self.publish.pattern if self.publish is not None else self.pattern  # where it is stored
            self.given.add(result.shard, plan.samples["keys"], result.mapped, final % result.shard)  # type: ignore[union-attr, arg-type]
        except ShardWriteError:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.pattern % result.shard)
            raise

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


__all__ = ["FileBytes", "WriteReport", "write_shards"]
