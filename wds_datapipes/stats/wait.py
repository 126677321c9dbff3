"""The training loop's wait on data: ``for batch in stats.watch(loader)``, the same for every loader.

Two clock reads per batch: before and after ``next()`` on the loader's iterator. The time
inside is the wait (blocked), the time from handing a batch over to the next call is the
step. A step whose ``next()`` returned within ``ready_s`` did not wait: its batch was ready
(SPDL's data readiness). The default, 1 ms, is above what taking a batch that already waits
in a loader's queue costs (a DataLoader with workers hands over a batch of small tensors in
tens of microseconds, a batch of 64 crops through shared memory in a few hundred) and far
below a step of a model worth a GPU.

With an exporter (``enable(observer=...)``), each wait is also an interval of the stage
``wait`` in this process (a trace's track of the training process, a profiler's range).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

from .recorder import recorder_for
from .settings import current_settings

T = TypeVar("T")
_now = time.perf_counter_ns
READY_S = 0.001


class WaitTally:
    """The wait of the training loop in this process (``WaitStats``' fields, in ns)."""

    __slots__ = ("blocked_ns", "first_ns", "last_ns", "longest_ns", "ready_s", "ready_steps", "starts", "step_ns",
                 "steps")

    def __init__(self, ready_s: float):
        self.steps = self.blocked_ns = self.step_ns = self.ready_steps = self.first_ns = self.longest_ns = 0
        self.starts = self.last_ns = 0
        self.ready_s = ready_s

    def row(self) -> list:
        """``WaitStats``' fields, in its order (seconds)."""
        return [self.steps, self.blocked_ns * 1e-9, self.step_ns * 1e-9, self.ready_steps, self.first_ns * 1e-9,
                self.longest_ns * 1e-9, self.ready_s, self.starts, self.last_ns * 1e-9]


def watch(loader: Iterable[T], *, ready_s: float = READY_S, gather_every: int | None = None,
          group=None, stall_s: float | None = None) -> Iterator[T]:
    """Yields what iterating ``loader`` yields, measuring the loop's wait on it.

    Works the same over ``DataLoader``, ``StatefulDataLoader``, DataLoader2, a
    ``torchdata.nodes.Loader`` or a pipe iterated directly: only ``next()`` is timed. Call it
    again for each epoch; the counts add up. The waits at each epoch's edges count apart from
    the steps: for its first batch (from ``iter(loader)``: workers starting) and for its end
    (after the last batch: workers stopping). With stats off (see ``enable``) it is
    ``iter(loader)``.

    Args:
        ready_s: a step whose ``next()`` returned within this many seconds counts as ready.
        gather_every: every this many batches, gather every rank's wait over the process group
            (:func:`~wds_datapipes.stats.gather_ranks`: a collective, so every rank must take as
            many batches, as ``ExactEpochs`` gives them). None: never.
        group: the process group of that gather (default: the world).
        stall_s: where the loop waits this many seconds for one batch, log each process's
            threads, their stacks and the shard each reads (URL, server, byte offset) as a
            warning of the ``wds_datapipes.stats`` logger (:mod:`~wds_datapipes.stats.watchdog`);
            a long training step is no stall. None: no watchdog.

    Example:
        >>> for images, labels in wd.stats.watch(loader):
        ...     train_step(images, labels)
    """
    settings = current_settings()
    recorder = recorder_for(settings) if settings is not None else None
    if recorder is None:
        return iter(loader)
    if recorder.wait is None:
        recorder.wait = WaitTally(ready_s)
    if stall_s is not None and not stall_s > 0:
        raise ValueError(f"stall_s must be > 0, not {stall_s!r}")
    if stall_s is None:
        return _loop(loader, recorder, int(ready_s * 1e9), gather_every, group, None)
    return _watched(loader, recorder, int(ready_s * 1e9), gather_every, group, stall_s)


def _watched(loader: Iterable[T], recorder, ready_ns: int, gather_every: int | None, group,
             stall_s: float) -> Iterator[T]:
    from .watchdog import Watchdog

    dog = Watchdog(recorder.settings, stall_s)
    try:
        yield from _loop(loader, recorder, ready_ns, gather_every, group, dog)
    finally:  # the loop ended, broke off or failed: so does its watchdog
        dog.stop()


def _loop(loader: Iterable[T], recorder, ready_ns: int, gather_every: int | None, group, dog) -> Iterator[T]:
    wait = recorder.wait
    wait.starts += 1
    first = True
    handed = 0
    taken = 0
    observer = recorder.observer  # exporters: each wait beside the workers' stages (a trace); None: none
    live = observer is not None and getattr(observer, "live", False)  # ranges open while it waits (a profiler's)
    began = _now()
    source = iter(loader)  # a loader starts its workers here: part of the wait for the first batch
    while True:
        t0 = began if first else _now()
        if dog is not None:
            dog.waiting_since = t0
        if live:
            observer.begin("wait", "first batch" if first else "next()")
        try:
            item = next(source)
        except StopIteration:  # the wait for the epoch's end (a loader stops its workers)
            if live:
                observer.end("wait", "next()")
            wait.last_ns += _now() - t0
            if handed:
                wait.step_ns += t0 - handed  # the last batch's step
            return
        t1 = _now()
        if dog is not None:
            dog.waiting_since = 0
        blocked = t1 - t0
        if observer is not None:
            if live:
                observer.end("wait", "next()")
            observer.span("wait", "first batch" if first else "next()", t0, t1)
        if first:
            wait.first_ns += blocked
            first = False
        else:
            wait.steps += 1
            wait.blocked_ns += blocked
            wait.step_ns += t0 - handed
            if blocked <= ready_ns:
                wait.ready_steps += 1
            wait.longest_ns = max(wait.longest_ns, blocked)
        taken += 1
        if gather_every and taken % gather_every == 0:
            from .ranks import gather_ranks

            gather_ranks(group)
        handed = _now()
        yield item
