"""Rounds, pairing, medians and ratios: how every benchmark times its paths.

A *path* is one way of doing the benchmark's work (ours, a peer, the bare loop), given as a
callable that does the work once and returns what it produced: a count (samples, files,
objects) or ``(count, bytes)``. ``time_in_turn`` runs every path once a round, the paths in
turn and the order reversed every other round, so that a slow spell of a shared machine
falls on every path alike and no path is always first. What a path took in each round is
kept (``Timings``); a rate is the **median** of its rounds, never the best, and a ratio of
two paths is taken **within each round** (the pair ran seconds apart) and summed up as the
median of those pairs and their range (``Ratio``).
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field


class BenchError(RuntimeError):
    """A path did something other than its work: the wrong count, or no rounds to sum up."""


def own_and_reaped_cpu() -> float:
    """CPU seconds (user + system) of this process, every thread, and of its children that
    have been waited for (loader workers that ended, ``cp``, subprocesses)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@dataclass(frozen=True)
class Clock:
    """What a run is measured by: ``wall`` and ``cpu`` seconds, and optional ``parts`` (named
    CPU meters, e.g. a loader's workers and a cluster's nodes), each a callable read before
    and after the run. A test gives fake ones."""

    wall: Callable[[], float] = time.perf_counter
    cpu: Callable[[], float] = own_and_reaped_cpu
    parts: Mapping[str, Callable[[], float]] = field(default_factory=dict)

    def run(self, work: Callable[[], int | tuple[int, int]]) -> Run:
        """Does ``work`` once and returns what it took."""
        parts = {name: meter() for name, meter in self.parts.items()}
        wall, cpu = self.wall(), self.cpu()
        done = work()
        wall, cpu = self.wall() - wall, self.cpu() - cpu
        count, nbytes = done if isinstance(done, tuple) else (done, 0)
        return Run(wall, cpu, count, nbytes, {name: meter() - parts[name] for name, meter in self.parts.items()})


CLOCK = Clock()
PROCESS_CLOCK = Clock(cpu=time.process_time)  # CPU of this process only (its threads included)


@dataclass(frozen=True)
class Run:
    """One run of one path: seconds by the wall clock and of CPU, what it produced, its CPU parts."""

    wall: float
    cpu: float
    count: int
    nbytes: int = 0
    parts: Mapping[str, float] = field(default_factory=dict)

    def rate(self, of: str = "wall", unit: str = "count") -> float:
        """Items (``unit="count"``) or bytes (``"nbytes"``) a second, by the wall clock or by CPU."""
        seconds = self.wall if of == "wall" else self.cpu
        return getattr(self, unit) / max(seconds, 1e-12)


def median(values: Iterable[float]) -> float:
    """The median (of an even number: the mean of the middle two); never the best."""
    values = list(values)
    if not values:
        raise BenchError("a median of no rounds")
    return statistics.median(values)


def in_turn(rounds: int, paths: Sequence, start: int = 0) -> list[tuple[int, object]]:
    """(round, path) in the order they run: every path once a round, the order reversed every
    other round (rounds numbered from ``start``)."""
    paths = list(paths)
    return [(r, path) for r in range(start, start + rounds) for path in (paths if r % 2 == 0 else paths[::-1])]


@dataclass(frozen=True)
class Ratio:
    """A ratio of two paths taken within each round: the median of the pairs and their range."""

    value: float
    low: float
    high: float
    pairs: int

    @classmethod
    def of(cls, pairs: Iterable[float]) -> Ratio:
        pairs = list(pairs)
        return cls(median(pairs), min(pairs), max(pairs), len(pairs))

    def text(self, percent: bool = False) -> str:
        """``1.23 (1.10-1.31)``, or ``93% (90%-95%)``; the range only where more than one pair."""
        show = (lambda v: f"{v:.0%}") if percent else (lambda v: f"{v:.2f}")
        return show(self.value) + (f" ({show(self.low)}-{show(self.high)})" if self.pairs > 1 else "")

    def __str__(self) -> str:
        return self.text()


class Timings:
    """Each path's runs, one a round, in the order the rounds ran."""

    def __init__(self, paths: Iterable[str] = ()):
        self.runs: dict[str, list[Run]] = {name: [] for name in paths}

    def add(self, name: str, run: Run) -> None:
        self.runs.setdefault(name, []).append(run)

    def __contains__(self, name: str) -> bool:
        return bool(self.runs.get(name))

    def rounds(self, name: str) -> list[Run]:
        if not self.runs.get(name):
            raise BenchError(f"{name!r} was not measured")
        return self.runs[name]

    def rate(self, name: str, of: str = "wall", unit: str = "count") -> float:
        """The median of the path's rates a round (items or bytes a second, by the wall clock or by CPU)."""
        return median(run.rate(of, unit) for run in self.rounds(name))

    def seconds(self, name: str, of: str = "wall") -> float:
        """The median seconds of the path's rounds."""
        return median(run.wall if of == "wall" else run.cpu for run in self.rounds(name))

    def cpu_per(self, name: str, per: int = 1000, part: str | None = None) -> float:
        """The median CPU seconds (or of one ``part``) per ``per`` items."""
        return median((run.cpu if part is None else run.parts[part]) / max(run.count, 1) * per
                      for run in self.rounds(name))

    def paired(self, a: str, b: str, of: str = "wall", unit: str = "count") -> list[float]:
        """Each round's ratio of ``a``'s rate to ``b``'s (rounds where both ran)."""
        return [ra.rate(of, unit) / rb.rate(of, unit) for ra, rb in zip(self.rounds(a), self.rounds(b))]

    def ratio(self, a: str, b: str, of: str = "wall", unit: str = "count") -> Ratio:
        """``a``'s rate over ``b``'s, paired by round: above 1, ``a`` is faster (by CPU: thriftier)."""
        return Ratio.of(self.paired(a, b, of, unit))

    def last(self, name: str) -> Run:
        return self.rounds(name)[-1]


def time_in_turn(paths: Mapping[str, Callable[[], int | tuple[int, int]]], rounds: int, *, clock: Clock = CLOCK,
                 warm: bool = False, expect: int | None = None, timings: Timings | None = None,
                 after_each: Callable[[str], None] | None = None, start: int = 0) -> Timings:
    """Runs every path once a round, ``rounds`` rounds, the order reversed every other round.

    ``warm``: each path runs once first, untimed (page cache, connections, started workers).
    ``expect``: the count every run must produce (else ``BenchError`` naming the path).
    ``after_each``: called untimed after each run with the path's name (e.g. remove its output).
    ``timings``: add to these instead of new ones; ``start``: the number of the first round
    (a caller that runs one round at a time keeps the order alternating)."""
    if rounds < 1:
        raise BenchError(f"rounds must be at least 1, not {rounds}")
    timings = timings if timings is not None else Timings(paths)
    if warm:
        for work in paths.values():
            work()
    for _, name in in_turn(rounds, list(paths), start):
        run = clock.run(paths[name])
        if expect is not None and run.count != expect:
            raise BenchError(f"{name}: produced {run.count}, expected {expect}")
        timings.add(name, run)
        if after_each is not None:
            after_each(name)
    return timings

