"""The epoch plan: which samples each rank and worker reads in an epoch, and in which order.

Everything here is a pure function of shard sizes, a seed, an epoch, the topology (ranks
x workers), the batch size and a mode: no I/O, no torch, no global state. So every rank
and worker computes the same plan on its own, a resumed run computes the plan the
stopped run had, and the tests check the rules on sizes alone.

An epoch in four steps:

1. **Order.** The shards are put in an order drawn from (seed, epoch) and laid end to end:
   the epoch's *sequence*, one position per sample (:func:`epoch_sequence`). With
   ``samples_per_epoch`` the epochs are windows of that length over an endless run of
   such passes, each pass in a new order (webdataset's ``with_epoch``, but exact: no
   sample twice in an epoch, :mod:`.stream`).
2. **Split** (:func:`split_epoch`). Every rank gets the same number of samples: ``drop``
   leaves out the few at the end that do not divide evenly; ``pad`` repeats a few from
   the start, flagged as pads. A rank's share is cut into its workers' shares in whole
   batches, so shares differ by at most one batch and every rank yields the same number
   of batches. Shares are contiguous runs of the sequence, so they start and end
   anywhere inside a shard.
3. **Lanes and blocks** (:class:`ReaderPlan`). A reader (one worker of one rank) cuts its
   share into ``lanes`` contiguous runs and reads them side by side, each sequentially.
   Block ``q`` holds rows ``q*m .. q*m+m-1`` of every lane (``m = block // lanes``) and is
   yielded in an order drawn from (seed, epoch, reader, q). Reads stay sequential within
   a lane, a batch mixes samples from up to ``lanes`` places in the dataset, and the
   memory is one block. Without shuffling there is one lane and no block order.
4. **Resume** (:func:`remaining_sequence`). Knowing how many samples each reader yielded,
   the rest of an epoch is known: a reader restarts at its block (re-reading at most
   one block), and on another topology the samples not yet seen form a new sequence
   that is split again by the same rules.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .spans import SpanList
from .stream import Cursor, cursor_after, pass_sequence, rng, window

MODES = ("drop", "pad")

# Domain tag of the block orders (see stream.rng), apart from the shard orders'.
_BLOCK_ORDER = 0xB10C


# ---------------------------------------------------------------- step 1: the epoch's sequence


def epoch_sequence(sizes: Sequence[int], seed: int, epoch: int, shuffle: bool,
                   samples_per_epoch: int | None = None) -> SpanList:
    """The samples of an epoch in order, before the split between ranks and workers.

    Without ``samples_per_epoch``, epoch ``e`` is pass ``e``: every sample once. With it,
    the epochs are consecutive windows of that many samples over passes 0, 1, 2, ...,
    each pass in its own order, no sample twice in an epoch of at most a pass
    (:mod:`.stream`), every sample equally often over many epochs.
    """
    if samples_per_epoch is None:
        return pass_sequence(sizes, seed, epoch, shuffle)
    if samples_per_epoch < 1:
        raise ValueError(f"samples_per_epoch must be at least 1, got {samples_per_epoch}")
    total = int(np.sum(np.asarray(sizes, dtype=np.int64)))
    if total == 0:
        raise ValueError("an epoch of samples needs at least one sample in the shards")
    cursor = cursor_after(Cursor(), samples_per_epoch, total, epoch)
    return window(sizes, seed, shuffle, cursor, samples_per_epoch)


# ---------------------------------------------------------------- step 2: ranks and workers


def worker_sizes(rank_samples: int, workers: int, batch_size: int) -> tuple[int, ...]:
    """How many samples each worker of a rank reads: whole batches, at most one batch apart.

    The one short batch, if any, is the rank's last in round-robin order (the order in
    which DataLoader and DataLoader2 take workers' batches), so it comes last.
    """
    batches = -(-rank_samples // batch_size)
    base, extra = divmod(batches, workers)
    counts = [(base + (w < extra)) * batch_size for w in range(workers)]
    short = batches * batch_size - rank_samples
    if short:
        counts[(extra or workers) - 1] -= short
    return tuple(counts)


def worker_batches(rank_batches_taken: int, sizes: Sequence[int], batch_size: int) -> list[int]:
    """How many batches each worker has given after the rank took ``rank_batches_taken``.

    Workers are taken round robin, skipping the ones that have nothing left (what
    DataLoader, StatefulDataLoader and DataLoader2 do).
    """
    per_worker = [-(-n // batch_size) for n in sizes]
    taken = [0] * len(per_worker)
    left = rank_batches_taken
    if left > sum(per_worker):
        raise ValueError(f"{rank_batches_taken} batches taken, but the rank has only {sum(per_worker)}")
    while left:
        live = [w for w, n in enumerate(per_worker) if taken[w] < n]
        rounds = min(left // len(live), min(per_worker[w] - taken[w] for w in live))
        if rounds:
            for w in live:
                taken[w] += rounds
            left -= rounds * len(live)
            continue
        for w in live[:left]:
            taken[w] += 1
        left = 0
    return taken


def next_worker(rank_batches_taken: int, sizes: Sequence[int], batch_size: int) -> int:
    """The worker whose batch the loader takes after ``rank_batches_taken`` batches (round robin)."""
    per_worker = [-(-n // batch_size) for n in sizes]
    taken = worker_batches(rank_batches_taken, sizes, batch_size)
    live = [w for w, n in enumerate(per_worker) if taken[w] < n]
    if not live:
        return 0
    # In the round under way, the workers that gave their batch have one more than the rest.
    fewest = min(taken[w] for w in live)
    return min(w for w in live if taken[w] == fewest)


@dataclass(frozen=True)
class Shares:
    """How an epoch of positions is cut between ``world`` ranks of ``workers`` workers each:
    rank ``r``'s worker ``w`` reads positions :meth:`reader_range` of the epoch's order
    (pads included, the dropped remainder excluded)."""

    world: int
    workers: int
    batch_size: int
    rank_samples: int
    worker_sizes: tuple[int, ...]
    padded: int
    dropped: int

    def reader_range(self, rank: int, worker: int) -> tuple[int, int]:
        start = rank * self.rank_samples + sum(self.worker_sizes[:worker])
        return start, start + self.worker_sizes[worker]

    @property
    def rank_batches(self) -> int:
        return sum(-(-n // self.batch_size) for n in self.worker_sizes)


def split_shares(total: int, world: int, workers: int, batch_size: int, mode: str = "drop",
                 whole_batches: bool = False) -> Shares:
    """Cuts ``total`` positions so that every rank gets the same number of samples and batches.

    ``drop``: each rank gets ``total // world`` samples; the last ``total % world``
    positions are left out (every sample at most once). ``pad``: each rank gets
    ``ceil(total / world)``; the missing positions are repeats (every sample at least
    once). ``whole_batches``: ranks get whole batches only (what is left out or repeated
    is then up to ``world`` batches).
    """
    for name, value in (("world", world), ("workers", workers), ("batch_size", batch_size)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    unit = batch_size if whole_batches else 1
    units = total // unit if mode == "drop" else -(-total // unit)
    per_rank = (units // world if mode == "drop" else -(-units // world)) * unit
    kept = per_rank * world
    return Shares(world, workers, batch_size, per_rank, worker_sizes(per_rank, workers, batch_size),
                  max(kept - total, 0), max(total - kept, 0))


@dataclass(frozen=True)
class Split(Shares):
    """An epoch's sequence cut between ranks and workers: ``sequence`` holds the positions
    the readers read (pads included, the dropped remainder excluded)."""

    sequence: SpanList = None  # type: ignore[assignment]  # always given: a default only to follow Shares' fields

    def reader_spans(self, rank: int, worker: int) -> SpanList:
        return self.sequence.slice(*self.reader_range(rank, worker))


def split_epoch(sequence: SpanList, world: int, workers: int, batch_size: int, mode: str = "drop") -> Split:
    """Cuts ``sequence`` by :func:`split_shares`: ``drop`` leaves out its last positions,
    ``pad`` repeats it from its start, the repeats marked ``pad``."""
    shares = split_shares(len(sequence), world, workers, batch_size, mode)
    kept = shares.rank_samples * world
    if mode == "drop":
        sequence = sequence.slice(0, kept)
    elif shares.padded:
        sequence = SpanList.join([sequence, repeated(sequence, shares.padded).as_pads()])
    return Split(**{f: getattr(shares, f) for f in Shares.__dataclass_fields__}, sequence=sequence)


def repeated(sequence: SpanList, count: int) -> SpanList:
    """The first ``count`` positions of ``sequence`` repeated end to end (as often as needed)."""
    total = len(sequence)
    if count and not total:
        raise ValueError("cannot repeat an empty sequence")
    return SpanList.join([sequence] * (count // total) + [sequence.slice(0, count % total)]) if count else \
        SpanList([], [], [])


# ---------------------------------------------------------------- step 3: a reader's order


@dataclass(frozen=True)
class ReaderPlan:
    """The order in which one reader yields the positions of its share.

    Its share (``length`` positions) is cut into ``lanes`` contiguous lanes (the first
    ``length % lanes`` one longer). Block ``q`` takes rows ``q*rows .. q*rows + rows - 1``
    of each lane, and is yielded in the order :meth:`block_order` draws from ``key`` and
    ``q``. Output position ``p`` lies in block ``p // (lanes * rows)``.
    """

    length: int
    lanes: int
    rows: int
    key: tuple[int, ...]
    shuffle: bool

    @classmethod
    def build(cls, length: int, lanes: int, block: int, key: Iterable[int], shuffle: bool) -> ReaderPlan:
        if not shuffle:
            return cls(length, 1, max(length, 1), tuple(key), False)
        if lanes < 1 or block < lanes:
            raise ValueError(f"need lanes >= 1 and block >= lanes, got lanes={lanes}, block={block}")
        return cls(length, lanes, block // lanes, tuple(key), True)

    @property
    def block_size(self) -> int:
        return self.lanes * self.rows

    @property
    def blocks(self) -> int:
        return -(-self.length // self.block_size)

    def lane_bounds(self) -> list[tuple[int, int]]:
        """(start, stop) of each lane, as positions in the reader's share."""
        base, extra = divmod(self.length, self.lanes)
        bounds, start = [], 0
        for lane in range(self.lanes):
            stop = start + base + (lane < extra)
            bounds.append((start, stop))
            start = stop
        return bounds

    def block_rows(self, q: int) -> list[tuple[int, int]]:
        """(lane, row) of each member of block ``q``, row by row (the order before shuffling)."""
        lengths = [stop - start for start, stop in self.lane_bounds()]
        return [(lane, row) for row in range(q * self.rows, (q + 1) * self.rows)
                for lane in range(self.lanes) if row < lengths[lane]]

    def block_order(self, q: int, size: int) -> np.ndarray:
        """The order in which block ``q``'s ``size`` members are yielded."""
        if not self.shuffle:
            return np.arange(size)
        return rng(_BLOCK_ORDER, *self.key, q).permutation(size)

    def block_positions(self, q: int) -> list[int]:
        """The share positions of block ``q``, in the order they are yielded."""
        bounds = self.lane_bounds()
        members = self.block_rows(q)
        order = self.block_order(q, len(members))
        return [bounds[members[i][0]][0] + members[i][1] for i in order.tolist()]

    def taken_per_lane(self, position: int) -> list[int]:
        """Rows of each lane read before block ``position // block_size`` starts."""
        q = position // self.block_size
        return [min(stop - start, q * self.rows) for start, stop in self.lane_bounds()]

    def unread_runs(self, position: int) -> list[tuple[int, int]]:
        """The share's positions not among the first ``position`` yielded, as increasing
        (start, stop) runs: the rest of the current block one by one, then each lane's rest."""
        if position >= self.length:
            return []
        q = position // self.block_size
        bounds = self.lane_bounds()
        members = self.block_rows(q)
        order = self.block_order(q, len(members))
        taken = {members[i] for i in order[: position - q * self.block_size].tolist()}
        runs = [(bounds[lane][0] + row, bounds[lane][0] + row + 1) for lane, row in members
                if (lane, row) not in taken]
        runs.extend((start + (q + 1) * self.rows, stop) for start, stop in bounds
                    if start + (q + 1) * self.rows < stop)
        return _merge_runs(sorted(runs))


def _merge_runs(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, stop in runs:
        if merged and merged[-1][1] == start:
            merged[-1] = (merged[-1][0], stop)
        else:
            merged.append((start, stop))
    return merged


# ---------------------------------------------------------------- step 4: resuming


@dataclass(frozen=True)
class PlanSettings:
    """What fixes the plan besides the topology and the data: kept in checkpoints."""

    seed: int = 0
    batch_size: int = 1
    mode: str = "drop"
    shuffle: bool = True
    samples_per_epoch: int | None = None
    lanes: int = 16
    block: int = 512

    def __post_init__(self):
        check_reading(self.mode, self.batch_size, self.shuffle, self.lanes, self.block)


def check_reading(mode: str, batch_size: int, shuffle: bool, lanes: int, block: int) -> None:
    """Raises ValueError for settings no plan can read by (one dataset's, or a mixture's)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if shuffle and (lanes < 1 or block < lanes):
        raise ValueError(f"need lanes >= 1 and block >= lanes, got lanes={lanes}, block={block}")


@dataclass(frozen=True)
class Segment:
    """A stretch of an epoch read on one topology; ``taken[w]``: samples each worker of
    every rank yielded (ranks step together, as DDP makes them)."""

    world: int
    workers: int
    taken: tuple[int, ...]


@dataclass(frozen=True)
class EpochPlan:
    """An epoch's plan on the current topology, after any earlier segments of it."""

    settings: PlanSettings
    epoch: int
    split: Split
    generation: int  # how many topology changes came before, within this epoch

    def reader(self, rank: int, worker: int) -> ReaderPlan:
        s = self.settings
        length = self.split.worker_sizes[worker]
        key = (s.seed, self.epoch, self.generation, rank, worker)
        return ReaderPlan.build(length, s.lanes, s.block, key, s.shuffle)

    def reader_spans(self, rank: int, worker: int) -> SpanList:
        return self.split.reader_spans(rank, worker)


def plan_epoch(sizes: Sequence[int], settings: PlanSettings, epoch: int, world: int, workers: int,
               history: Sequence[Segment] = ()) -> EpochPlan:
    """The plan of ``epoch`` on ``world`` x ``workers``, after the ``history`` segments.

    ``history`` lists the earlier stretches of this epoch on other topologies (oldest
    first); the plan then covers exactly the samples they did not yield.
    """
    s = settings
    sequence = epoch_sequence(sizes, s.seed, epoch, s.shuffle, s.samples_per_epoch)
    for generation, segment in enumerate(history):
        earlier = EpochPlan(s, epoch, split_epoch(sequence, segment.world, segment.workers, s.batch_size, s.mode),
                            generation)
        sequence = remaining_sequence(earlier, segment.taken)
    return EpochPlan(s, epoch, split_epoch(sequence, world, workers, s.batch_size, s.mode), len(history))


def remaining_sequence(plan: EpochPlan, taken: Sequence[int]) -> SpanList:
    """The samples of ``plan`` that no reader yielded, pads left out, as a new sequence.

    ``taken[w]``: how many samples worker ``w`` of every rank yielded. Readers are taken
    rank by rank, worker by worker; each one's unread positions in increasing order.
    """
    split = plan.split
    if len(taken) != split.workers:
        raise ValueError(f"taken has {len(taken)} counts, the plan has {split.workers} workers")
    parts = []
    for rank in range(split.world):
        for worker in range(split.workers):
            reader = plan.reader(rank, worker)
            if not 0 <= taken[worker] <= reader.length:
                raise ValueError(f"worker {worker} cannot have yielded {taken[worker]} of {reader.length} samples")
            spans = split.reader_spans(rank, worker)
            parts.append(spans.take(reader.unread_runs(taken[worker])))
    return SpanList.join(parts).without_pads()


def rank_batches(sizes: Sequence[int], settings: PlanSettings, world: int, workers: int) -> int:
    """Batches per rank in a plain epoch (no resume); the same on every rank."""
    total = int(np.sum(np.asarray(sizes, dtype=np.int64))) if settings.samples_per_epoch is None \
        else settings.samples_per_epoch
    per_rank = total // world if settings.mode == "drop" else math.ceil(total / world)
    return sum(-(-n // settings.batch_size) for n in worker_sizes(per_rank, workers, settings.batch_size))
