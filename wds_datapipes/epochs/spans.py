"""Spans: runs of samples within shards, and ordered lists of them addressed by position.

A plan (:mod:`.plan`) is spans all the way down: an epoch's sequence, a rank's share, a
reader's share and the rest of an interrupted epoch are each a :class:`SpanList`, stored
as arrays so that a plan over 10^9 samples costs milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Span:
    """Samples ``start`` .. ``stop - 1`` of shard number ``shard``; ``pad`` marks repeats."""

    shard: int
    start: int
    stop: int
    pad: bool = False

    def __len__(self) -> int:
        return self.stop - self.start


class SpanList:
    """An ordered run of spans, addressed by position (0 .. len - 1), stored as arrays."""

    __slots__ = ("ends", "pads", "shards", "starts", "stops")

    def __init__(self, shards: Iterable[int], starts: Iterable[int], stops: Iterable[int],
                 pads: Iterable[bool] | None = None):
        self.shards = np.asarray(shards, dtype=np.int64).reshape(-1)
        self.starts = np.asarray(starts, dtype=np.int64).reshape(-1)
        self.stops = np.asarray(stops, dtype=np.int64).reshape(-1)
        self.pads = (np.zeros(len(self.shards), dtype=bool) if pads is None
                     else np.asarray(pads, dtype=bool).reshape(-1))
        keep = self.stops > self.starts
        if not keep.all():
            self.shards, self.starts, self.stops, self.pads = (
                self.shards[keep], self.starts[keep], self.stops[keep], self.pads[keep])
        self.ends = np.cumsum(self.stops - self.starts)

    @classmethod
    def of(cls, spans: Iterable[Span]) -> SpanList:
        spans = list(spans)
        return cls([s.shard for s in spans], [s.start for s in spans], [s.stop for s in spans],
                   [s.pad for s in spans])

    @classmethod
    def join(cls, parts: Sequence[SpanList]) -> SpanList:
        if not parts:
            return cls([], [], [])
        return cls(np.concatenate([p.shards for p in parts]), np.concatenate([p.starts for p in parts]),
                   np.concatenate([p.stops for p in parts]), np.concatenate([p.pads for p in parts]))

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def __iter__(self):
        for shard, start, stop, pad in zip(self.shards.tolist(), self.starts.tolist(),
                                           self.stops.tolist(), self.pads.tolist()):
            yield Span(shard, start, stop, pad)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SpanList) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"SpanList({list(self)!r})"

    def slice(self, a: int, b: int) -> SpanList:
        """The spans covering positions ``a`` .. ``b - 1``, cut where needed."""
        a, b = max(a, 0), min(b, len(self))
        if a >= b:
            return SpanList([], [], [])
        first = int(np.searchsorted(self.ends, a, side="right"))
        last = int(np.searchsorted(self.ends, b, side="left"))
        shards = self.shards[first : last + 1].copy()
        starts = self.starts[first : last + 1].copy()
        stops = self.stops[first : last + 1].copy()
        before_first = int(self.ends[first]) - int(self.stops[first] - self.starts[first])
        starts[0] += a - before_first
        stops[-1] -= int(self.ends[last]) - b
        return SpanList(shards, starts, stops, self.pads[first : last + 1])

    def take(self, runs: Sequence[tuple[int, int]]) -> SpanList:
        """The spans covering each (start, stop) run of positions in turn, joined: what
        ``SpanList.join([self.slice(a, b) for a, b in runs])`` gives, in a few array steps."""
        if not len(runs) or not len(self):
            return SpanList([], [], [])
        bounds = np.asarray(runs, dtype=np.int64).reshape(-1, 2)
        a, b = np.maximum(bounds[:, 0], 0), np.minimum(bounds[:, 1], len(self))
        keep = a < b
        if not keep.any():
            return SpanList([], [], [])
        a, b = a[keep], b[keep]
        first = np.searchsorted(self.ends, a, side="right")
        last = np.searchsorted(self.ends, b, side="left")
        lengths = last - first + 1
        index = np.repeat(first - np.cumsum(np.concatenate([[0], lengths[:-1]])), lengths) + np.arange(lengths.sum())
        starts, stops = self.starts[index].copy(), self.stops[index].copy()
        begins = self.ends - (self.stops - self.starts)  # position of each span's first sample
        heads = np.cumsum(np.concatenate([[0], lengths[:-1]]))  # where each run's spans begin in the output
        tails = heads + lengths - 1
        starts[heads] += a - begins[first]
        stops[tails] -= self.ends[last] - b
        return SpanList(self.shards[index], starts, stops, self.pads[index])

    def locate(self, positions: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(shard, sample within the shard, pad flag) of each of ``positions``."""
        at = np.asarray(positions, dtype=np.int64)
        i = np.searchsorted(self.ends, at, side="right")
        before = self.ends[i] - (self.stops[i] - self.starts[i])  # positions ahead of span i
        return self.shards[i], self.starts[i] + at - before, self.pads[i]

    def shard_ranges(self) -> dict[int, tuple[int, int]]:
        """{shard: (first sample, one past the last)} over the spans of each shard."""
        ranges: dict[int, tuple[int, int]] = {}
        for shard, start, stop in zip(self.shards.tolist(), self.starts.tolist(), self.stops.tolist()):
            lo, hi = ranges.get(shard, (start, stop))
            ranges[shard] = (min(lo, start), max(hi, stop))
        return ranges

    def without_pads(self) -> SpanList:
        keep = ~self.pads
        return SpanList(self.shards[keep], self.starts[keep], self.stops[keep])

    def as_pads(self) -> SpanList:
        return SpanList(self.shards, self.starts, self.stops, np.ones(len(self.shards), dtype=bool))
