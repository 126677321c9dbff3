"""A Chrome / Perfetto trace of the stages over time, one track per process and thread.

:class:`TraceFile` is an observer factory for ``wd.stats.enable(observer=...)``: in each
process that measures (every loader worker, and the training process where it reads pipes
itself) it keeps the timed intervals and appends them, every ``interval_s`` and when the
process exits, to a part file in the run folder. :meth:`TraceFile.write` merges the parts
into one JSON file in the Trace Event Format (``{"traceEvents": [...]}``, complete events
``"ph": "X"`` with ``ts`` and ``dur`` in microseconds, ``pid`` the process, ``tid`` its
thread), which ``chrome://tracing`` and https://ui.perfetto.dev open.

Timestamps are ``time.perf_counter_ns`` (CLOCK_MONOTONIC: one clock for the processes of a
machine). Per-sample stages show their timed samples only (about one in a gap: see
:mod:`wds_datapipes.stats.probe`); reads, openings, listing and batches show every one.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing.util
import os
import threading
import uuid

from ..recorder import current_recorder
from ..settings import current_settings

__all__ = ["TraceFile"]

_SUFFIX = ".trace"  # part files in the run folder (the records are .json: read_records skips these)


class TraceFile:
    """An observer factory that records the stages of every process into one trace file.

    Args:
        path: the trace file :meth:`write` makes (``.json``).
        interval_s: the most time a process keeps its intervals before appending them to its
            part file.

    Example:
        >>> trace = wd.stats.TraceFile("data.trace.json")
        >>> wd.stats.enable(observer=trace)
        >>> for batch in wd.stats.watch(loader): ...
        >>> trace.write()              # before disable(): the parts are in the run folder
    """

    def __init__(self, path: str | os.PathLike, interval_s: float = 0.5):
        self.path = os.fspath(path)
        self.interval_s = float(interval_s)

    def __call__(self, process: dict) -> _TraceWriter:
        return _TraceWriter(process["directory"], process["pid"], self.interval_s)

    def write(self, directory: str | None = None) -> str:
        """Merges every process's intervals so far into :attr:`path`; returns the path.

        Call it while the run is on (its parts live in the run folder, removed by ``disable()``),
        after the loop: workers that ended flushed theirs when they exited, persistent workers
        every ``interval_s``. ``directory``: the run folder (default: the current run's)."""
        if directory is None:
            settings = current_settings()
            if settings is None:
                raise RuntimeError("TraceFile.write: stats are off (the trace's parts are in the run folder, "
                                   "removed by disable(): write the trace before it)")
            directory = settings.directory
        _flush_all()
        events = merged(directory)
        part = f"{self.path}.part"
        with open(part, "w") as out:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, out, separators=(",", ":"))
        os.replace(part, self.path)
        return self.path


def merged(directory: str) -> list[dict]:
    """The trace events of every part file in ``directory``: process names first, then the
    intervals of each process, in time order."""
    names: list[dict] = []
    events: list[dict] = []
    try:
        parts = sorted(name for name in os.listdir(directory) if name.endswith(_SUFFIX))
    except OSError:
        parts = []
    for name in parts:
        pid, who = 0, None
        try:
            with open(os.path.join(directory, name)) as source:
                lines = source.read().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                row = json.loads(line)
            except ValueError:  # a line cut short by a process killed while appending
                continue
            if isinstance(row, dict):
                pid, who = row["pid"], row
                continue
            stage, label, t0, t1, tid = row
            events.append({"name": stage, "cat": "wds_datapipes", "ph": "X", "ts": t0 / 1000,
                           "dur": (t1 - t0) / 1000, "pid": pid, "tid": tid, "args": {"source": label}})
        if who is not None:
            names.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": _process_name(who)}})
            names.append({"name": "process_sort_index", "ph": "M", "pid": pid,
                          "args": {"sort_index": who["rank"] * 1000 + who["worker"] + 2}})
    events.sort(key=lambda event: (event["pid"], event["ts"]))
    return names + events


def _process_name(who: dict) -> str:
    worker = who["worker"]
    place = "training process" if worker == -1 else f"worker {worker}" if worker >= 0 else "loader worker"
    return f"rank {who['rank']} {place} (pid {who['pid']})"


class _TraceWriter:
    """One process's observer: intervals kept in a list, appended to its part file by a thread."""

    live = False

    def __init__(self, directory: str, pid: int, interval_s: float):
        self.directory = directory
        self.path = os.path.join(directory, f"p{pid}-{uuid.uuid4().hex[:8]}{_SUFFIX}")
        self.pid = pid
        self._events: list[tuple] = []
        self._said: tuple | None = None
        self._lock = threading.Lock()
        self._ident = threading.get_ident  # no system call (get_native_id makes one); the OS's id at flush
        self._natives: dict[int, int] = {}
        self._stop = threading.Event()
        _writers.append(self)
        threading.Thread(target=self._loop, args=(interval_s,), name="wds-stats-trace", daemon=True).start()
        multiprocessing.util.Finalize(self, self.flush, exitpriority=100)  # a loader worker's exit

    def span(self, stage: str, label: str, start: int, end: int) -> None:
        self._events.append((stage, label, start, end, self._ident()))

    def flush(self) -> None:
        """Appends the intervals kept so far to the part file (and who this process is, where that changed)."""
        if self.pid != os.getpid():
            return
        with self._lock:
            events, self._events = self._events, []
            recorder = current_recorder()
            who = (recorder.rank, recorder.worker) if recorder is not None else (0, -2)
            lines = []
            if who != self._said:
                lines.append(json.dumps({"pid": self.pid, "rank": who[0], "worker": who[1]}))
                self._said = who
            natives = self._natives
            if any(event[4] not in natives for event in events):
                natives.update((t.ident, t.native_id) for t in threading.enumerate() if t.native_id is not None)
            lines.extend(json.dumps((*event[:4], natives.get(event[4], event[4])), separators=(",", ":"))
                         for event in events)
            if not lines:
                return
            try:
                with open(self.path, "a") as out:
                    out.write("\n".join(lines) + "\n")
            except OSError:  # the run is over (its folder removed)
                self._stopped()

    def _loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            if not os.path.isdir(self.directory):  # the run is over: nothing more to write
                self._stopped()
                return
            self.flush()

    def _stopped(self) -> None:
        self._stop.set()
        if self in _writers:
            _writers.remove(self)


_writers: list[_TraceWriter] = []


def _flush_all() -> None:
    for writer in _writers[:]:  # a copy: a writer whose run is over leaves the list
        writer.flush()


atexit.register(_flush_all)  # the training process's exit (a loader worker's: each writer's Finalize)


def _after_fork() -> None:
    _writers.clear()  # a forked child makes its own (its parent's writer and thread are not its)


os.register_at_fork(after_in_child=_after_fork)

