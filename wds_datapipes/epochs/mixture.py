"""The mixture plan: several datasets in one exact epoch, each by its weight.

Pure, like :mod:`.plan` (no I/O, no torch): a function of the sources' shard sizes and
weights, a seed, the epoch, the topology and the batch size. Every rank and worker
computes the same plan on its own; a resumed run computes the plan the stopped run had.

An epoch of a mixture in five steps:

1. **Counts** (:func:`epoch_counts`). How many samples each source gives: from
   ``samples_per_epoch`` shared by the weights (largest remainders); from the weights and a
   stop rule (the epoch ends when the first source, or every source, has given all its
   samples); or from each source's own ``repeat`` factor or ``choose`` count.
2. **Windows** (:func:`epoch_windows`). Each source is an endless run of passes over its
   shards, each pass in its own order; an epoch takes the next window of its count
   (:mod:`.stream`: no sample twice in a window of at most the source's size, each at
   most ceil(count / size) times in a longer one; with ``all_exhausted`` from the start of
   the next pass, so that every sample comes in every epoch).
3. **Split.** The epoch's positions are cut between ranks and workers as one dataset's
   are (:func:`~.plan.split_shares`; in whole batches for ``stratified`` and
   ``per_source``). What ``drop`` leaves out, or ``pad`` repeats, is shared between the
   sources by their counts, taken from each source's end (pads: its start again, flagged).
4. **Order** (the arrangements). Which source each position takes: ``random``, a
   uniformly random order of the epoch's multiset of sources; ``stratified``, every batch
   holding each source's share within one sample; ``per_source``, every batch from one
   source, the batches in a random order. Each answers "how many of each source come
   before position t" in O(sources x log(positions)), so that a reader's part of each
   source is known without laying the epoch out.
5. **Readers** (:class:`MixReader`). A reader's positions hold one contiguous run of each
   source's window, read like one dataset's share (lanes and blocks, :class:`~.plan.ReaderPlan`);
   the arrangement says whose next sample comes next. Reads stay sequential within a
   source's spans.

Resuming on another topology gathers each source's samples that no reader yielded and
plans the rest of the epoch from them (:meth:`MixPlan.remaining`), as
:func:`~.plan.remaining_sequence` does for one dataset.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np

from .orders import apportion, arrangement, exact
from .plan import ReaderPlan, Segment, Shares, check_reading, repeated, split_shares
from .spans import SpanList
from .stream import Cursor, advance, cursor_after, window

BATCHINGS = ("random", "stratified", "per_source")
STOPS = ("first_exhausted", "all_exhausted", "cycle")



@dataclass(frozen=True)
class MixSettings:
    """What fixes a mixture's plan besides the sources' sizes and the topology (kept in
    checkpoints). Per-source values are tuples in the order of ``names``; see
    :class:`~wds_datapipes.MixedEpochs` for their meaning."""

    names: tuple[str, ...]
    weights: tuple[float, ...] | None = None
    repeat: tuple[float | None, ...] | None = None
    choose: tuple[int | None, ...] | None = None
    samples_per_epoch: int | None = None
    stop: str | None = None
    batching: str = "random"
    seed: int = 0
    batch_size: int = 1
    mode: str = "drop"
    shuffle: bool = True
    lanes: int = 16
    block: int = 512

    def __post_init__(self):
        k = len(self.names)
        if k == 0:
            raise ValueError("a mixture needs at least one source")
        if len(set(self.names)) != k:
            twice = sorted({n for n in self.names if self.names.count(n) > 1})
            raise ValueError(f"two sources have the same name: {twice}; give each its own name")
        for label, values in (("weights", self.weights), ("repeat", self.repeat), ("choose", self.choose)):
            if values is not None and len(values) != k:
                raise ValueError(f"{label} has {len(values)} values for {k} sources")
        if self.weights is not None:
            bad = [(n, w) for n, w in zip(self.names, self.weights) if not (math.isfinite(w) and w >= 0)]
            if bad:
                raise ValueError(f"weights must be finite and >= 0: {bad}")
            if not any(self.weights):
                raise ValueError("all weights are 0: at least one source must have a positive weight")
            if self.repeat is not None or self.choose is not None:
                raise ValueError("give weights, or per-source repeat/choose, not both: weights share an epoch "
                                 "between the sources, repeat and choose set each source's count")
        for name, value in zip(self.names, self.repeat or ()):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"repeat of source {name!r} must be finite and >= 0, got {value}")
        for name, value in zip(self.names, self.choose or ()):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"choose of source {name!r} must be an integer >= 0, got {value!r}")
        for name, (r, c) in zip(self.names, zip(self.repeat or [None] * k, self.choose or [None] * k)):
            if r is not None and c is not None:
                raise ValueError(f"source {name!r} has both repeat and choose; give one")
        if self.samples_per_epoch is not None:
            if self.samples_per_epoch < 1:
                raise ValueError(f"samples_per_epoch must be at least 1, got {self.samples_per_epoch}")
            if self.repeat is not None or self.choose is not None:
                raise ValueError("samples_per_epoch is shared by the weights; repeat and choose set counts "
                                 "of their own: give one or the other")
            if self.stop not in (None, "cycle"):
                raise ValueError(f"stop={self.stop!r} decides an epoch's length, which samples_per_epoch "
                                 "already gives (its sources cycle through passes: stop='cycle')")
        elif self.weights is not None and self.stop not in ("first_exhausted", "all_exhausted"):
            raise ValueError("weights without samples_per_epoch need a stop rule to say how long an epoch is: "
                             "stop='first_exhausted' (it ends when a source has given all its samples) or "
                             "'all_exhausted' (when every source has; the others repeat), or give "
                             "samples_per_epoch (the sources cycle)")
        elif self.stop == "cycle":
            raise ValueError("stop='cycle' needs samples_per_epoch: the length of an epoch of cycling sources")
        elif self.weights is None and self.stop is not None:
            raise ValueError(f"stop={self.stop!r} applies to weights; without them each source gives its "
                             "repeat x its size (or its choose count)")
        if self.stop is not None and self.stop not in STOPS:
            raise ValueError(f"stop must be one of {STOPS}, not {self.stop!r}")
        if self.batching not in BATCHINGS:
            raise ValueError(f"batching must be one of {BATCHINGS}, not {self.batching!r}")
        check_reading(self.mode, self.batch_size, self.shuffle, self.lanes, self.block)

    def to_dict(self) -> dict:
        return {f: (list(v) if isinstance(v, tuple) else v) for f, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls, data: Mapping) -> MixSettings:
        return cls(**{f: (tuple(v) if isinstance(v, list) else v) for f, v in data.items()})


# ---------------------------------------------------------------- step 1: counts


def epoch_counts(settings: MixSettings, totals: Sequence[int]) -> list[int]:
    """How many samples each source gives in an epoch (step 1), from the sources' sizes."""
    totals = [int(t) for t in totals]
    if settings.weights is not None:
        empty = [n for n, w, t in zip(settings.names, settings.weights, totals) if w > 0 and t == 0]
        if empty:
            raise ValueError(f"sources {empty} have a positive weight and no samples")
    if settings.samples_per_epoch is not None:
        weights = settings.weights if settings.weights is not None else totals
        if not any(weights):
            raise ValueError("the sources hold no samples")
        return apportion(settings.samples_per_epoch, weights)
    if settings.weights is not None:
        w = [exact(x) for x in settings.weights]
        share = [x / sum(w) for x in w]
        ratios = [Fraction(t) / s for t, s in zip(totals, share) if s > 0]
        epoch = math.floor(min(ratios)) if settings.stop == "first_exhausted" else math.ceil(max(ratios))
        return apportion(epoch, share)
    counts = []
    for k, total in enumerate(totals):
        chosen = settings.choose[k] if settings.choose is not None else None
        factor = settings.repeat[k] if settings.repeat is not None and settings.repeat[k] is not None else 1.0
        counts.append(chosen if chosen is not None else math.floor(exact(factor) * total + Fraction(1, 2)))
    if any(c and not t for c, t in zip(counts, totals)):
        raise ValueError(f"sources {[n for n, c, t in zip(settings.names, counts, totals) if c and not t]} "
                         "are to give samples and hold none")
    return counts


# ---------------------------------------------------------------- step 2: windows


@dataclass(frozen=True)
class Window:
    """``count`` samples of a source's endless run of passes from ``start`` (pass
    ``start // size``, that many samples in), in a pass that leaves out the first ``skip``
    samples of pass ``skip_pass`` (see :mod:`.stream`)."""

    start: int
    count: int
    skip_pass: int = 0
    skip: int = 0

    @classmethod
    def at(cls, cursor: Cursor, total: int, count: int) -> Window:
        return cls(cursor.pass_index * total + cursor.offset, count, cursor.skip_pass, cursor.skip)

    def cursor(self, total: int) -> Cursor:
        if not total:
            return Cursor()
        return Cursor(self.start // total, self.start % total, self.skip_pass, self.skip)


def source_seed(seed: int, name: str) -> int:
    """The seed of a source's own shard orders: from the mixture's seed and the source's name
    (adding or reordering sources leaves the others' orders as they were)."""
    return (seed * 0x9E3779B1 + zlib.crc32(name.encode("utf-8"))) & 0xFFFFFFFFFFFF


def next_cursor(window: Window, total: int, stop: str | None) -> Cursor:
    """Where a source's next window starts: after this one, or, with ``all_exhausted``, at
    the next pass's start (so each epoch holds whole passes)."""
    return advance(window.cursor(total), window.count, total, stop)


def epoch_windows(settings: MixSettings, totals: Sequence[int], epoch: int, anchor: int = 0,
                  starts: Sequence[Cursor] | None = None) -> list[Window]:
    """Each source's window of ``epoch``, given where each stood at epoch ``anchor``
    (default: epoch 0 at the start of every source's first pass)."""
    if epoch < anchor:
        raise ValueError(f"epoch {epoch} comes before the anchor epoch {anchor}")
    counts = epoch_counts(settings, totals)
    starts = [Cursor()] * len(counts) if starts is None else list(starts)
    return [Window.at(cursor_after(start, count, int(total), epoch - anchor, settings.stop), int(total), count)
            for count, total, start in zip(counts, totals, starts)]


# ---------------------------------------------------------------- steps 3 to 5: the plan


@dataclass(frozen=True)
class MixReader:
    """One reader's part of a mixed epoch: positions ``start`` .. ``stop - 1`` of its order,
    holding run ``spans[k]`` of source ``k`` (``before[k]`` of its samples come earlier),
    read in the order of ``plans[k]``."""

    start: int
    stop: int
    spans: tuple[SpanList, ...]
    plans: tuple[ReaderPlan, ...]
    before: np.ndarray
    order: object = field(repr=False)

    @property
    def length(self) -> int:
        return self.stop - self.start

    def taken(self, position: int) -> np.ndarray:
        """Per source, how many of its run's samples are among this reader's first ``position``."""
        return self.order.counts_before(self.start + position) - self.before

    def sources(self, position: int) -> Iterator[np.ndarray]:
        """The sources of this reader's positions from ``position`` on, a run at a time."""
        left = self.length - position
        for run in self.order.runs(self.start + position):
            if left <= 0:
                return
            yield run[:left]
            left -= len(run)


@dataclass(frozen=True)
class MixPlan:
    """A mixed epoch's plan on one topology, after any earlier segments of it.

    ``sequences[k]``: what source ``k`` gives in this segment, in its order (pads
    flagged); ``split``: the positions of each rank and worker; ``order``: which source
    each position takes."""

    settings: MixSettings
    epoch: int
    generation: int
    sequences: tuple[SpanList, ...]
    split: Shares
    order: object = field(repr=False)
    windows: tuple[Window, ...] = ()  # the epoch's windows, before any segment

    def reader(self, rank: int, worker: int) -> MixReader:
        s = self.settings
        start, stop = self.split.reader_range(rank, worker)
        before, upto = self.order.counts_before(start), self.order.counts_before(stop)
        total = max(stop - start, 1)
        lengths = (upto - before).tolist()
        # The sources share the reader's lanes and its block by their parts (each at least one
        # lane), so that the open shards and the samples held are one dataset's, plus one per source.
        lanes = apportion(s.lanes, lengths) if any(lengths) else [1] * len(lengths)
        spans, plans = [], []
        for k, sequence in enumerate(self.sequences):
            length = int(lengths[k])
            spans.append(sequence.slice(int(before[k]), int(upto[k])))
            block = max(lanes[k], 1, s.block * length // total)
            key = (s.seed, self.epoch, self.generation, rank, worker, k)
            plans.append(ReaderPlan.build(length, max(lanes[k], 1), block, key, s.shuffle))
        return MixReader(start, stop, tuple(spans), tuple(plans), before, self.order)

    def remaining(self, taken: Sequence[int]) -> list[SpanList]:
        """Per source, its samples that no reader yielded (pads left out), after each worker
        ``w`` of every rank yielded ``taken[w]``."""
        if len(taken) != self.split.workers:
            raise ValueError(f"taken has {len(taken)} counts, the plan has {self.split.workers} workers")
        parts: list[list[SpanList]] = [[] for _ in self.sequences]
        for rank in range(self.split.world):
            for worker in range(self.split.workers):
                reader = self.reader(rank, worker)
                if not 0 <= taken[worker] <= reader.length:
                    raise ValueError(f"worker {worker} cannot have yielded {taken[worker]} of {reader.length} samples")
                for k, count in enumerate(reader.taken(taken[worker]).tolist()):
                    parts[k].append(reader.spans[k].take(reader.plans[k].unread_runs(count)))
        return [SpanList.join(p).without_pads() for p in parts]


def plan_mixture(sizes: Sequence[Sequence[int]], settings: MixSettings, epoch: int, windows: Sequence[Window],
                 world: int, workers: int, history: Sequence[Segment] = ()) -> MixPlan:
    """The plan of a mixed ``epoch`` on ``world`` x ``workers``: source ``k`` (shard sizes
    ``sizes[k]``) gives the samples of ``windows[k]``, less what the ``history`` segments
    (earlier stretches of this epoch on other topologies) yielded."""
    sequences = [window(s, source_seed(settings.seed, name), settings.shuffle, w.cursor(int(np.sum(s))), w.count)
                 for s, name, w in zip(sizes, settings.names, windows)]
    for generation, segment in enumerate(history):
        earlier = _segment(settings, epoch, generation, sequences, segment.world, segment.workers)
        sequences = earlier.remaining(segment.taken)
    return replace(_segment(settings, epoch, len(history), sequences, world, workers), windows=tuple(windows))


def _segment(settings: MixSettings, epoch: int, generation: int, sequences: Sequence[SpanList], world: int,
             workers: int) -> MixPlan:
    """Steps 3 and 4 for one segment: the split, each source's share of what is dropped or
    padded, and the order of sources."""
    b, drop = settings.batch_size, settings.mode == "drop"
    counts = [len(s) for s in sequences]
    if settings.batching == "per_source":  # each source in whole batches first
        counts = [c // b * b if drop else -(-c // b) * b for c in counts]
    rounded = abs(sum(counts) - sum(len(s) for s in sequences))
    total = sum(counts)
    if total == 0 and generation == 0:  # the rest of a resumed epoch may be nothing (all yielded or dropped)
        raise ValueError(f"epoch {epoch} of the mixture holds no samples"
                         + (f" in whole batches of {b}" if settings.batching == "per_source" else ""))
    shares = split_shares(total, world, workers, b, settings.mode, whole_batches=settings.batching != "random")
    unit = b if settings.batching == "per_source" else 1
    change = apportion((shares.dropped or shares.padded) // unit, [c // unit for c in counts]) if total else \
        [0] * len(counts)
    shares = replace(shares, dropped=shares.dropped + rounded * drop, padded=shares.padded + rounded * (not drop))
    kept = [c - x * unit if drop else c + x * unit for c, x in zip(counts, change)]
    adjusted = []
    for sequence, count in zip(sequences, kept):
        if count <= len(sequence):
            adjusted.append(sequence.slice(0, count))
        else:  # pads: the source's own samples again, from its start
            adjusted.append(SpanList.join([sequence, repeated(sequence, count - len(sequence)).as_pads()]))
    order = arrangement(settings.batching, kept, b, (settings.seed, epoch, generation))
    return MixPlan(settings, epoch, generation, tuple(adjusted), shares, order)
