"""The meters stage code uses through a :class:`~.probe.Probe`: a :class:`Sampler` for per-sample
work, a :class:`TimedStream` for a shard's reads, a :class:`BatchMeter` for whole-batch decoding.
See :mod:`.probe` for what is timed how."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from .recorder import counters_delta, read_counters
from .tallies import FLUSH_READS, IoTarget, SourceTally

_now = time.perf_counter_ns
# A sample whose stage takes this long or longer is timed every time: timing one (two clock reads
# and the bookkeeping, 1-3 us) costs under 0.3% of it. Cheaper samples are timed one in a gap
# that grows as they get cheaper (about TIME_ALL_NS of work a gap), up to ``sample_every``.
TIME_ALL_NS = 1_000_000
# Under CPU contention a sample of microseconds can span another process's time slice (~10 ms),
# which, scaled by its gap, would swamp a stage's estimate: once a stage has CAP_AFTER timed
# samples, one counts at most CAP_RATIO times their mean (and at least CAP_FLOOR_NS).
CAP_AFTER = 16
CAP_RATIO = 20
CAP_FLOOR_NS = 200_000


class Sampler:
    """One sample in a jittered gap of about ``sample_every`` timed, every sample counted.

    A loop that runs a whole share or epoch keeps the countdown in a local (``due``, a small
    int: nothing is allocated per sample) and leaves it with :meth:`save`::

        sampler = probe.sampler("decode") if probe is not None else None
        due = sampler.due if sampler is not None else 0      # 0: off, never decremented
        for ...:
            t0 = 0
            if due:
                due -= 1
                if not due:
                    t0 = sampler.start()
            item = produce()                                   # the timed work
            if t0:
                due = sampler.stop(t0)
            yield item
        ...
        finally: sampler.save(due)

    ``tick()`` in place of start/stop counts without timing. Loops that run a shard at a
    time (and may interleave, under a mixture) share this thread's sampler of their stage
    through :meth:`wrap`, whose countdown lives on the sampler.
    """

    __slots__ = ("_a0", "_bytes", "_last", "_timed", "_weighted", "armed", "calls", "due", "io", "label", "name",
                 "probe", "source", "stage")

    def __init__(self, probe: Any, name: str, calls: bool, source: SourceTally | None = None, label: str = "",
                 io: IoTarget | None = None):
        self.probe, self.name, self.stage, self.calls = probe, name, probe.stages[name], calls
        self.source, self.label = source, label  # where the samples come from (its ``samples`` count them)
        self.io = io  # reads by member places, a sample at a time: each timed sample is one read of it
        self.armed = self.due = self._gap()  # the gap the countdown started at, and where it stands
        self._a0 = 0
        # by position: timed samples not moved into the tallies yet (see stop_at), the position
        # after the last of them, and their weighted time and bytes
        self._timed = self._last = self._weighted = self._bytes = 0

    def start(self) -> int:
        probe = self.probe
        self._a0 = probe.accounted
        if probe.live:
            probe.observer.begin(self.name, self.label)
        return _now()

    def stop(self, t0: int) -> int:
        """The timed sample ended: its time counts for the countdown's gap; returns the next countdown."""
        n = self.armed
        weighted = self._record(t0, n)
        stage = self.stage
        stage.weighted_calls += n
        stage.weighted_ns += weighted
        return self.tick()

    def _record(self, t0: int, n: int) -> int:
        """A timed sample that stands for ``n`` (its gap) ended: its time (capped) counts for the
        stage's mean and is claimed times ``n``; returns that weighted time."""
        t1 = _now()
        probe, stage = self.probe, self.stage
        ns = t1 - t0 - (probe.accounted - self._a0)
        timed = stage.timed
        if timed >= CAP_AFTER:  # a time slice of another process is not this sample's work
            cap = CAP_RATIO * stage.ns // timed
            if ns > cap and ns > CAP_FLOOR_NS:
                ns = max(cap, CAP_FLOOR_NS)
        weighted = ns * n
        stage.timed = timed + 1
        stage.ns += ns
        probe.accounted += weighted
        if probe.observer is not None:
            if probe.live:
                probe.observer.end(self.name, self.label)
            probe.observer.span(self.name, self.label, t1 - ns, t1)
        return weighted

    def tick(self) -> int:
        """A gap's samples went by: count them, and start the next gap; returns the countdown."""
        self._count(self.armed)
        self.armed = self.due = self._gap()
        return self.due

    def save(self, due: int) -> None:
        """A loop leaves off with its countdown at ``due``: what went by is counted, and claimed
        at the stage's mean time so far; the countdown is kept."""
        passed = self.armed - due
        if passed > 0:
            self._count(passed)
            stage = self.stage
            if self.calls and stage.timed:
                self.probe.accounted += passed * stage.ns // stage.timed
        self.armed = self.due = due if due > 0 else self._gap()

    def _gap(self) -> int:
        return self.probe.gap(self.stage if self.calls else None)  # a sampler that only counts: the longest

    def add(self, n: int) -> None:
        """``n`` more samples went by (a loop that counts them itself)."""
        if n > 0:
            self._count(n)

    # -- by position: a loop that counts its samples already (``position += 1``) needs no countdown.
    # Each timed sample updates the stage's mean (its time, capped) and what this thread claimed at
    # once; the samples up to it, their weighted time and (with an ``io`` target: each sample is one
    # read of it) bytes go into the tallies every FLUSH_READS timed samples and where the loop ends,
    # as timed reads do (:class:`~.tallies.IoTarget`): an integer increment costs 350-400 instructions
    # in CPython, and these are fourteen, into the stage's, the source's and the scheme's tallies.
    # A snapshot taken meanwhile lacks at most FLUSH_READS - 1 gaps of the loop; the end's is exact.

    def first_at(self, position: int) -> int:
        """The position of the first sample to time, for a loop that starts at ``position``."""
        self._flush()
        self.armed = self._last = position  # here: where the samples not counted yet start
        return position + self._gap() - 1

    def stop_at(self, t0: int, position: int, nbytes: int = 0) -> int:
        """The sample at ``position`` was timed (see :meth:`_record`), one read of ``nbytes`` where the
        sampler has an ``io`` target: it stands for the samples since the last one timed; returns
        the next position to time."""
        n = position + 1 - self._last
        self._last = position + 1
        self._weighted += self._record(t0, n)
        self._bytes += nbytes * n
        self._timed += 1
        if self._timed >= FLUSH_READS:
            self._flush()
        return position + self.probe.gap(self.stage)

    def finish_at(self, position: int) -> None:
        """The loop left off at ``position`` (the samples before it handed out): count the rest."""
        self._flush()
        self.add(position - self.armed)
        self.armed = self._last = position

    def _flush(self) -> None:
        """Moves the timed samples kept here, and the samples up to the last of them, into the tallies."""
        timed = self._timed
        if not timed:
            return
        n, weighted, nbytes = self._last - self.armed, self._weighted, self._bytes
        self.armed = self._last
        self._timed = self._weighted = self._bytes = 0
        self._count(n)
        stage = self.stage
        stage.weighted_calls += n
        stage.weighted_ns += weighted
        if self.io is not None:
            stage.bytes += nbytes
            self.io.sampled(n, timed, weighted, nbytes)

    def pending(self) -> int:
        """Samples of the current gap that went by and are not counted yet."""
        return self.armed - self.due

    def _count(self, n: int) -> None:
        stage = self.stage
        stage.items += n
        if self.calls:
            stage.calls += n
        if self.source is not None:
            self.source.samples += n

    def wrap(self, items: Iterable, source: SourceTally | None = None) -> Iterator:
        """``items``, each next() of theirs the sampled work, the countdown on this sampler (shared
        by loops that interleave); ``source`` counts the items of this loop. A generator step per
        item: for stages whose items cost microseconds, not the hottest loops."""
        nxt = iter(items).__next__
        n = 0
        try:
            while True:
                self.due -= 1
                if self.due:
                    try:
                        item = nxt()
                    except StopIteration:
                        self.due += 1
                        return
                else:
                    t0 = self.start()
                    try:
                        item = nxt()
                    except StopIteration:
                        self.due = 1  # the timed next() found the end: time the next item instead
                        if self.probe.live:
                            self.probe.observer.end(self.name, self.label)
                        return
                    self.stop(t0)
                n += 1
                yield item
        finally:
            if source is not None:
                source.samples += n


class BatchMeter:
    """A pipe that decodes whole batches (``decode_batches``): per batch, the time it works on one
    (decode; with threads, also the wait for them) with its collation apart (batch)."""

    __slots__ = ("_collate_ns", "batch", "decode", "probe")

    def __init__(self, probe: Any, threads: int):
        self.probe = probe
        self.decode = probe.stage("decode", threads)
        self.batch = probe.stages["batch"]
        self._collate_ns = 0

    def begin(self) -> int:
        self._collate_ns = 0
        if self.probe.live:
            self.probe.observer.begin("decode", "")
        return _now()

    def collating(self) -> int:
        return _now()

    def collated(self, t0: int) -> None:
        self._collate_ns += _now() - t0
        self.batch.items += 1

    def failed(self, samples: int) -> None:
        self.decode.errors += samples

    def end(self, t0: int, samples: int) -> None:
        """A step of the pipe ended: ``samples`` more were started decoding."""
        t1 = _now()
        decode, collate = self.decode, self._collate_ns
        decode.items += samples
        decode.exact_ns += t1 - t0 - collate
        self.batch.exact_ns += collate
        if self.probe.live:
            self.probe.observer.end("decode", "")
        self.probe.claim("decode", "", t0, t1)


class TimedStream:
    """A shard's stream whose read calls are timed and counted (bytes, time, errors); every other
    attribute is the stream's own."""

    def __init__(self, raw: Any, probe: Any, target: IoTarget):
        self._raw, self._probe, self._target = raw, probe, target
        self.offset = 0  # bytes returned so far: where the next read starts (the stall watchdog's)
        self._readinto = getattr(raw, "readinto", None)

    def readinto(self, buffer) -> int:
        probe, target = self._probe, self._target
        probe.io = target
        if probe.live:
            probe.observer.begin("read", target.label)
        t0 = _now()
        try:
            if self._readinto is not None:
                n = self._readinto(buffer) or 0
            else:
                data = self._raw.read(len(buffer))
                n = len(data)
                memoryview(buffer).cast("B")[:n] = data
        except BaseException:
            target.error()
            raise
        finally:
            t1 = _now()
            if probe.live:
                probe.observer.end("read", target.label)
        ns = t1 - t0  # IoTarget.read and Probe.claim, inline: a call per read of the stream
        probe.accounted += ns
        target.ns += ns
        target.nbytes += n
        target.reads += 1
        self.offset += n
        if target.reads >= FLUSH_READS:
            target.flush()
            probe.recorder.last_ns = t1
        if probe.observer is not None:
            probe.observer.span("read", target.label, t0, t1)
        return n

    def read(self, size: int = -1) -> bytes:
        data = self._probe.read_call(self._target, self._raw.read, size)
        self.offset += len(data)
        return data

    def close(self) -> None:
        """Closes the stream; what the shard cache read from its disk meanwhile counts for the source."""
        self._target.flush()
        before = read_counters("cache")
        try:
            self._raw.close()
        finally:
            moved = counters_delta(before, read_counters("cache"))
            if moved and moved.get("disk_bytes"):
                self._target.cache_bytes(moved["disk_bytes"])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)
