"""Reading a reader's share of an exact epoch, in the plan's order.

In order, a share is its spans read one after the other; shuffled, its lanes are read
side by side and yielded block by block (:class:`~.plan.ReaderPlan`), or, over an index
with member places, sample by sample at their places (:mod:`.placed_shuffle`). One span
is read by its member places where the shard has them, else through its tar headers,
entered at the span's first sample with one seek or Range request where the index has
offsets. A shard that no longer matches the index raises :class:`IndexMismatchError`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from ..cache.layer import log_cache_stats
from ..errors import IndexMismatchError
from ..handlers import EXACT_EPOCH_FLAG
from ..limits import Limits, get_limits
from ..shards.grouping import group_members, split_key
from ..shards.openers import ShardUrl, local_path, open_shard, stream_size, url_scheme
from ..stats.probe import current as current_probe
from ..stats.stalls import note_shard
from ..stats.tallies import MixTally
from ..tar import iter_tar_members
from .index import ShardIndex
from .mixture import MixReader
from .placed_reads import read_placed
from .placed_shuffle import shuffled_by_places
from .plan import ReaderPlan
from .spans import Span, SpanList

PAD_KEY = EXACT_EPOCH_FLAG
SOURCE_KEY = "__source__"  # a mixture's sample: the name of its source


def check_shards(index: ShardIndex, spans: SpanList) -> None:
    """Raises :class:`IndexMismatchError` before a sample is read where a local shard of
    ``spans`` has another size than the index says (a remote one is checked when opened,
    a missing one fails to open)."""
    changed = []
    for shard in np.unique(spans.shards).tolist():
        info, url = index.shards[shard], index.url(shard)
        if info.filesize is None or url_scheme(url) != "file":
            continue
        try:
            size = os.stat(local_path(url)).st_size
        except OSError:
            continue
        if size != info.filesize:
            changed.append(f"shard {url!r} has {size} bytes, the index says {info.filesize}")
    if changed:
        raise IndexMismatchError("; ".join(changed[:5]) + (f"; and {len(changed) - 5} more" if len(changed) > 5 else "")
                                 + ": it changed since it was indexed; index it again")


def read_mixed(indexes: list[ShardIndex], names: tuple[str, ...], reader: MixReader, start: int,
               limits: Limits | None = None, views: bool = False, mix: MixTally | None = None) -> Iterator[dict]:
    """The samples of one reader's part of a mixed epoch, from its position ``start``: each
    source's run read as one dataset's share is, the arrangement saying whose sample comes
    next; each sample says its source (``__source__``). ``mix``: stats' tally of the draws,
    where they are on (each source's reads then count under its name)."""
    if start >= reader.length:
        return
    taken = reader.taken(start).tolist()
    streams = [read_share(index, plan, spans, at, limits, views)
               for index, plan, spans, at in zip(indexes, reader.plans, reader.spans, taken)]
    probe = current_probe() if mix is not None else None
    try:
        for run in reader.sources(start):
            for k in run.tolist():
                if probe is None:
                    sample = next(streams[k], None)
                else:
                    probe.source = names[k]
                    sample = next(streams[k], None)
                    probe.source = None
                    mix.counts[k] += 1
                if sample is None:  # the plan and the reads disagree: never silently short
                    raise IndexMismatchError(f"source {names[k]!r} ran out of samples before its share of the epoch")
                sample[SOURCE_KEY] = names[k]
                yield sample
    finally:
        for stream in streams:
            stream.close()


def read_share(index: ShardIndex, reader: ReaderPlan, spans: SpanList, start: int,
               limits: Limits | None = None, views: bool = False) -> Iterator[dict]:
    """The samples of one reader's share, from output position ``start``, in the plan's order
    (the shard cache's counters logged at its end, where the cache is on)."""
    if start >= reader.length:
        return
    if not reader.shuffle:
        for span in spans.slice(start, reader.length):  # not through _lane_samples: a generator less per sample
            yield from span_samples(index, span, limits, views)
    elif index.places is not None:  # each sample at its place, the lanes from where a shard has none
        yield from shuffled_by_places(index, reader, spans, start, limits or get_limits(), views,
                                      lambda at: _shuffled_lanes(index, reader, spans, at, limits, views))
    else:
        yield from _shuffled_lanes(index, reader, spans, start, limits, views)
    log_cache_stats("reader's share")


def _shuffled_lanes(index: ShardIndex, reader: ReaderPlan, spans: SpanList, start: int, limits: Limits | None,
                    views: bool) -> Iterator[dict]:
    """A shuffled share read lane by lane in shard order, each block held and yielded in its order."""
    if start >= reader.length:
        return
    first_block = start // reader.block_size
    taken = reader.taken_per_lane(start)
    lanes = [_lane_samples(index, spans.slice(a + t, b), limits, views)
             for (a, b), t in zip(reader.lane_bounds(), taken)]
    try:
        for q in range(first_block, reader.blocks):
            members = reader.block_rows(q)
            by_lane: dict[int, list[dict]] = {}
            for lane, _ in members:
                by_lane.setdefault(lane, []).append(next(lanes[lane]))
            seen = dict.fromkeys(by_lane, 0)
            samples = []
            for lane, _ in members:
                samples.append(by_lane[lane][seen[lane]])
                seen[lane] += 1
            order = reader.block_order(q, len(samples))
            skip = start - q * reader.block_size if q == first_block else 0
            for i in order[skip:].tolist():
                yield samples[i]
    finally:
        for lane in lanes:
            lane.close()


def _lane_samples(index: ShardIndex, spans: SpanList, limits: Limits | None, views: bool) -> Iterator[dict]:
    for span in spans:
        yield from span_samples(index, span, limits, views)


def span_samples(index: ShardIndex, span: Span, limits: Limits | None = None, views: bool = False) -> Iterator[dict]:
    """The samples ``span.start`` .. ``span.stop - 1`` of one shard, each with its ``__pad__`` flag.

    By the shard's member places where it has them (their reader is returned as it is: a
    generator less per sample). Otherwise, with offsets in the index, the shard is opened at
    the span's first sample; without, the samples before it are passed over reading headers
    only. A shard that has fewer samples, or more, or another size than the index says is an
    :class:`IndexMismatchError`.
    """
    if index.places is not None:
        info = index.shards[span.shard]
        samples = read_placed(index.places, span.shard, index.url(span.shard), span.start, span.stop,
                              info.filesize, limits or get_limits(), {PAD_KEY: span.pad}, views, index.base)
        if samples is not None:
            return samples  # read_placed checked that its places hold the span's samples
    return _scanned_span_samples(index, span, limits, views)


def _scanned_span_samples(index: ShardIndex, span: Span, limits: Limits | None, views: bool) -> Iterator[dict]:
    """:func:`span_samples` read by the shard's headers."""
    url = index.url(span.shard)
    info = index.shards[span.shard]
    offset = index.sample_offset(span.shard, span.start) if span.start else 0
    skip = span.start if offset is None else 0
    to_end = span.stop == info.nsamples  # read to the end of the archive: the count is checked whole
    probe = current_probe()
    if probe is None:
        stream = open_shard(url, start=offset or 0, limits=limits)
    else:  # as load_tar's: the opening and each read timed; one sample in a gap timed as tar
        scheme, label = url_scheme(url), index.base or "index"
        note = note_shard(url, offset or 0)  # the stall watchdog's: this thread's shard, its offset once open
        stream = probe.opened(open_shard, probe.target("open", scheme, label), url, start=offset or 0, limits=limits)
        stream = note.stream = probe.reading(stream, probe.target("read", scheme, label))
    try:
        size = stream_size(stream)
        if info.filesize is not None and size is not None and size != info.filesize:
            raise IndexMismatchError(f"shard {url!r} has {size} bytes, the index says {info.filesize}: "
                                     "it changed since it was indexed; index it again")
        opened = ShardUrl.opened(url)
        skipper = _SampleSkipper(skip) if skip else None
        members = iter_tar_members(stream, opened, start=offset or 0, skip_data=skipper, limits=limits)
        taken = 0
        samples = group_members(opened, _kept(members) if skipper else members)
        if probe is not None:
            samples = probe.shared_sampler("tar").wrap(samples, probe.io.source)
        for sample in samples:
            if taken == len(span):
                if to_end:
                    raise IndexMismatchError(f"shard {url!r} has more than {info.nsamples} samples, the index "
                                             f"says {info.nsamples}: it changed since it was indexed; index it again")
                return  # the next sample's first member was read; the rest of the shard is not
            sample[PAD_KEY] = span.pad
            if views:
                for field, value in sample.items():
                    if isinstance(value, bytes):
                        sample[field] = memoryview(value)
            yield sample
            taken += 1
        skipped = min(skipper.samples, skip) if skipper else 0
        if taken < len(span) or skipped < skip:
            raise IndexMismatchError(f"shard {url!r} ends after {span.start - skip + skipped + taken} samples, "
                                     f"the index says {info.nsamples}: it changed since it was indexed; index it again")
    finally:
        stream.close()


def _kept(members: Iterator[tuple[str, bytes | None]]) -> Iterator[tuple[str, bytes]]:
    """The members after the skipped ones (whose bytes are None)."""
    for name, data in members:
        if data is not None:
            yield name, data


class _SampleSkipper:
    """``skip_data`` for the tar reader: True for the members of the first ``count`` samples."""

    def __init__(self, count: int):
        self.count = count
        self.samples = 0  # samples passed over so far
        self.key: str | None = None

    def __call__(self, name: str) -> bool:
        if self.samples > self.count:
            return False
        split = split_key(name)
        if split is None:
            return True
        if split[0] != self.key:
            self.key = split[0]
            self.samples += 1
        return self.samples <= self.count
