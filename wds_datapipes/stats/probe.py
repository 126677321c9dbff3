"""What stage code measures with: this thread's :class:`Probe` on the process's recorder, and its meters.

A pipe of ours takes :func:`~.settings.current_settings` when it is built (``self._stats``)
and, when its iteration starts, asks ``probe(self._stats)``: ``None`` when stats are off
(the pipe then runs its plain loop, reading no clock and allocating nothing), else this
thread's probe. Code below the pipes (readers, the retry loop) finds it with :func:`current`
once per shard, span or retry, never per sample.

How each kind of stage is timed:

- exact, where a clock read is cheap against the work: listing (per URL), opening (per
  shard), reading (per read call: up to a megabyte), batching (per batch);
- sampled, for per-sample work: a :class:`~.meters.Sampler` times one sample in a jittered
  gap and counts every sample (its countdown is a small int: nothing is allocated per
  sample); a stage's time is then ``ns * calls / timed``. The gap follows the stage's cost:
  every sample of a stage that takes :data:`~.meters.TIME_ALL_NS` or more (decoding, most transforms), up
  to one in about ``sample_every`` for stages of a few microseconds (tar, reads by member
  places). A timed sample far longer than its stage's mean counts as a bounded multiple of it
  (:data:`~.meters.CAP_RATIO`): that is another process's time slice, not the sample's work.
  Reads by member places keep their timed samples' counts on the sampler and move them into
  the tallies every 16 timed samples and where the loop ends: a snapshot taken mid-loop may
  miss up to 16 gaps of them (about a thousand samples); the counts at the end are exact.

``accounted`` (per thread) adds up the time the stages of this thread have claimed (exact
intervals, and each sampled interval times its gap). A sampled interval subtracts what was
claimed inside it (the reads inside a tar member's next()); a batching pipe takes the time
it waited on its source minus what was claimed meanwhile as code of nobody's ("other").

Exporters observe the timed intervals through the run's ``observer`` factory (see
:class:`~.settings.StatsSettings`): each process makes one observer; every timed interval
calls ``observer.span(stage, label, start_ns, end_ns)`` (``time.perf_counter_ns`` values:
one clock for every process of a machine) once it ends, and, where the observer's ``live``
attribute is true, ``observer.begin(stage, label)`` / ``observer.end(stage, label)`` around
it (torch.profiler ranges: listing, opening, reads, batches, whole-batch decoding, and the
timed samples of the sampled stages). With no observer this costs one ``is None`` test per
interval. The exporters built on it: :mod:`wds_datapipes.stats.export`.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from . import meters
from .meters import BatchMeter, Sampler, TimedStream
from .recorder import Recorder, counters_delta, current_recorder, read_counters, recorder_for
from .settings import StatsSettings
from .tallies import FLUSH_READS, IoTarget, MixTally, SourceTally, StageTally

__all__ = ["BatchMeter", "Probe", "Sampler", "TimedStream", "current", "probe", "retried"]

_local = threading.local()
_now = time.perf_counter_ns


class Probe:
    """This thread's handle on the process's recorder (made by :func:`probe`)."""

    __slots__ = (
        "_samplers",
        "_targets",
        "accounted",
        "every",
        "io",
        "live",
        "observer",
        "random",
        "recorder",
        "source",
        "stages",
    )

    def __init__(self, recorder: Recorder):
        self.recorder = recorder
        self.stages = recorder.stages
        self.accounted = 0  # ns the stages of this thread claimed so far (see the module)
        self.source: str | None = None  # the mixture source being drawn from now (set by the mixing pipes)
        self.io: IoTarget | None = None  # what the I/O going on now counts into (retries find it here)
        self.every = recorder.settings.sample_every
        self.observer = recorder.observer
        self.live = bool(getattr(self.observer, "live", False))
        self.random = random.Random().random  # ~40 ns a draw (randint takes ~20 times that)
        self._samplers: dict[str, Sampler] = {}
        self._targets: dict[tuple, IoTarget] = {}

    # ------------------------------------------------------------ keys

    def stage(self, name: str, threads: int = 0) -> StageTally:
        """Stage ``name``'s tally (``threads``: the pool the stage runs in, kept as the most seen)."""
        tally = self.stages[name]
        tally.threads = max(tally.threads, threads)
        return tally

    def target(self, stage: str, scheme: str | None, label: str) -> IoTarget:
        """Where an I/O event of ``stage`` counts: the mixture source being drawn from (else
        ``label``) and the URL ``scheme`` (None: no scheme's, as for listing)."""
        key = (stage, scheme, self.source or label)
        found = self._targets.get(key)
        if found is None:  # one per stage, scheme and source in a thread (reads kept in it: see IoTarget)
            recorder = self.recorder
            label = recorder.shown(self.source or label)
            tally = recorder.scheme(scheme) if scheme is not None else SourceTally()
            found = self._targets[key] = IoTarget(self.stages[stage], recorder.source(label), tally, label,
                                                  scheme or "")
        return found

    def gap(self, stage: StageTally | None = None) -> int:
        """The next sampling gap of ``stage``: 1 for a stage not timed yet, or one whose samples
        take ``TIME_ALL_NS`` or more; for cheaper ones about ``TIME_ALL_NS`` over their mean, at
        most ``sample_every``, jittered (from half to one and a half times it); never 0."""
        every = self.every
        if stage is not None:
            timed, ns = stage.timed, stage.ns
            if not timed:
                return 1
            if ns > 0 and meters.TIME_ALL_NS * timed // ns < every:  # no min()/max(): their argument parsing
                every = meters.TIME_ALL_NS * timed // ns  # costs ~500 instructions a call (a timed sample's)
        return int(every * (0.5 + self.random())) or 1

    def sampler(self, stage: str, calls: bool = True, source: SourceTally | None = None, label: str = "",
                io: IoTarget | None = None) -> Sampler:
        """A sampler of ``stage`` for one loop over a share or an epoch (see :class:`Sampler`).
        ``calls``: the samples are the stage's timed unit (else they count as its items only);
        ``source``: the source whose samples they are; ``io``: each sample is one read of it."""
        return Sampler(self, stage, calls, source, label, io)

    def shared_sampler(self, stage: str) -> Sampler:
        """This thread's sampler of ``stage`` for loops that run a shard at a time (:meth:`Sampler.wrap`):
        its countdown goes on across shards, whichever source they come from."""
        found = self._samplers.get(stage)
        if found is None:
            found = self._samplers[stage] = Sampler(self, stage, True)
            with self.recorder.lock:
                self.recorder.samplers.append(found)
        return found

    def mixture(self, mixer: str, epoch: int, names: tuple[str, ...], weights: tuple[float, ...]) -> MixTally:
        """The tally of one mixture's epoch: samples drawn per source, against ``weights`` (normalised here)."""
        total = sum(weights) or 1.0
        return self.recorder.mixture(mixer, epoch, tuple(names), tuple(w / total for w in weights))

    def place(self, rank: int, world: int, worker: int, workers: int) -> None:
        """Where this process reads (a pipe's topology): DataLoader2's workers say it no other way."""
        self.recorder.place(rank, world, worker, workers)

    # ------------------------------------------------------------ exact intervals

    def claim(self, stage: str, label: str, t0: int, t1: int) -> None:
        """An exact interval of ``stage`` ended: claimed for this thread, seen by the observer."""
        self.accounted += t1 - t0
        self.recorder.last_ns = t1
        if self.observer is not None:
            self.observer.span(stage, label, t0, t1)

    def opened(self, open_: Callable[..., Any], target: IoTarget, *args: Any, **kwargs: Any) -> Any:
        """``open_(*args, **kwargs)``, timed as one opening of ``target``; a failure counts as its error
        (and is raised); the shard cache's hits and misses meanwhile count for its source and scheme."""
        self.io = target
        before = read_counters("cache")
        if self.live:
            self.observer.begin("open", target.label)
        t0 = _now()
        try:
            opened = open_(*args, **kwargs)
        except BaseException:
            target.error()
            raise
        finally:
            t1 = _now()
            if self.live:
                self.observer.end("open", target.label)
        target.opened(t1 - t0, counters_delta(before, read_counters("cache")))
        self.claim("open", target.label, t0, t1)
        return opened

    def read_call(self, target: IoTarget, read: Callable[..., Any], *args: Any) -> Any:
        """``read(*args)`` (its result's length: the bytes read), timed as one read call of ``target``."""
        self.io = target
        if self.live:
            self.observer.begin("read", target.label)
        t0 = _now()
        try:
            data = read(*args)
        except BaseException:
            target.error()
            raise
        finally:
            if self.live:
                self.observer.end("read", target.label)
        t1 = _now()
        ns = t1 - t0  # what target.read and claim do, inline: a read a megabyte (in order, by places)
        self.accounted += ns
        target.ns += ns
        target.nbytes += len(data)
        target.reads += 1
        if target.reads >= FLUSH_READS:
            target.flush()
            self.recorder.last_ns = t1
        if self.observer is not None:
            self.observer.span("read", target.label, t0, t1)
        return data

    def reading(self, stream: Any, target: IoTarget) -> TimedStream:
        """``stream`` with each read call timed and counted into ``target``."""
        return TimedStream(stream, self, target)

    def listed(self, urls: Iterable[str], label: str) -> Iterator[str]:
        """``urls``, the wait for each timed as listing (the lister's expansion and listing calls)."""
        target = self.target("list", None, label)
        stage = target.stage
        source = iter(urls)
        try:
            while True:
                self.io = target
                if self.live:
                    self.observer.begin("list", label)
                t0 = _now()
                try:
                    url = next(source)
                except StopIteration:
                    return
                except BaseException:
                    target.error()
                    raise
                finally:
                    if self.live:
                        self.observer.end("list", label)
                t1 = _now()
                stage.items += 1
                stage.exact_ns += t1 - t0
                self.claim("list", label, t0, t1)
                yield url
        finally:
            self.ended()  # the reader's epoch ended (or it was dropped)

    def ended(self) -> None:
        """A pipe's iteration ended: a loader worker publishes its counts now, so that the training
        process finds them complete once the epoch is over."""
        self.recorder.flush()

    def batches(self, chunks: Iterable[list], combine: Callable[[list], Any]) -> Iterator[Any]:
        """Batches ``combine(chunk)`` for each chunk of samples: the wait for a chunk is the pipe's
        upstream (what no stage claimed in it is "other"), ``combine`` is the batch stage."""
        stage = self.stages["batch"]
        try:
            for samples in self.pulled(chunks):
                if self.live:
                    self.observer.begin("batch", "")
                t0 = _now()
                try:
                    batch = combine(samples)
                finally:
                    if self.live:
                        self.observer.end("batch", "")
                t1 = _now()
                stage.items += 1
                stage.exact_ns += t1 - t0
                self.claim("batch", "", t0, t1)
                yield batch
        finally:
            self.ended()

    def pulled(self, chunks: Iterable[list]) -> Iterator[list]:
        """``chunks`` (lists of samples for one batch), each wait for one timed: the part of it that
        no stage of this thread claimed is code we do not see (a ``.map`` of the user's)."""
        recorder = self.recorder
        source = iter(chunks)
        while True:
            t0, a0 = _now(), self.accounted
            try:
                samples = next(source)
            except StopIteration:
                return
            t1 = _now()
            recorder.other_ns += (t1 - t0) - (self.accounted - a0)
            recorder.pulls += 1
            recorder.last_ns = t1
            yield samples


def probe(settings: StatsSettings | None) -> Probe | None:
    """This thread's probe for a pipe that carries ``settings`` (None: the pipe measures nothing)."""
    if settings is None:
        return None
    recorder = recorder_for(settings)
    if recorder is None:
        return None
    found = getattr(_local, "probe", None)
    if found is None or found.recorder is not recorder:
        found = _local.probe = Probe(recorder)
    return found


def current() -> Probe | None:
    """This thread's probe, where a pipe of ours measures in this thread (once per shard or span: a lookup)."""
    found = getattr(_local, "probe", None)
    if found is None or found.recorder is not current_recorder():
        return None
    return found


def retried() -> None:
    """A retry of the I/O going on in this thread (the one retry loop calls it): counted for its
    stage, source and scheme."""
    found = current()
    if found is not None and found.io is not None:
        found.io.retry()
