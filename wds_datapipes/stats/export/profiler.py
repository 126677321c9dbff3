"""``torch.profiler`` ranges around the stages, while a profiler is recording in that process.

:class:`ProfilerRanges` is an observer factory for ``wd.stats.enable(observer=...)``. Its
observer opens a ``torch.profiler.record_function("wds_datapipes.<stage>")`` range as a stage
begins and closes it as it ends, so that the data stages show in the profiler's trace beside
the kernels. It checks whether a profiler records (``torch.autograd._profiler_enabled()``, a
C call) at each begin: with none, it opens nothing.

Where the ranges show: a profiler records the process it runs in. Ranges of the pipes read by
the training process itself (``num_workers=0``, a ``torchdata.nodes`` thread) show in its
trace; loader workers are other processes (their stages: :class:`~.trace.TraceFile`).
Listing, opening, reads, batches and whole-batch decoding get a range each time; per-sample
stages (tar, decode, transform) at their timed samples.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["ProfilerRanges"]


class ProfilerRanges:
    """An observer factory: ``torch.profiler`` ranges named ``<prefix><stage>`` (the source as
    the range's argument) around the stages, while a profiler records.

    Example:
        >>> wd.stats.enable(observer=wd.stats.ProfilerRanges())
        >>> with torch.profiler.profile() as prof:
        ...     for batch in loader: ...
        >>> [e.name for e in prof.events() if e.name.startswith("wds_datapipes.")]
    """

    live = True

    def __init__(self, prefix: str = "wds_datapipes."):
        self.prefix = prefix

    def __call__(self, process: dict) -> _Ranges:
        return _Ranges(self.prefix)


class _Ranges:
    """One process's observer: a stack of open ranges per thread, and how many are open in all
    (threads that open ranges at the same moment may miscount it: at worst a range stays open
    until its thread's next range of that stage)."""

    live = True

    def __init__(self, prefix: str):
        import torch.autograd
        import torch.profiler

        self._recording = torch.autograd._profiler_enabled
        self._range = torch.profiler.record_function
        self._names: dict[str, str] = {}
        self._local = threading.local()
        self._open = 0  # ranges open in this process: an end with none open returns at once
        self.prefix = prefix

    def begin(self, stage: str, label: str) -> None:
        if not self._recording():
            return
        stack = self._stack()
        if stack and stack[-1][0] == stage:  # one left open (an error between begin and end): close it
            self._open -= 1
            stack.pop()[1].__exit__(None, None, None)
        name = self._names.get(stage)
        if name is None:
            name = self._names[stage] = self.prefix + stage
        opened = self._range(name, label or None)
        opened.__enter__()
        stack.append((stage, opened))
        self._open += 1

    def end(self, stage: str, label: str) -> None:
        if not self._open:  # no profiler at any begin: the common case, one test
            return
        stack = getattr(self._local, "stack", None)
        if stack and stack[-1][0] == stage:  # else its begin found no profiler: nothing was opened
            self._open -= 1
            stack.pop()[1].__exit__(None, None, None)

    def span(self, stage: str, label: str, start: int, end: int) -> None:
        pass

    def _stack(self) -> list[tuple[str, Any]]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack
