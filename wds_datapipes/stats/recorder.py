"""One process's counters of one run, and how a loader worker hands them to the training process.

A :class:`Recorder` is made in a process when the first pipe of ours that measures starts
iterating there. In the process that called :func:`~.settings.enable` it stays in memory
(the snapshot reads it there). In any other process (a loader worker, forked or spawned, of
any loader) a thread publishes it every ``interval_s`` as one small JSON file in the run
folder, replaced whole (``os.replace``), and once more when a pipe's epoch ends and when
the process exits: the batches the workers send are never touched. A worker started again
(a new epoch without persistent workers) writes a file of its own; the snapshot sums them.
"""

from __future__ import annotations

import json
import multiprocessing.util
import os
import threading
import time
import uuid
from collections.abc import Callable

from . import settings as _run
from .settings import StatsSettings
from .stalls import answer_request
from .tallies import STAGES, MixTally, SourceTally, StageTally

RECORD_VERSION = 1
_UNMADE = object()
_now = time.perf_counter_ns  # CLOCK_MONOTONIC on Linux: one clock for every process of a machine

# Counters that other rooms keep per process and the snapshot reports as each process's
# change since it started measuring (the shard cache registers its own).
_PROVIDERS: dict[str, Callable[[], dict[str, int]]] = {}


def register_counters(name: str, read: Callable[[], dict[str, int] | None]) -> None:
    """Report ``read()`` (a dict of integers, this process's counters; None where they do not
    move now) in every process's record, as their change since the process started measuring;
    the shard cache registers ``"cache"``."""
    _PROVIDERS[name] = read


def read_counters(name: str) -> dict[str, int] | None:
    """The counters registered as ``name``, read now (None when nothing registered them)."""
    read = _PROVIDERS.get(name)
    return read() if read is not None else None


class Recorder:
    """This process's counters for one run (one :func:`~.settings.enable`)."""

    def __init__(self, settings: StatsSettings):
        self.settings = settings
        self.pid = os.getpid()
        self.owner = settings.owner == self.pid
        self.lock = threading.Lock()  # taken to add a key, and to read the dicts whole
        self.stages = {name: StageTally() for name in STAGES}
        self.sources: dict[str, SourceTally] = {}
        self.schemes: dict[str, SourceTally] = {}
        self.mixtures: dict[tuple[str, int], MixTally] = {}
        self.samplers: list = []  # the threads' shared samplers: their current gaps count too
        self._shown: dict[str, str] = {}  # source labels, their secrets redacted
        self.started_ns = self.last_ns = _now()
        self.other_ns = 0  # time upstream of our batching pipes that no stage of ours accounts for
        self.pulls = 0
        self.rank, self.world, self.worker, self.workers = _identity(settings)
        self.baselines = {name: read() for name, read in _PROVIDERS.items()}
        self.wait = None  # the trainer's wait (watch), in the process that enabled stats
        self.ranks = None  # the last gather across ranks (a RanksStats), there too
        self.gathered = None  # (steps, wait ns, step ns, time) at this rank's last gather
        self._observer: object = _UNMADE
        self.path = os.path.join(settings.directory, f"p{self.pid}-{uuid.uuid4().hex[:8]}.json")
        self._written = ""
        self._stop = threading.Event()
        if not self.owner:
            thread = threading.Thread(target=self._publish_loop, name="wds-stats", daemon=True)
            thread.start()
            # a worker that is shut down without its pipes ending still hands over its last counts
            multiprocessing.util.Finalize(self, self.flush, exitpriority=100)

    @property
    def observer(self):
        """The run's observer in this process, made when a pipe first measures here (None: none)."""
        if self._observer is _UNMADE:
            make = self.settings.observer
            self._observer = None if make is None else make(
                {"pid": self.pid, "rank": self.rank, "worker": self.worker, "directory": self.settings.directory})
        return self._observer

    # ------------------------------------------------------------ keys

    def shown(self, label: str) -> str:
        """``label`` as records, reports and observers show it: a URL's secrets (a password, a
        presigned URL's signature) redacted as our errors redact them (asked once per label)."""
        found = self._shown.get(label)
        if found is None:
            from ..errors import redact

            found = self._shown[label] = redact(label)
        return found

    def source(self, label: str) -> SourceTally:
        """The tally of the source shown as ``label`` (see :meth:`shown`)."""
        return self._tally(self.sources, label)

    def scheme(self, name: str) -> SourceTally:
        """The tally of the URL scheme ``name``."""
        return self._tally(self.schemes, name)

    def _tally(self, tallies: dict[str, SourceTally], key: str) -> SourceTally:
        found = tallies.get(key)
        if found is None:
            with self.lock:  # a key added while the publisher reads the dict whole
                found = tallies.setdefault(key, SourceTally())
        return found

    def mixture(self, mixer: str, epoch: int, names: tuple[str, ...], targets: tuple[float, ...]) -> MixTally:
        key = (mixer, epoch)
        tally = self.mixtures.get(key)
        if tally is None or tally.names != names:
            with self.lock:
                tally = self.mixtures[key] = MixTally(mixer, epoch, names, targets)
        return tally

    def place(self, rank: int, world: int, worker: int, workers: int) -> None:
        """Where this process reads, as a pipe's topology says it (DataLoader2 tells no worker id
        otherwise); the training process reading its pipes itself stays worker -1."""
        self.rank, self.world = rank, world
        if not self.owner:
            self.worker, self.workers = worker, workers

    # ------------------------------------------------------------ the record

    def record(self) -> dict:
        """This process's counters as plain JSON values (what :mod:`.snapshot` sums)."""
        with self.lock:
            stages = {name: tally.row() for name, tally in self.stages.items()}
            for sampler in self.samplers:  # the samples of a gap under way (exact between two samples)
                row, pending = stages[sampler.name], max(0, sampler.pending())
                row[0] += pending  # items
                row[3] += pending  # calls
            sources = {label: tally.row() for label, tally in self.sources.items()}
            schemes = {name: tally.row() for name, tally in self.schemes.items()}
            mixtures = [row for tally in self.mixtures.values() for row in tally.rows()]
        counters = {}
        for name, read in _PROVIDERS.items():
            base, now = self.baselines.get(name) or {}, read() or self.baselines.get(name) or {}
            counters[name] = {key: value - base.get(key, 0) for key, value in now.items()}
        record = {"v": RECORD_VERSION, "pid": self.pid, "token": self.settings.token, "main": self.owner,
                  "rank": self.rank, "world": self.world, "worker": self.worker, "workers": self.workers,
                  "wall_ns": self.last_ns - self.started_ns, "other_ns": self.other_ns, "pulls": self.pulls,
                  "stages": stages, "sources": sources, "schemes": schemes, "mixtures": mixtures,
                  "counters": counters, "cpus": cpus()}
        if self.wait is not None:
            record["wait"] = self.wait.row()
        return record

    def publish(self) -> None:
        """Writes the record to this process's file in the run folder, where it changed."""
        text = json.dumps(self.record(), separators=(",", ":"))
        if text == self._written:
            return
        part = f"{self.path}.part"
        try:
            with open(part, "w") as out:
                out.write(text)
            os.replace(part, self.path)  # the reader sees the old record or the new, never half
        except OSError:  # the run is over (its folder removed): nothing to hand over any more
            self._stop.set()
            return
        self._written = text

    def flush(self) -> None:
        """Publishes now (a pipe's epoch ended); in the process that enabled stats there is nothing to do."""
        if not self.owner:
            with _publishing:
                self.publish()

    def _publish_loop(self) -> None:
        asked = None  # the stall watchdog's last request seen (see stalls)
        while not self._stop.wait(self.settings.interval_s):
            with _publishing:
                self.publish()
            asked = answer_request(self, asked)

    def close(self) -> None:
        self._stop.set()


_publishing = threading.Lock()
_recorder: Recorder | None = None
_making = threading.Lock()


def recorder_for(settings: StatsSettings) -> Recorder | None:
    """This process's recorder of the run ``settings`` name (made at the first use), or None
    where that run is over here."""
    global _recorder
    found = _recorder
    if found is not None and found.settings.token == settings.token and found.pid == os.getpid():
        return found
    if not _run.is_current(settings):
        return None
    with _making:
        found = _recorder
        if found is None or found.settings.token != settings.token or found.pid != os.getpid():
            if found is not None and found.pid == os.getpid():
                found.close()
            found = _recorder = Recorder(settings)
    return found


def current_recorder() -> Recorder | None:
    """This process's recorder of the current run, where one is measuring (no new one is made)."""
    found = _recorder
    if found is None or found.pid != os.getpid() or not _run.is_current(found.settings):
        return None
    return found


def read_records(settings: StatsSettings) -> list[dict]:
    """Every process's record of the run: this process's own from memory, the others' from their files."""
    records = []
    own = current_recorder()
    if own is not None and own.settings.token == settings.token:
        records.append(own.record())
    try:
        names = sorted(os.listdir(settings.directory))
    except OSError:
        names = []
    mine = f"p{os.getpid()}-"
    for name in names:
        if not name.endswith(".json") or (own is not None and name.startswith(mine)):
            continue
        try:
            with open(os.path.join(settings.directory, name)) as source:
                record = json.load(source)
        except (OSError, ValueError):  # gone or replaced between the listing and the read
            continue
        if record.get("v") == RECORD_VERSION and record.get("token") == settings.token:
            records.append(record)
    return records


def _identity(settings: StatsSettings) -> tuple[int, int, int, int]:
    """(rank, world, worker, workers) of this process as far as it can tell now; worker -1: the
    process that enabled stats (the training process), -2: a loader worker whose id is not known
    yet (a pipe's topology tells it later)."""
    from ..topology import distributed_rank_world, loader_worker

    found = distributed_rank_world()
    rank, world = found if found is not None else (settings.rank or 0, 1)
    worker = loader_worker()
    if worker is not None:
        return rank, world, worker[0], worker[1]
    return (rank, world, -1, 0) if settings.owner == os.getpid() else (rank, world, -2, 0)


def cpus() -> int:
    """The CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _after_fork() -> None:
    global _recorder, _publishing, _making
    _recorder = None  # a forked worker counts its own from zero (the parent's are not its)
    _publishing, _making = threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def counters_delta(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, int] | None:
    """``after - before``, key by key (None where either is None)."""
    if before is None or after is None:
        return None
    return {key: value - before.get(key, 0) for key, value in after.items()}

