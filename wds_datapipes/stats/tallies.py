"""The counters one process keeps: per stage, per source and scheme, per mixture; plain integers.

Stage code adds to these with integer increments only; clocks are read per shard, per read
call, per batch, or for one sample in a jittered gap of about ``sample_every``
(:mod:`.probe`). A tally is shared by the threads of a process that run pipes; an increment
from two threads at once may be lost (CPython does not make ``+=`` atomic), which only
happens where one process runs two pipelines in two threads at the same moment.
"""

from __future__ import annotations

#: The stages, in pipeline order (what each one counts: :class:`~wds_datapipes.stats.StageStats`).
STAGES = ("list", "open", "read", "tar", "decode", "transform", "batch")
# Derived from each process's wall clock, not counted: time upstream of a batching pipe of ours
# that no stage of ours accounts for (a user's .map, torch's pipes), and the rest of the time.
DERIVED = ("other", "handover")
#: :data:`STAGES` and the two derived from each process's wall clock: ``other`` and ``handover``.
ALL_STAGES = STAGES + DERIVED


class StageTally:
    """One stage in one process: ``exact_ns`` of work timed whole (reads, openings, batches), and
    ``calls`` units of sampled work (samples), ``timed`` of them timed, taking ``ns``. Each timed
    sample stands for the ``n`` samples of its gap (``weighted_calls`` in all, ``weighted_ns`` the
    sum of each one's time times its ``n``: right however the gaps vary), the samples of a gap not
    closed yet for the mean: the stage's time is ``exact_ns + weighted_ns + (calls -
    weighted_calls) * ns / timed`` (:func:`~.snapshot.build`)."""

    FIELDS = ("items", "bytes", "exact_ns", "calls", "timed", "ns", "weighted_calls", "weighted_ns", "errors",
              "retries", "threads")  # a record's row, in order
    __slots__ = FIELDS

    def __init__(self) -> None:
        self.items = self.bytes = self.exact_ns = self.calls = self.timed = self.ns = 0
        self.weighted_calls = self.weighted_ns = self.errors = self.retries = self.threads = 0

    def row(self) -> list[int]:
        return [getattr(self, name) for name in self.FIELDS]


class SourceTally:
    """One source (a shard list, an index, a mixture's source) or one URL scheme, in one process:
    its reads timed whole (``read_ns``), and reads of a sample each (by member places in a
    shuffled order), ``sampled_reads`` of them, ``timed_reads`` timed, each one's time times
    the reads of its gap summed in ``sampled_ns`` (an estimate of them all)."""

    FIELDS = ("samples", "objects", "bytes", "read_ns", "sampled_reads", "timed_reads", "sampled_ns", "open_ns",
              "retries", "errors", "cache_hits", "cache_misses", "cache_bytes")  # a record's row, in order
    __slots__ = FIELDS

    def __init__(self) -> None:
        self.samples = self.objects = self.bytes = self.read_ns = self.sampled_reads = self.timed_reads = 0
        self.sampled_ns = self.open_ns = self.retries = self.errors = 0
        self.cache_hits = self.cache_misses = self.cache_bytes = 0

    def row(self) -> list[int]:
        return [getattr(self, name) for name in self.FIELDS]


FLUSH_READS = 16  # an I/O target's timed reads kept to itself before they go into its three tallies


class IoTarget:
    """Where one I/O event counts: a stage's tally, its source's and its URL scheme's.

    A timed read adds to the target's own ``ns``, ``nbytes`` and ``reads`` (three increments in
    place of six); :meth:`flush` moves them into the tallies, every ``FLUSH_READS`` reads and
    where a shard or span ends."""

    __slots__ = ("label", "nbytes", "ns", "reads", "scheme", "scheme_name", "source", "stage")

    def __init__(self, stage: StageTally, source: SourceTally, scheme: SourceTally, label: str, scheme_name: str):
        self.stage, self.source, self.scheme = stage, source, scheme
        self.label, self.scheme_name = label, scheme_name
        self.ns = self.nbytes = self.reads = 0

    def flush(self) -> None:
        """Moves the reads kept here into the stage's, source's and scheme's tallies."""
        ns, nbytes = self.ns, self.nbytes
        self.ns = self.nbytes = self.reads = 0
        self.stage.exact_ns += ns
        self.stage.bytes += nbytes
        for tally in (self.source, self.scheme):
            tally.read_ns += ns
            tally.bytes += nbytes

    def counted(self, samples: int) -> None:
        """``samples`` were read (by member places in order: counted where a span ends)."""
        self.stage.items += samples
        self.source.samples += samples

    def retry(self) -> None:
        self.stage.retries += 1
        self.source.retries += 1
        self.scheme.retries += 1

    def error(self) -> None:
        self.stage.errors += 1
        self.source.errors += 1
        self.scheme.errors += 1

    def read(self, n: int, ns: int) -> None:
        """A timed read call of ``n`` bytes."""
        self.ns += ns
        self.nbytes += n
        self.reads += 1
        if self.reads >= FLUSH_READS:
            self.flush()

    def opened(self, ns: int, cache: dict[str, int] | None) -> None:
        """A timed opening; ``cache``: what the shard cache's counters moved by meanwhile."""
        stage = self.stage
        stage.items += 1
        stage.exact_ns += ns
        for tally in (self.source, self.scheme):
            tally.objects += 1
            tally.open_ns += ns
            if cache:
                tally.cache_hits += cache.get("hits", 0) + cache.get("read_along", 0)
                tally.cache_misses += cache.get("misses", 0)

    def sampled(self, reads: int, timed: int, ns: int, nbytes: int) -> None:
        """``timed`` timed reads of one sample each, standing for ``reads`` reads: their estimated
        ``ns`` and ``nbytes``."""
        for tally in (self.source, self.scheme):
            tally.sampled_reads += reads
            tally.timed_reads += timed
            tally.sampled_ns += ns
            tally.bytes += nbytes

    def cache_bytes(self, n: int) -> None:
        self.source.cache_bytes += n
        self.scheme.cache_bytes += n


class MixTally:
    """One mixture's epoch in one process: samples drawn per source against its target weights."""

    __slots__ = ("counts", "epoch", "mixer", "names", "targets")

    def __init__(self, mixer: str, epoch: int, names: tuple[str, ...], targets: tuple[float, ...]):
        self.mixer, self.epoch, self.names, self.targets = mixer, epoch, names, targets
        self.counts = [0] * len(names)

    def rows(self) -> list[list]:
        return [[self.mixer, self.epoch, name, count, target]
                for name, count, target in zip(self.names, self.counts, self.targets)]
