"""The order of sources in a mixed epoch: which source each position takes (step 4 of :mod:`.mixture`).

Three orders, one interface: ``counts_before(t)`` (how many positions of each source lie
before position ``t``, in O(sources x log(positions)), so that a reader's part of each
source is known without laying out the epoch) and ``runs(t)`` (the sources of the
positions from ``t`` on, a few hundred at a time, for the reader). Pure: no I/O, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from fractions import Fraction

import numpy as np

from .stream import rng

# Domain tags of these draws (see plan.rng), apart from the plan's own.
_HALVES, _LEAF, _EXTRAS, _WITHIN, _SOURCE = 0x4D1, 0x1EAF, 0xE47A, 0x5147, 0x50C3
_LEAF_SIZE = 1024  # positions a random order lays out at once
_EXACT_DRAW = 10**9  # numpy's multivariate hypergeometric draws below this many positions


def exact(weight: float | Fraction) -> Fraction:
    """A weight as the number its user wrote: a float by its shortest decimal (0.2 is 1/5,
    not the binary fraction nearest to it), so that 0.5/0.3/0.2 shares 30 as 15/9/6."""
    return Fraction(repr(weight)) if isinstance(weight, float) else Fraction(weight)


def apportion(total: int, weights: Sequence[int | float | Fraction]) -> list[int]:
    """``total`` shared by ``weights``: each its quota's floor, the rest one each to the
    largest remainders (the first among equals first). Exact: no float rounding."""
    w = [exact(x) for x in weights]
    whole = sum(w)
    quotas = [total * x / whole for x in w]
    counts = [math.floor(q) for q in quotas]
    order = sorted(range(len(w)), key=lambda k: (-(quotas[k] - counts[k]), k))
    for k in order[: total - sum(counts)]:
        counts[k] += 1
    return counts


class RandomOrder:
    """A uniformly random order of ``counts[k]`` positions of each source ``k``.

    Laid out lazily as a tree of halves: a node's left half holds a multivariate
    hypergeometric draw of its counts (what a random order puts there), seeded by the
    node's place, so any prefix's counts come from one path down the tree. Halves of a
    billion positions or more are split in proportion instead (numpy's draw stops there).
    """

    def __init__(self, counts: Sequence[int], key: Sequence[int], leaf: int = _LEAF_SIZE):
        self.counts = np.asarray(counts, dtype=np.int64)
        self.length = int(self.counts.sum())
        self.key = tuple(key)
        self.leaf = leaf
        self._halves: dict[tuple[int, int], np.ndarray] = {}  # the draws near the root, shared by every descent

    def _left(self, lo: int, hi: int, counts: np.ndarray) -> np.ndarray:
        found = self._halves.get((lo, hi))
        if found is not None:
            return found
        half = (hi - lo) // 2
        if hi - lo < _EXACT_DRAW:
            left = rng(_HALVES, *self.key, lo, hi).multivariate_hypergeometric(counts, half)
        else:
            left = np.minimum(np.asarray(apportion(half, [int(c) for c in counts]), dtype=np.int64), counts)
        if hi - lo > 64 * self.leaf:  # the top of the tree: few nodes, each met by every descent
            self._halves[(lo, hi)] = left
        return left

    def _leaf_order(self, lo: int, hi: int, counts: np.ndarray) -> np.ndarray:
        ids = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
        return rng(_LEAF, *self.key, lo, hi).permutation(ids)

    def counts_before(self, t: int) -> np.ndarray:
        """How many positions of each source lie before position ``t``."""
        if t >= self.length:
            return self.counts.copy()
        lo, hi, counts = 0, self.length, self.counts
        before = np.zeros(len(counts), dtype=np.int64)
        while hi - lo > self.leaf:
            mid = lo + (hi - lo) // 2
            left = self._left(lo, hi, counts)
            if t < mid:
                hi, counts = mid, left
            else:
                before += left
                lo, counts = mid, counts - left
        return before + np.bincount(self._leaf_order(lo, hi, counts)[: t - lo], minlength=len(counts))

    def runs(self, t: int) -> Iterator[np.ndarray]:
        """The sources of positions ``t`` .. the end, a leaf's worth at a time."""
        stack = [(0, self.length, self.counts)]
        while stack:
            lo, hi, counts = stack.pop()
            if hi <= t or lo == hi:
                continue
            if hi - lo <= self.leaf:
                yield self._leaf_order(lo, hi, counts)[max(t - lo, 0):]
                continue
            mid = lo + (hi - lo) // 2
            left = self._left(lo, hi, counts)
            stack.append((mid, hi, counts - left))
            stack.append((lo, mid, left))


class StratifiedOrder:
    """Batches of ``batch_size`` in which source ``k`` has ``counts[k] // batches`` positions
    or one more: every batch holds each source's share within one sample.

    The extra positions (``counts[k] % batches`` of source ``k``) are laid out source after
    source, in an order drawn for the epoch, on the slots of "rounds" of every batch once;
    slot ``s`` goes to batch ``(a * s + phase) % batches``, ``a`` coprime to the number of
    batches and near its golden section. So no batch gets two extras of one source, every
    batch gets the same number of extras, and a source's extras are spread evenly over the
    epoch (not bunched in a stretch of it); a prefix's counts are floor sums (O(log)).
    Positions within a batch are in an order drawn for that batch.
    """

    def __init__(self, counts: Sequence[int], batch_size: int, key: Sequence[int]):
        self.counts = np.asarray(counts, dtype=np.int64)
        self.length = int(self.counts.sum())
        self.batch_size = batch_size
        if self.length % batch_size:
            raise ValueError(f"a stratified order needs whole batches: {self.length} positions, batches of {batch_size}")
        self.batches = m = self.length // batch_size
        self.key = tuple(key)
        self.base = self.counts // max(m, 1)
        extras = self.counts - self.base * m
        g = rng(_EXTRAS, *self.key)
        self.order = g.permutation(len(self.counts))  # sources in the order their extras are laid
        self.first = [0, *np.cumsum(extras[self.order]).tolist()]  # where each one's extras begin
        self.phase = int(g.integers(m)) if m else 0
        self.stride = _spreading_stride(m)
        self.inverse = pow(self.stride, -1, m) if m > 1 else 0

    def _extras_before(self, batch: int) -> np.ndarray:
        """Per source (in ``order``), its extras in batches ``0 .. batch - 1``."""
        m, a, b, j = self.batches, self.stride, self.phase, batch

        def below(y: int) -> int:  # slots s < y whose batch (a*s + b) % m is < j
            return _floor_sum(y, m, a, b) - _floor_sum(y, m, a, b + m - j) + y

        marks = [below(y) for y in self.first]
        return np.diff(np.asarray(marks, dtype=np.int64))

    def batch(self, j: int) -> np.ndarray:
        """The sources of batch ``j``'s positions, in their order."""
        counts = self.base.copy()
        m = self.batches
        first_slot = (j - self.phase) * self.inverse % m if m > 1 else 0
        slots = np.arange(first_slot, self.first[-1], max(m, 1))
        owners = np.searchsorted(np.asarray(self.first), slots, side="right") - 1
        np.add.at(counts, self.order[owners], 1)
        ids = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
        return rng(_WITHIN, *self.key, j).permutation(ids)

    def counts_before(self, t: int) -> np.ndarray:
        if t >= self.length:
            return self.counts.copy()
        j, within = divmod(t, self.batch_size)
        before = self.base * j
        before[self.order] += self._extras_before(j)
        return before + np.bincount(self.batch(j)[:within], minlength=len(self.counts))

    def runs(self, t: int) -> Iterator[np.ndarray]:
        j, within = divmod(t, self.batch_size)
        for batch in range(j, self.batches):
            yield self.batch(batch)[within if batch == j else 0:]


def _spreading_stride(m: int) -> int:
    """A step coprime to ``m`` near ``m``'s golden section: consecutive slots land far apart."""
    if m <= 1:
        return 1
    a = max(1, round(m * 0.6180339887498949))
    while math.gcd(a, m) != 1:
        a += 1
    return a % m or 1


def _floor_sum(n: int, m: int, a: int, b: int) -> int:
    """The sum of ``(a * i + b) // m`` for ``i`` in ``0 .. n - 1`` (a, b >= 0), in O(log)."""
    total = 0
    while True:
        if a >= m:
            total += (n - 1) * n // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        top = a * n + b
        if top < m:
            return total
        n, b, m, a = top // m, top % m, a, m


class PerSourceOrder:
    """Batches of ``batch_size`` positions of one source each, the batches in a random order
    (:class:`RandomOrder` over the batches' sources)."""

    def __init__(self, counts: Sequence[int], batch_size: int, key: Sequence[int]):
        self.counts = np.asarray(counts, dtype=np.int64)
        if (self.counts % batch_size).any():
            raise ValueError(f"per_source batches need each source's count in whole batches of {batch_size}")
        self.length = int(self.counts.sum())
        self.batch_size = batch_size
        self.by_batch = RandomOrder(self.counts // batch_size, key)

    def counts_before(self, t: int) -> np.ndarray:
        if t >= self.length:
            return self.counts.copy()
        j, within = divmod(t, self.batch_size)
        batches = self.by_batch.counts_before(j)
        before = batches * self.batch_size
        if within:  # part of batch j: whose it is
            before[int(np.argmax(self.by_batch.counts_before(j + 1) - batches))] += within
        return before

    def runs(self, t: int) -> Iterator[np.ndarray]:
        j, within = divmod(t, self.batch_size)
        b = self.batch_size
        for labels in self.by_batch.runs(j):
            expanded = np.repeat(labels, b)
            yield expanded[within:]
            within = 0


def arrangement(batching: str, counts: Sequence[int], batch_size: int, key: Sequence[int]):
    """The order of sources of an epoch's positions for ``batching``."""
    if batching == "random":
        return RandomOrder(counts, (_SOURCE, *key))
    if batching == "stratified":
        return StratifiedOrder(counts, batch_size, (_SOURCE, *key))
    if batching == "per_source":
        return PerSourceOrder(counts, batch_size, (_SOURCE, *key))
    raise ValueError(f"batching must be 'random', 'stratified' or 'per_source', not {batching!r}")
