"""The snapshot: plain, picklable numbers per stage, source, scheme, worker, mixture, and the trainer's wait.

:func:`build` sums the records of a run's processes (:mod:`.recorder`) into a
:class:`Snapshot`; it is pure (records in, numbers out). :func:`current` reads the current
run's records and builds it (what ``wd.stats.snapshot()`` and the exporters call). Times are seconds of the
processes that ran the pipes (loader workers, or the training process itself), summed over
them: with 4 workers busy for 10 s, the stages add up to about 40 s.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field

from .recorder import cpus, read_records, recorder_for
from .settings import current_settings
from .tallies import ALL_STAGES, STAGES, SourceTally, StageTally

_NS = 1e-9


@dataclass(frozen=True)
class StageStats:
    """One stage, summed over the processes.

    Stages: ``list`` (waiting for the next shard URL: expansion and listing calls; items:
    URLs), ``open`` (opening shards; items: shards), ``read`` (the shards' read calls; bytes
    as stored, compressed; by member places the reads and cutting members out of them),
    ``tar`` (parsing tar headers and grouping members into samples; items: samples), ``decode``
    (items: samples decoded), ``transform`` (``map_fields``, ``to_tuple``, ``rename_keys``;
    items: samples), ``batch`` (batching and collation; items: batches). Two are derived from
    each process's wall clock: ``other`` (time a batching pipe of ours waited on its source
    that no stage of ours accounts for: your ``.map``, torch's pipes) and ``handover`` (the
    rest of a loader worker's time: after our last pipe, handing batches to the trainer
    (torch's collate, its queues), waiting for the trainer to ask, and code after our pipes;
    none in the training process itself, whose rest is its training loop).

    Attributes:
        seconds: the stage's time: what was timed whole (reads, openings, batches), and for
            per-sample work an estimate from ``timed`` of its ``calls`` samples.
        errors: failures (raised or skipped by a handler).
        retries: retried requests.
        threads: the largest thread pool the stage ran with (``num_threads``), 0: none.
    """

    name: str
    items: int = 0
    bytes: int = 0
    seconds: float = 0.0
    calls: int = 0
    timed: int = 0
    errors: int = 0
    retries: int = 0
    threads: int = 0


@dataclass(frozen=True)
class SourceStats:
    """One source (a shard list, an index, a mixture's source), or one URL scheme.

    ``samples``: samples taken from it; ``objects``: shards opened; ``bytes``: bytes read;
    ``read_seconds`` / ``open_seconds``: time in its reads and openings; ``cache_hits`` (also
    reads along a download in progress), ``cache_misses``, ``cache_bytes`` (read from the shard
    cache's disk): what the shard cache did for it.
    """

    name: str
    samples: int = 0
    objects: int = 0
    bytes: int = 0
    read_seconds: float = 0.0
    open_seconds: float = 0.0
    retries: int = 0
    errors: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_bytes: int = 0

    @property
    def read_rate(self) -> float:
        """Bytes per second of reading (0 where nothing was timed)."""
        return self.bytes / self.read_seconds if self.read_seconds > 0 else 0.0


@dataclass(frozen=True)
class WorkerStats:
    """One worker of one rank, summed over its processes (a new process each epoch without
    persistent workers). ``worker`` -1: the training process itself (it called ``enable`` and
    read pipes without loader workers); -2: a loader worker that told no id (one entry per
    process). ``wall_seconds``: from its first pipe's start to its last activity."""

    rank: int
    worker: int
    processes: int = 0
    wall_seconds: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)
    pids: tuple[int, ...] = ()

    @property
    def busy_seconds(self) -> float:
        """Time in the stages of the data path (all but ``handover``)."""
        return sum(seconds for name, seconds in self.stages.items() if name != "handover")


@dataclass(frozen=True)
class WaitStats:
    """The training loop's wait on data (:func:`~wds_datapipes.stats.watch`).

    ``steps``: batches after each epoch's first; ``blocked_seconds`` in ``next()`` on the loader
    for them; ``step_seconds``: from handing each batch over to the next call (the training
    steps, every batch's); ``ready_steps`` whose
    ``next()`` returned within ``ready_s``; ``first_seconds``: the waits for the first batch of
    each of the ``starts`` epochs watched (from ``iter(loader)``: workers starting; not in the
    steps), ``last_seconds`` for their ends (after the last batch: workers stopping);
    ``longest_seconds``: the longest wait of one step.
    """

    steps: int = 0
    blocked_seconds: float = 0.0
    step_seconds: float = 0.0
    ready_steps: int = 0
    first_seconds: float = 0.0
    longest_seconds: float = 0.0
    ready_s: float = 0.001
    starts: int = 0
    last_seconds: float = 0.0

    @property
    def readiness(self) -> float:
        """The share of steps that did not wait (their batch was ready): 1.0 with no steps."""
        return self.ready_steps / self.steps if self.steps else 1.0

    @property
    def wait_share(self) -> float:
        """The share of the loop's time spent waiting for data."""
        total = self.blocked_seconds + self.step_seconds
        return self.blocked_seconds / total if total > 0 else 0.0

    @property
    def stall_per_batch(self) -> float:
        """The exposed stall: seconds the loop waited per batch."""
        return self.blocked_seconds / self.steps if self.steps else 0.0


@dataclass(frozen=True)
class MixStats:
    """One source of one mixture's epoch: ``samples`` drawn so far; ``target`` weight and ``realized`` share."""

    mixer: str
    epoch: int
    source: str
    samples: int = 0
    target: float = 0.0
    realized: float = 0.0


@dataclass(frozen=True)
class RankStats:
    """One rank over the last interval between two gathers."""

    rank: int
    steps: int = 0
    stall_per_batch: float = 0.0
    wait_share: float = 0.0
    batches_per_s: float = 0.0


@dataclass(frozen=True)
class RanksStats:
    """The ranks of a process group at the last gather: each one's numbers, their spread, and the straggler."""

    ranks: tuple[RankStats, ...] = ()
    stall_min: float = 0.0
    stall_median: float = 0.0
    stall_max: float = 0.0
    throughput_min: float = 0.0
    throughput_median: float = 0.0
    throughput_max: float = 0.0
    straggler: int | None = None


@dataclass(frozen=True)
class Snapshot:
    """What a run measured so far (numbers, not text): :func:`~wds_datapipes.stats.report` reads it.

    Attributes:
        enabled: whether stats were on (an empty snapshot otherwise).
        processes: how many processes' records it sums.
        stages: every stage (``StageStats``), measured or derived, by name.
        sources: per source.
        schemes: per URL scheme.
        workers: per worker and rank.
        mixtures: per mixture, epoch and source.
        wait: the training loop's wait (None where nothing was watched).
        ranks: the last gather across ranks (None where none was made).
        cache: the shard cache's own counters, their change over this run's processes.
        cpus: the CPUs the training process may use.
    """

    enabled: bool = False
    processes: int = 0
    stages: dict[str, StageStats] = field(default_factory=dict)
    sources: dict[str, SourceStats] = field(default_factory=dict)
    schemes: dict[str, SourceStats] = field(default_factory=dict)
    workers: tuple[WorkerStats, ...] = ()
    mixtures: tuple[MixStats, ...] = ()
    wait: WaitStats | None = None
    ranks: RanksStats | None = None
    cache: dict[str, int] = field(default_factory=dict)
    cpus: int = 1

    def since(self, earlier: Snapshot) -> Snapshot:
        """What happened between ``earlier`` and this snapshot (counts and times subtracted)."""
        stages = {name: _minus(s, earlier.stages.get(name)) for name, s in self.stages.items()}
        before = {(w.rank, w.worker, w.pids if w.worker == -2 else ()): w for w in earlier.workers}
        workers = tuple(_worker_minus(w, before.get((w.rank, w.worker, w.pids if w.worker == -2 else ())))
                        for w in self.workers)
        mixes = {(m.mixer, m.epoch, m.source): m for m in earlier.mixtures}
        mixtures = _realized([_minus(m, mixes.get((m.mixer, m.epoch, m.source))) for m in self.mixtures])
        wait = self.wait if earlier.wait is None or self.wait is None else _minus(self.wait, earlier.wait)
        if wait is not None and earlier.wait is not None and self.wait is not None:
            wait = dataclasses.replace(wait, longest_seconds=self.wait.longest_seconds, ready_s=self.wait.ready_s)
        return dataclasses.replace(
            self, stages=stages, workers=workers, mixtures=mixtures, wait=wait,
            sources={k: _minus(v, earlier.sources.get(k)) for k, v in self.sources.items()},
            schemes={k: _minus(v, earlier.schemes.get(k)) for k, v in self.schemes.items()},
            cache={k: v - earlier.cache.get(k, 0) for k, v in self.cache.items()})


def _minus(value, earlier):
    if earlier is None:
        return value
    changes = {}
    for f in dataclasses.fields(value):
        mine = getattr(value, f.name)
        if isinstance(mine, (int, float)) and not isinstance(mine, bool) and f.name not in _KEYS:
            changes[f.name] = mine - getattr(earlier, f.name)
    return dataclasses.replace(value, **changes)


_KEYS = {"epoch", "rank", "worker", "target", "threads", "ready_s", "longest_seconds"}


def _worker_minus(worker: WorkerStats, earlier: WorkerStats | None) -> WorkerStats:
    if earlier is None:
        return worker
    stages = {name: seconds - earlier.stages.get(name, 0.0) for name, seconds in worker.stages.items()}
    return dataclasses.replace(worker, wall_seconds=worker.wall_seconds - earlier.wall_seconds, stages=stages)


# ---------------------------------------------------------------- building one from the records


def current() -> Snapshot:
    """The current run's snapshot, from every process's record (empty, ``enabled=False``, when stats are off)."""
    settings = current_settings()
    if settings is None:
        return Snapshot()
    recorder = recorder_for(settings)
    ranks = recorder.ranks if recorder is not None else None
    return build(read_records(settings), enabled=True, cpus=cpus(), ranks=ranks)


def build(records: list[dict], enabled: bool = True, cpus: int = 1, ranks: RanksStats | None = None) -> Snapshot:
    """The snapshot of a run from its processes' records (pure)."""
    stage_rows = {name: [0] * len(StageTally.FIELDS) for name in STAGES}
    seconds = dict.fromkeys(ALL_STAGES, 0.0)
    sources: dict[str, list[int]] = {}
    schemes: dict[str, list[int]] = {}
    workers: dict[tuple[int, int], dict] = {}
    mixtures: dict[tuple[str, int, str], list] = {}
    cache: dict[str, int] = {}
    wait = None
    for record in records:
        mine = _process_seconds(record)
        for name, row in record["stages"].items():
            total = stage_rows.setdefault(name, [0] * len(StageTally.FIELDS))
            for i, value in enumerate(row):
                total[i] = max(total[i], value) if StageTally.FIELDS[i] == "threads" else total[i] + value
        for name, value in mine.items():
            seconds[name] += value
        for into, rows in ((sources, record["sources"]), (schemes, record["schemes"])):
            for label, row in rows.items():
                total = into.setdefault(label, [0] * len(SourceTally.FIELDS))
                for i, value in enumerate(row):
                    total[i] += value
        if any(mine.values()) or not record.get("main"):
            key = (record["rank"], record["worker"], record["pid"] if record["worker"] == -2 else 0)
            worker = workers.setdefault(key, {"processes": 0, "wall": 0.0, "stages": dict.fromkeys(ALL_STAGES, 0.0),
                                              "pids": []})
            worker["processes"] += 1
            worker["pids"].append(record["pid"])
            worker["wall"] += record["wall_ns"] * _NS
            for name, value in mine.items():
                worker["stages"][name] += value
        for mixer, epoch, source, count, target in record["mixtures"]:
            entry = mixtures.setdefault((mixer, epoch, source), [0, target])
            entry[0] += count
        for name, value in record.get("counters", {}).get("cache", {}).items():
            cache[name] = cache.get(name, 0) + value
        if record.get("wait") is not None:
            wait = _wait(record["wait"])
    stages = {name: _stage(name, stage_rows.get(name), seconds[name]) for name in ALL_STAGES}
    return Snapshot(
        enabled=enabled, processes=len(records), stages=stages,
        sources={label: _source(label, row) for label, row in sorted(sources.items())},
        schemes={name: _source(name, row) for name, row in sorted(schemes.items())},
        workers=tuple(WorkerStats(rank, worker, w["processes"], w["wall"], w["stages"], tuple(w["pids"]))
                      for (rank, worker, _), w in sorted(workers.items())),
        mixtures=_realized([MixStats(mixer, epoch, source, count, target)
                            for (mixer, epoch, source), (count, target) in sorted(mixtures.items())]),
        wait=wait, ranks=ranks, cache=cache, cpus=cpus)


def _process_seconds(record: dict) -> dict[str, float]:
    """Each stage's seconds in one process, ``other`` and ``handover`` from its wall clock. In
    the training process itself (pipes read without loader workers, or in a thread of it) the
    rest of the wall clock is the training loop's own, not a hand-over: it counts nowhere."""
    out = {}
    for name, row in record["stages"].items():
        out[name] = _estimate(row) * _NS
    out["other"] = max(0, record["other_ns"]) * _NS
    busy = sum(out.values())
    out["handover"] = max(0.0, record["wall_ns"] * _NS - busy) if busy and not record.get("main") else 0.0
    return out


def _estimate(row: list[int]) -> float:
    """A stage's ns: what was timed whole, each timed sample's ns times the samples it stands
    for, and the samples of gaps not closed yet at the timed ones' mean (see ``StageTally``)."""
    exact, calls, timed, ns, weighted_calls, weighted_ns = row[2:8]
    return exact + weighted_ns + (max(0, calls - weighted_calls) * ns / timed if timed else 0.0)


def _stage(name: str, row: list[int] | None, seconds: float) -> StageStats:
    if row is None:
        return StageStats(name, seconds=seconds)
    items, nbytes, _, calls, timed, _, _, _, errors, retries, threads = row
    return StageStats(name, items, nbytes, seconds, calls, timed, errors, retries, threads)


def _source(name: str, row: list[int]) -> SourceStats:
    samples, objects, nbytes, read_ns, _, _, sampled_ns, open_ns, retries, errors, hits, misses, cached = row
    read = (read_ns + sampled_ns) * _NS
    return SourceStats(name, samples, objects, nbytes, read, open_ns * _NS, retries, errors, hits, misses, cached)


def _wait(row: list) -> WaitStats:
    return WaitStats(*row)


def _realized(mixes: list[MixStats]) -> tuple[MixStats, ...]:
    totals: dict[tuple[str, int], int] = {}
    for mix in mixes:
        totals[(mix.mixer, mix.epoch)] = totals.get((mix.mixer, mix.epoch), 0) + mix.samples
    return tuple(dataclasses.replace(m, realized=m.samples / totals[(m.mixer, m.epoch)]
                                     if totals[(m.mixer, m.epoch)] else 0.0) for m in mixes)


def spread(values: list[float]) -> tuple[float, float, float]:
    """(min, median, max) of ``values`` (zeros for none)."""
    if not values:
        return 0.0, 0.0, 0.0
    return min(values), statistics.median(values), max(values)
