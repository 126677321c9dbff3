"""Shuffled reads by member places: each sample read where it lies, when the plan yields it.

``ExactEpochs``' shuffle yields a reader's share block by block (``ReaderPlan``): block
``q`` takes the next rows of every lane and yields them in an order drawn for ``q``.
Read through tar headers, the lanes are read in shard order and a block's samples are
held until it is yielded: 512 samples of 50 KB photos are 30 MB that leave the CPU's
caches, and glibc hands freed big blocks back to the OS (see ``allocator.py``): measured,
2.2-4.9x the cost of reading the same samples in order (1 KB to 100 KB members), 1.7-2.6x
with the allocator kept.

With member places the order costs nothing: the positions of a block are located in
their shards (``SpanList.locate``), and each sample is read at its place with one
``pread`` when it is yielded (its members are adjacent in the shard). Only the sample
being yielded is held. The samples and their order are those of the lanes.

Shards are opened as a reader reaches them and kept open (with the places of the samples
the reader takes from them) for the ``OPEN_PER_LANE * lanes`` most recently read: a block's
lanes read from about one shard each at a time.
"""

from __future__ import annotations

import collections
import os
from array import array
from collections.abc import Iterator

import numpy as np

from .epoch_plan import ReaderPlan, SpanList
from .errors import ShardFormatError, shard_error
from .grouping import split_key
from .handlers import EXACT_EPOCH_FLAG as PAD_KEY
from .limits import Limits
from .member_places import BUFFER_BYTES, check_place, open_placed, places_of_samples, read_at, usable_stamp
from .openers import ShardUrl, local_path
from .shard_index import ShardIndex

OPEN_PER_LANE = 2  # shards a reader keeps open per lane, the least recently read closed first


def shuffled_by_places(index: ShardIndex, reader: ReaderPlan, spans: SpanList, start: int, limits: Limits,
                       views: bool) -> Iterator[dict] | None:
    """The samples of a shuffled reader's share from output position ``start``, each read at
    its place; None where a shard of the share has no usable places (then read the lanes)."""
    if index.places is None:
        return None
    ranges = spans.shard_ranges()
    stamps = {}
    for shard in ranges:
        stamp = usable_stamp(index.places, shard, index.url(shard), index.shards[shard].filesize)
        if stamp is None:
            return None
        stamps[shard] = stamp
    keep = max(1, OPEN_PER_LANE * reader.lanes)
    return _read(_PlacedShards(index, ranges, stamps, limits, views, keep), reader, spans, start)


def _read(shards: _PlacedShards, reader: ReaderPlan, spans: SpanList, start: int) -> Iterator[dict]:
    try:
        first_block = start // reader.block_size
        for q in range(first_block, reader.blocks):
            positions = reader.block_positions(q)
            if q == first_block:
                positions = positions[start - q * reader.block_size:]
            located = spans.locate(positions)
            for shard, number, pad in zip(*(column.tolist() for column in located)):
                yield shards.sample(shard, number, pad)
    finally:
        shards.close()


class _Shard:
    """An open shard and the places of samples ``lo`` .. ``hi - 1``, compactly: a reader
    keeps a few dozen of these (measured: 96 bytes a member; lists of names, (key, suffix)
    pairs and offsets took 185)."""

    def __init__(self, index: ShardIndex, shard: int, lo: int, hi: int, stamp: tuple[int, int], limit: int):
        self.index, self.shard, self.lo, self.filesize = index, shard, lo, stamp[0]
        url = index.url(shard)
        rows, names = places_of_samples(index.places, shard, url, lo, hi)
        self.url = ShardUrl.opened(url)
        self.data = array("q", rows["data"].astype(np.int64).tobytes())
        self.sizes = array("q", rows["size"].astype(np.int64).tobytes())
        firsts = np.searchsorted(rows["sample"], np.arange(lo, hi + 1))  # per sample, its first member
        self.firsts = array("q", firsts.astype(np.int64).tobytes())
        splits = [split_key(name) for name in names]  # the scan kept only names with a key
        self.keys = [splits[f][0] for f in firsts[:-1].tolist()]
        common: dict[str, str] = {}  # one string per distinct suffix
        self.suffixes = [common.setdefault(suffix, suffix) for _, suffix in splits]
        # Members whose place is over the limit or past the file's end: an error when their sample is read.
        self.bad = np.flatnonzero((rows["size"] > limit) | (rows["data"] + rows["size"] > stamp[0])).tolist()
        self.fd = open_placed(local_path(url), self.url, stamp)

    def name(self, member: int) -> str:
        """The name of member ``member`` (counted from sample ``lo``'s first), for errors."""
        number = self.lo + int(np.searchsorted(self.firsts, member, side="right")) - 1
        _, names = self.index.places.span(self.shard, number, number + 1)
        return names[member - self.firsts[number - self.lo]]


class _PlacedShards:
    """The shards of one reader's share, opened as it reaches them."""

    def __init__(self, index: ShardIndex, ranges: dict[int, tuple[int, int]], stamps: dict[int, tuple[int, int]],
                 limits: Limits, views: bool, keep: int):
        self.index, self.ranges, self.stamps, self.views, self.keep = index, ranges, stamps, views, keep
        self.limit = limits.max_member_bytes
        self.open: collections.OrderedDict[int, _Shard] = collections.OrderedDict()
        self.buffer = None if views else memoryview(bytearray(BUFFER_BYTES))

    def _shard(self, shard: int) -> _Shard:
        opened = self.open.get(shard)
        if opened is None:
            opened = self.open[shard] = _Shard(self.index, shard, *self.ranges[shard], self.stamps[shard], self.limit)
            if len(self.open) > self.keep:
                os.close(self.open.popitem(last=False)[1].fd)
        else:
            self.open.move_to_end(shard)
        return opened

    def sample(self, shard: int, number: int, pad: bool) -> dict:
        """Sample ``number`` of ``shard`` as group_by_key makes it, with ``__pad__`` set."""
        s = self._shard(shard)
        a, b = s.firsts[number - s.lo], s.firsts[number - s.lo + 1]
        data, sizes, suffixes = s.data, s.sizes, s.suffixes
        if s.bad:
            self._check(s, a, b)
        low, high = data[a], data[b - 1] + sizes[b - 1]  # the members and the headers between them
        sample = {"__key__": s.keys[number - s.lo], "__url__": s.url}
        try:
            if self.views:
                view = memoryview(os.pread(s.fd, high - low, low))
            elif high - low <= BUFFER_BYTES:
                view = self.buffer[: read_at(s.fd, self.buffer[: high - low], low)]
            else:  # too large for the buffer: each member straight into its bytes
                view = None
                for m in range(a, b):
                    field = sample[suffixes[m]] = os.pread(s.fd, sizes[m], data[m])
                    if len(field) < sizes[m]:
                        raise ShardFormatError(s.url, s.name(m), data[m], f"truncated: {len(field)} of {sizes[m]} "
                                               "bytes")
        except OSError as exn:
            raise shard_error(exn, s.url, s.name(a), low) from exn
        if view is not None:
            if len(view) < high - low:
                raise ShardFormatError(s.url, s.name(a), low, f"truncated: {len(view)} of {high - low} bytes")
            for m in range(a, b):
                at = data[m] - low
                sample[suffixes[m]] = view[at : at + sizes[m]] if self.views else bytes(view[at : at + sizes[m]])
        sample[PAD_KEY] = pad
        return sample

    def _check(self, s: _Shard, a: int, b: int) -> None:
        for m in s.bad:
            if a <= m < b:
                check_place(s.url, s.name(m), s.data[m], s.sizes[m], s.filesize, self.limit)

    def close(self) -> None:
        while self.open:
            os.close(self.open.popitem()[1].fd)
