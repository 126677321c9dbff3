"""Shuffled reads by member places: each sample read where it lies, when the plan yields it.

``ExactEpochs``' shuffle yields a reader's share block by block (``ReaderPlan``): block
``q`` takes the next rows of every lane and yields them in an order drawn for ``q``.
Read through tar headers, the lanes are read in shard order and a block's samples are
held until it is yielded: 512 samples of 50 KB photos are 30 MB that leave the CPU's
caches, and glibc hands freed big blocks back to the OS (see ``pipes/allocator.py``): measured,
2.2-4.9x the cost of reading the same samples in order (1 KB to 100 KB members), 1.7-2.6x
with the allocator kept.

With member places the order costs nothing: the positions of a block are located in
their shards (``SpanList.locate``), and each sample is read at its place when it is
yielded: one ``pread`` from its first member's bytes to its last one's where that is at
most a megabyte, else one per member. Only the sample being yielded is held (and the
places of the open shards, about 100 bytes a member). The samples and their order are
those of the lanes.

Shards are opened as the reader reaches them (a local file, or a remote shard's copy in
the shard cache, see :func:`~.placed_reads.open_usable`), checked as ``read_placed`` checks them, and
kept open for the ``OPEN_PER_LANE * lanes`` most recently read (at least the shards of the
current block). Where a shard has no places or was modified since they were taken, the
rest of the share, from that sample on, is read by the lanes.
"""

from __future__ import annotations

import collections
from array import array
from collections.abc import Callable, Iterator

import numpy as np

from ..errors import ShardFormatError, shard_error
from ..handlers import EXACT_EPOCH_FLAG
from ..limits import Limits
from ..shards.openers import ShardUrl, plain_url, url_scheme
from ..stats.probe import current as current_probe
from ..stats.stalls import waits_on
from . import placed_reads
from .index import ShardIndex
from .placed_reads import bad_members, bad_place, open_usable, places_of_samples, read_new
from .plan import ReaderPlan
from .spans import SpanList

OPEN_PER_LANE = 2  # shards a reader keeps open per lane, the least recently read closed first


def shuffled_by_places(index: ShardIndex, reader: ReaderPlan, spans: SpanList, start: int, limits: Limits,
                       views: bool, lanes: Callable[[int], Iterator[dict]]) -> Iterator[dict]:
    """The samples of a shuffled reader's share from output position ``start``, each read at
    its place; from the first sample of a shard without usable places on, ``lanes(position)``."""
    shards = _PlacedShards(index, spans.shard_ranges(), limits, views, max(1, OPEN_PER_LANE * reader.lanes),
                           current_probe())
    try:
        stopped = yield from _placed(shards, reader, spans, start)
    finally:
        shards.close()
    if stopped is not None:
        yield from lanes(stopped)


def _placed(shards: _PlacedShards, reader: ReaderPlan, spans: SpanList, start: int):
    """Yields the samples from ``start`` on; returns None at the end, or the position of the
    first sample whose shard cannot be read by places."""
    position = start
    sampler = shards.sampler
    timed = sampler.first_at(start) if sampler is not None else -1  # stats: the next position timed (-1: off)
    try:
        for q in range(start // reader.block_size, reader.blocks):
            located = spans.locate(reader.block_positions(q)[position - q * reader.block_size :])
            block_shards, numbers, pads = (column.tolist() for column in located)
            shards.keep_at_least(len(set(block_shards)))
            for shard, number, pad in zip(block_shards, numbers, pads):
                try:
                    if position != timed:
                        sample = shards.sample(shard, number, pad)
                    else:  # one sample in a gap: its read timed (no countdown: the position is the count)
                        t0 = sampler.start()
                        sample = shards.sample(shard, number, pad)
                        timed = sampler.stop_at(t0, position, shards.read_bytes(shard, number))
                except _NotPlaced:
                    return position
                position += 1  # before the yield: a sample handed out is counted
                yield sample
    finally:
        if sampler is not None:
            sampler.finish_at(position)
    return None


class _NotPlaced(Exception):
    """A shard of the share has no usable places."""


class _Shard:
    """An open shard and the places of samples ``lo`` .. ``hi - 1``, compactly: a reader
    keeps a few dozen of these (measured: 96 bytes a member; lists of names, (key, suffix)
    pairs and offsets took 185)."""

    def __init__(self, index: ShardIndex, shard: int, lo: int, hi: int, file, limit: int):
        self.index, self.shard, self.lo, self.file, self.filesize = index, shard, lo, file, file.size
        url = index.url(shard)
        span = places_of_samples(index.places, shard, url, lo, hi)
        rows = span.rows
        self.url = ShardUrl.opened(url)
        self.plain = plain_url(url)  # what samples carry in __url__
        self.data = array("q", rows["data"].astype(np.int64).tobytes())
        self.sizes = array("q", rows["size"].astype(np.int64).tobytes())
        firsts = np.searchsorted(rows["sample"], np.arange(lo, hi + 1))  # per sample, its first member
        self.firsts = array("q", firsts.astype(np.int64).tobytes())
        self.keys, self.suffixes = span.keys, span.suffixes  # one string per distinct field name
        self.bad = bad_members(rows, file.size, limit).tolist()  # an error when their sample is read

    def name(self, member: int) -> str:
        """The name of member ``member`` (counted from sample ``lo``'s first), for errors."""
        number = self.lo + int(np.searchsorted(self.firsts, member, side="right")) - 1
        span = self.index.places.span(self.shard, number, number + 1)
        return span.name(member - self.firsts[number - self.lo])

    def truncated(self, member: int, got: int, wanted: int) -> ShardFormatError:
        return placed_reads.truncated(self.url, self.name(member), self.data[member], got, wanted)


class _PlacedShards:
    """The shards of one reader's share, opened as it reaches them, and its samples' reads."""

    def __init__(self, index: ShardIndex, ranges: dict[int, tuple[int, int]], limits: Limits, views: bool,
                 keep: int, probe=None):
        self.index, self.ranges, self.views, self.keep, self.limits = index, ranges, views, keep, limits
        # stats, where on: each shard's opening timed, one sample in a gap timed as its read
        self.probe, self.label = probe, index.base or "index"
        self.sampler = None
        if probe is not None:
            target = probe.target("read", url_scheme(index.url(next(iter(ranges)))) if ranges else "file", self.label)
            self.sampler = probe.sampler("read", source=target.source, label=self.label, io=target)
        self.limit = limits.max_member_bytes
        self.chunk = placed_reads.BUFFER_BYTES  # a sample's members up to this much are read at once
        self.open: collections.OrderedDict[int, _Shard] = collections.OrderedDict()
        self.checked: set[int] = set()  # shards whose cached copy was checked against its source

    def keep_at_least(self, shards: int) -> None:
        """Keeps the shards of a block open however many it reads from."""
        self.keep = max(self.keep, shards)

    def _shard(self, shard: int) -> _Shard:
        opened = self.open.get(shard)
        if opened is not None:
            self.open.move_to_end(shard)
            return opened
        if self.probe is None:
            opened = self._opened(shard)
        else:  # stats: the opening and its places, timed (not a sample's read)
            target = self.probe.target("open", url_scheme(self.index.url(shard)), self.label)
            opened = self.probe.opened(self._opened, target, shard)
        if opened is None:
            raise _NotPlaced(self.index.url(shard))
        self.open[shard] = opened
        if len(self.open) > self.keep:
            self.open.popitem(last=False)[1].file.close()
        return opened

    def _opened(self, shard: int) -> _Shard | None:
        """Shard ``shard`` opened with its places; None where it cannot be read by them."""
        url = self.index.url(shard)
        file = open_usable(self.index.places, shard, url, self.index.shards[shard].filesize, self.limits,
                           revalidate=shard not in self.checked)
        if file is None:
            return None
        self.checked.add(shard)
        try:
            return _Shard(self.index, shard, *self.ranges[shard], file, self.limit)
        except BaseException:
            file.close()
            raise

    def sample(self, shard: int, number: int, pad: bool) -> dict:
        """Sample ``number`` of ``shard`` as group_by_key makes it, with ``__pad__`` set."""
        s = self._shard(shard)
        a, b = s.firsts[number - s.lo], s.firsts[number - s.lo + 1]
        data, sizes, suffixes = s.data, s.sizes, s.suffixes
        if s.bad:
            self._check(s, a, b)
        sample = {"__key__": s.keys[number - s.lo], "__url__": s.plain}
        low, high = data[a], data[b - 1] + sizes[b - 1]  # the members and the headers between them
        if high - low <= self.chunk:
            view = self._read(s, a, b, low, high)
            for m in range(a, b):
                at = data[m] - low
                sample[suffixes[m]] = view[at : at + sizes[m]]  # a copy of its own, or a view (views)
        else:  # each member straight into its bytes (no unnamed member between them read)
            for m in range(a, b):
                sample[suffixes[m]] = self._read_member(s, m)
        sample[EXACT_EPOCH_FLAG] = pad
        return sample

    def read_bytes(self, shard: int, number: int) -> int:
        """The bytes reading sample ``number`` of ``shard`` (open) takes: its members and the
        headers between them, or the members alone where they are read one by one (stats)."""
        s = self.open[shard]
        a, b = s.firsts[number - s.lo], s.firsts[number - s.lo + 1]
        span = s.data[b - 1] + s.sizes[b - 1] - s.data[a]
        return span if span <= self.chunk else sum(s.sizes[a:b])

    @waits_on(lambda f: (f["s"].url, "reading", f["low"]))  # the stall watchdog's: nothing per call
    def _read(self, s: _Shard, a: int, b: int, low: int, high: int) -> bytes | memoryview:
        """The shard's bytes ``low`` .. ``high - 1`` (members ``a`` .. ``b - 1``), as ``read_new`` gives them."""
        try:
            view = read_new(s.file, high - low, low, self.views)
        except OSError as exn:
            raise shard_error(exn, s.url, s.name(a), low) from exn
        if len(view) < high - low:
            short = next(m for m in range(a, b) if s.data[m] + s.sizes[m] - low > len(view))
            raise s.truncated(short, max(0, len(view) - (s.data[short] - low)), s.sizes[short])
        return view

    @waits_on(lambda f: (f["s"].url, "reading", f["s"].data[f["m"]]))
    def _read_member(self, s: _Shard, m: int) -> bytes | memoryview:
        try:
            field = read_new(s.file, s.sizes[m], s.data[m], self.views)
        except OSError as exn:
            raise shard_error(exn, s.url, s.name(m), s.data[m]) from exn
        if len(field) < s.sizes[m]:
            raise s.truncated(m, len(field), s.sizes[m])
        return field

    def _check(self, s: _Shard, a: int, b: int) -> None:
        for m in s.bad:
            if a <= m < b:
                raise bad_place(s.url, s.name(m), s.data[m], s.sizes[m], s.filesize, self.limit)

    def close(self) -> None:
        while self.open:
            self.open.popitem()[1].file.close()
