"""More than one observer at once: a trace file and profiler ranges, or one of your own beside them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["observers"]


class _Factories:
    """A picklable factory of one observer per process that hands every call to each of theirs."""

    def __init__(self, factories: tuple[Callable[[dict], Any], ...]):
        self.factories = factories

    def __call__(self, process: dict) -> Any:
        made = [factory(process) for factory in self.factories]
        made = [observer for observer in made if observer is not None]
        return made[0] if len(made) == 1 else _Fanout(made)


class _Fanout:
    def __init__(self, made: list[Any]):
        self.made = made
        self.live_ones = [observer for observer in made if getattr(observer, "live", False)]
        self.live = bool(self.live_ones)

    def begin(self, stage: str, label: str) -> None:
        for observer in self.live_ones:
            observer.begin(stage, label)

    def end(self, stage: str, label: str) -> None:
        for observer in reversed(self.live_ones):
            observer.end(stage, label)

    def span(self, stage: str, label: str, start: int, end: int) -> None:
        for observer in self.made:
            observer.span(stage, label, start, end)


def observers(*factories: Callable[[dict], Any]) -> Callable[[dict], Any]:
    """One observer factory for ``enable(observer=...)`` made of several (each picklable): every
    process gets one observer of each, and each sees every interval.

    Example:
        >>> trace = wd.stats.TraceFile("data.trace.json")
        >>> wd.stats.enable(observer=wd.stats.observers(trace, wd.stats.ProfilerRanges()))
    """
    if not factories:
        raise ValueError("observers: give at least one observer factory")
    return _Factories(tuple(factories))
