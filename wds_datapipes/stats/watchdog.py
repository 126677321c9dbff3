"""The stall watchdog: when the training loop has waited ``stall_s`` for a batch, log what each process does.

``watch(loader, stall_s=120)`` starts one :class:`Watchdog` thread for the loop; the loop sets
``waiting_since`` before each ``next()`` and clears it after (two stores a batch). The thread
looks every ``min(1, stall_s / 4)`` seconds: a loop that waits (not one whose training step is
long) for ``stall_s`` is a stall. It then gathers every process of the run (:func:`stacks`):
this one's threads directly, each loader worker's through the run folder (:mod:`.stalls`), and
logs one warning on the ``wds_datapipes.stats`` logger: each process's threads with their
stacks and the shard each reads (URL with secrets redacted, server, byte offset). The record
carries the same as plain values in its ``stall`` attribute. A stall that goes on is logged
again each time its wait has doubled. The thread ends with the loop.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time

from . import stalls
from .recorder import read_records, recorder_for
from .settings import StatsSettings, current_settings

logger = logging.getLogger("wds_datapipes.stats")
_now = time.perf_counter_ns
_requests = itertools.count(1)


class Watchdog:
    """One watched loop's watchdog thread (see the module). ``waiting_since``: the
    ``perf_counter_ns`` at which the loop's current ``next()`` began, 0 while it does not wait."""

    def __init__(self, settings: StatsSettings, stall_s: float):
        self.settings, self.stall_s = settings, float(stall_s)
        self.waiting_since = 0
        self.stalls = 0  # warnings logged
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wds-stats-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """The loop ended: the thread ends at its next look (it is not waited for)."""
        self._stop.set()

    def _run(self) -> None:
        poll = min(1.0, self.stall_s / 4)
        episode, due = 0, self.stall_s
        while not self._stop.wait(poll):
            since = self.waiting_since
            if not since:
                continue
            if since != episode:  # a new wait: its first warning after stall_s
                episode, due = since, self.stall_s
            waited = (_now() - since) * 1e-9
            if waited < due:
                continue
            found = stacks(self.settings)
            if self._stop.is_set() or self.waiting_since != since:  # the batch came meanwhile
                continue
            found["waited_s"] = round((_now() - since) * 1e-9, 3)
            logger.warning("%s", describe(found), extra={"stall": found})
            self.stalls += 1
            due = 2 * max(due, found["waited_s"])  # next when the wait has doubled


def stacks(settings: StatsSettings | None = None, wait_s: float | None = None) -> dict:
    """What every process of the run is doing now: each thread's stack and the shard it reads.

    Returns plain values: ``processes``, one dict per process (``pid``, ``rank``, ``worker``:
    -1 for this process, the loader worker's id otherwise; ``threads``: each one's ``thread``
    name, ``stack`` (its frames as text, outermost first) and ``shard``: None, or the shard it waits
    on (the one it opened last, for a stream's reader), ``url`` (secrets redacted), ``host``,
    ``phase`` (``opening``, ``reading``, ``closed``), ``offset`` (the shard's byte the next read
    starts at) and ``seconds`` since it was opened (None for a read by member places)); ``silent``:
    the pids of live loader workers that did not answer within ``wait_s`` (default: twice the
    run's ``interval_s`` and a second; a worker holding the interpreter lock in native code cannot
    answer). Empty with stats off.
    """
    settings = settings or current_settings()
    if settings is None:
        return {"processes": [], "silent": []}
    recorder = recorder_for(settings)
    rank = recorder.rank if recorder is not None else (settings.rank or 0)
    workers = {r["pid"]: r for r in read_records(settings) if not r.get("main") and r["pid"] != os.getpid()
               and _alive(r["pid"])}
    number = f"{next(_requests)}{os.getpid():07d}"  # unique among the requests of this folder
    answers = _ask(settings.directory, number, set(workers), wait_s if wait_s is not None
                   else 2 * settings.interval_s + 1.0)
    own = stalls.process_row(rank, -1)
    processes = [own] + sorted(answers.values(), key=lambda row: (row.get("rank", 0), row.get("worker", 0)))
    return {"processes": processes, "silent": sorted(set(workers) - set(answers))}


def _ask(directory: str, number: str, pids: set[int], wait_s: float) -> dict[int, dict]:
    """Writes request ``number`` and collects the answers of ``pids`` (each answer file removed)."""
    if not pids:
        return {}
    path = os.path.join(directory, stalls.REQUEST)
    try:
        with open(f"{path}.part", "w") as out:
            json.dump({"n": int(number)}, out)
        os.replace(f"{path}.part", path)
    except OSError:  # the run is over
        return {}
    prefix = f"stall-{number}-p"
    answers: dict[int, dict] = {}
    deadline = time.monotonic() + wait_s
    while True:
        try:
            names = [n for n in os.listdir(directory) if n.startswith(prefix) and n.endswith(stalls.ANSWER_SUFFIX)]
        except OSError:
            names = []
        for name in names:
            file = os.path.join(directory, name)
            try:
                with open(file) as source:
                    row = json.load(source)
                os.remove(file)
            except (OSError, ValueError):
                continue
            answers[int(row["pid"])] = row
        if pids <= set(answers) or time.monotonic() >= deadline:
            return answers
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, a worker that exited and was not reaped yet, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as source:
            return source.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    return True


def describe(found: dict) -> str:
    """The text the watchdog logs for :func:`stacks`' result (``waited_s`` where it is set)."""
    waited = found.get("waited_s")
    head = (f"no batch for {waited:.1f} s: the training loop waits in next() on the loader"
            if waited is not None else "what each process of the run is doing")
    lines = [head + "; each process's threads, innermost frame last:"]
    for process in found["processes"]:
        who = "the training process" if process["worker"] == -1 else f"loader worker {process['worker']}"
        lines.append(f"{who} (rank {process['rank']}, pid {process['pid']}):")
        for thread in process["threads"]:
            lines.append(f"  thread {thread['thread']!r}" + _shard_words(thread["shard"]))
            lines.extend("    " + line.rstrip().replace("\n", "\n    ") for line in thread["stack"])
    for pid in found["silent"]:
        lines.append(f"loader worker pid {pid}: no answer (stuck holding the interpreter lock, or exiting)")
    return "\n".join(lines)


def _shard_words(shard: dict | None) -> str:
    if shard is None:
        return ""
    seconds = shard["seconds"]
    if shard["phase"] == "opening":
        return f": opening {shard['url']} (server {shard['host']})" + (f" for {seconds:.1f} s" if seconds else "")
    state = "read to its end or dropped" if shard["phase"] == "closed" else "reading"
    return (f": {state} {shard['url']} (server {shard['host']}), at byte offset {shard['offset']}"
            + (f", opened {seconds:.1f} s ago" if seconds is not None else ""))


__all__ = ["Watchdog", "describe", "stacks"]
