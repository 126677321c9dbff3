"""Reading samples by their member places: a megabyte at a time, no tar header parsed.

:func:`read_placed` reads a local shard's samples a megabyte at a time into new ``bytes``
and slices each member out of them (its copy; ``views=True``: a memoryview of the read),
and parses no tar header (1.5-4x the raw rate of ``load_tar().group_by_key()``, see
benchmarks/bench_pipeline.py). Slicing new bytes was measured 10-24% faster than reading
into one reused buffer and copying each member out with ``bytes()`` (photos, 1 KB and
100 KB members). Members larger than a read are read straight into their ``bytes`` with one
``pread``; for smaller ones that was measured slower (100 KB members: 61k against 71k
samples/s). The checks every reader by places shares (a shard's stamp, the places of a
span, a bad place, a short read) live here too; a shuffled share is read by
:mod:`.placed_shuffle`.

Where the shard cache keeps a shard (a remote one, or a local one on a network
filesystem), it is read by its places from its complete copy
(:func:`~wds_datapipes.cache.layer.cached_copy`), and through its headers until there
is one: that read downloads it.
"""

from __future__ import annotations

import bisect
import functools
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from ..cache.layer import cached_copy, keeps
from ..errors import IndexMismatchError, ShardFormatError, ShardOpenError, shard_error
from ..limits import Limits
from ..shards.openers import ShardUrl, file_version, local_path, plain_url, url_scheme
from ..stats.probe import current as current_probe
from ..stats.stalls import waits_on
from .places import MemberPlaces, SpanPlaces, stat_stamp

if TYPE_CHECKING:
    from ..cache.streams import LocalCopy

logger = logging.getLogger("wds_datapipes")

BUFFER_BYTES = 1 << 20  # runs of members up to this size are read at once, larger members on their own
_warned: set[str] = set()  # shards whose stale places were reported in this process


def read_placed(places: MemberPlaces, shard: int, url: str, start: int, stop: int, filesize: int | None,
                limits: Limits, last_fields: dict | None = None, views: bool = False,
                label: str | None = None) -> Iterator[dict] | None:
    """The samples ``start`` .. ``stop - 1`` of shard ``shard`` (dicts as ``group_by_key``
    makes them, ``last_fields`` set on each), read by their places; None where the shard has
    none or changed since they were taken (then read its headers).

    ``views``: fields are memoryviews of the ``bytes`` of each read (one copy per member),
    not copies of their own. ``label``: the source stats count it under (the index's folder)."""
    probe = current_probe()
    if probe is None:
        file, meter = open_usable(places, shard, url, filesize, limits), None
    else:  # the opening and each read timed, the samples counted where the span ends: nothing per sample
        scheme, label = url_scheme(url), label or "index"
        file = probe.opened(open_usable, probe.target("open", scheme, label), places, shard, url, filesize, limits)
        meter = (probe, probe.target("read", scheme, label))
    if file is None:
        return None
    try:
        span = places_of_samples(places, shard, url, start, stop)
    except BaseException:
        file.close()
        raise
    return _placed_samples(file, ShardUrl.opened(url), span, limits, last_fields or {}, views, meter)


class LocalShard:
    """A local shard's descriptor, read by places: ``pread(size, offset)`` as ``os.pread``
    (what a cached copy, :class:`~wds_datapipes.cache.streams.LocalCopy`, offers too)."""

    __slots__ = ("fd", "pread", "size")

    def __init__(self, fd: int, size: int):
        self.fd, self.size = fd, size
        self.pread = functools.partial(os.pread, fd)  # no Python frame per read

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:  # a reader dropped before it began
        self.close()


@waits_on(lambda f: (f["url"], "opening", None))  # the stall watchdog's: nothing per call
def open_usable(places: MemberPlaces, shard: int, url: str, filesize: int | None, limits: Limits,
                revalidate: bool = True) -> LocalShard | LocalCopy | None:
    """Shard ``shard``'s bytes where they can be read by its places (close it when done): the
    local file, checked to be the one its places were taken from, or the complete copy the
    shard cache holds of a shard it keeps (checked against its source unless not
    ``revalidate``). None where the shard has no places, was modified since they were taken
    (said once per shard and process), or is kept by the cache but not held whole yet. A
    missing local shard, or one of another size than the index says, raises."""
    expected = places.stamp(shard)
    if expected is None:
        return None
    if url_scheme(url) == "file":
        try:
            stamp = stat_stamp(os.stat(local_path(url)))
        except OSError as exn:
            raise ShardOpenError(url, f"{type(exn).__name__}: {exn}") from exn
        _check_size(url, stamp[0], filesize)
        if stamp != expected:
            return _changed(url)
        if not keeps(url):
            return LocalShard(open_placed(local_path(url), ShardUrl.opened(url), stamp), stamp[0])
        copy = cached_copy(url, limits, revalidate=False)  # the file was just asked, by its stamp
        if copy is not None and (copy.size, copy.version) != (stamp[0], file_version(stamp[1])):
            copy.close()
            return None
        return copy
    copy = cached_copy(url, limits, revalidate)
    if copy is None:
        return None
    try:
        _check_size(url, copy.size, filesize)
    except IndexMismatchError:
        copy.close()
        raise
    if copy.size != expected[0] or (None not in (copy.version, expected[1]) and copy.version != expected[1]):
        copy.close()
        return _changed(url)
    return copy


def _check_size(url: str, size: int, filesize: int | None) -> None:
    if filesize is not None and size != filesize:
        raise IndexMismatchError(f"shard {url!r} has {size} bytes, the index says {filesize}: "
                                 "it changed since it was indexed; index it again")


def _changed(url: str) -> None:
    if url not in _warned:  # once per shard and process, not once per span
        _warned.add(url)
        logger.warning("shard %r was modified since its member places were taken (its modification time or "
                       "version differs); reading its headers instead. Index it again to read it by places.", url)


def places_of_samples(places: MemberPlaces, shard: int, url: str, start: int, stop: int) -> SpanPlaces:
    """The places of samples ``start`` .. ``stop - 1``, checked to hold those samples."""
    span = places.span(shard, start, stop)
    if not _numbered(span.rows["sample"], start, stop):
        raise IndexMismatchError(f"shard {url!r}: its member places do not hold samples {start} .. {stop - 1} "
                                 "that the index counts; index it again")
    return span


def open_placed(path: str, url: ShardUrl, stamp: tuple[int, int]) -> int:
    """A descriptor of the shard at ``path``, checked to be the file its places were taken from."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exn:
        raise ShardOpenError(url, f"{type(exn).__name__}: {exn}") from exn
    try:
        opened = stat_stamp(os.fstat(fd))
    except OSError as exn:
        os.close(fd)
        raise ShardOpenError(url, f"{type(exn).__name__}: {exn}") from exn
    if opened != stamp:
        os.close(fd)
        raise IndexMismatchError(f"shard {url!r} changed while it was opened; read it again")
    return fd


def bad_members(rows: np.ndarray, filesize: int, limit: int) -> np.ndarray:
    """The indices of ``rows`` whose place is over ``limit`` bytes or past the end of a
    ``filesize``-byte file (no sum that could wrap: the records may be corrupt)."""
    data, size = rows["data"], rows["size"]
    return np.flatnonzero((size > limit) | (data > filesize) | (size > filesize - np.minimum(data, filesize)))


def bad_place(url: ShardUrl, name: str, offset: int, size: int, filesize: int, limit: int) -> ShardFormatError:
    """The error for a member :func:`bad_members` picked: over the size limit or past the file's end."""
    return ShardFormatError(url, name, offset, f"its place says {size} bytes at byte {offset}: "
                            + ("more than the limit of Limits.max_member_bytes" if size > limit
                               else f"past the end of the {filesize}-byte file"))


def _numbered(numbers: np.ndarray, start: int, stop: int) -> bool:
    """Whether the members' sample numbers run through ``start`` .. ``stop - 1``, each a run."""
    if not len(numbers):
        return stop <= start
    steps = np.diff(numbers.astype(np.int64))
    return numbers[0] == start and numbers[-1] == stop - 1 and bool(((steps == 0) | (steps == 1)).all())


@waits_on(lambda f: (f["url"], "reading", f["offset"]))  # a read starts at the member's offset
def _placed_samples(file, url: ShardUrl, span: SpanPlaces, limits: Limits, last_fields: dict,
                    views: bool, meter: tuple | None = None) -> Iterator[dict]:
    """The samples of ``span``: members sliced out of reads of up to a megabyte (one read for
    a run of small members, a member larger than that read on its own), grouped by the sample
    numbers the scan gave them (one loop: a generator less per member).

    A member is checked against the read it falls in, and only a member outside it (about one
    in twenty photos) asks whether it is large: the fewest steps per member. ``meter``: stats'
    (probe, read target) where they are on: each read is timed; the samples handed out are
    counted when the span ends, from the sample numbers (they run without a gap)."""
    plain = plain_url(url)  # samples carry a plain str in __url__, as webdataset's do
    rows = span.rows
    offset = -1
    probe, target = meter if meter is not None else (None, None)
    current = first = int(rows["sample"][0]) - 1 if len(rows) else -1
    try:
        filesize = file.size
        chunk = BUFFER_BYTES
        view = b""
        base = end = 0  # the file's bytes [base, base + end) are in view
        limit = limits.max_member_bytes
        sample: dict | None = None
        keys = iter(span.keys)
        bad = bad_members(rows, filesize, limit)
        good = int(bad[0]) if len(bad) else len(rows)  # the members read before the first bad place
        kept = rows[:good]
        starts, sizes = kept["data"].tolist(), kept["size"].tolist()
        last = starts[-1] + sizes[-1] if starts else 0  # no read goes past the last member's end
        large = kept["data"][kept["size"] > chunk].tolist()  # ... nor into a member read on its own
        alone = None  # a member read on its own
        for suffix, offset, size, number in zip(span.suffixes, starts, sizes, kept["sample"].tolist()):
            at = offset - base
            if not 0 <= at <= end - size:
                if size > chunk:
                    alone = read_new(file, size, offset, views) if probe is None else \
                        probe.read_call(target, read_new, file, size, offset, views)
                    if len(alone) < size:
                        raise _truncated(url, span, offset, len(alone), size)
                    at = -1
                else:
                    base, at = offset, 0
                    stop = min(offset + chunk, last)
                    if large:
                        after = bisect.bisect_right(large, offset)
                        stop = min(stop, large[after]) if after < len(large) else stop
                    view = read_new(file, stop - offset, offset, views) if probe is None else \
                        probe.read_call(target, read_new, file, stop - offset, offset, views)  # views keep theirs
                    end = len(view)
                    if end < size:
                        raise _truncated(url, span, offset, end, size)
            if number != current:
                if sample is not None:
                    sample.update(last_fields)
                    yield sample
                current = number
                sample = {"__key__": next(keys), "__url__": plain}
            sample[suffix] = view[at : at + size] if at >= 0 else alone  # a copy of its own, or a view (views)
        if good < len(rows):  # the sample it is in is not yielded
            raise bad_place(url, span.name(good), int(rows["data"][good]), int(rows["size"][good]), filesize, limit)
        if sample is not None:
            sample.update(last_fields)
            yield sample
    except OSError as exn:
        if offset < 0:
            raise shard_error(exn, url, offset=0) from exn
        raise shard_error(exn, url, span.name(span.member_at(offset)), offset) from exn
    finally:
        file.close()
        if target is not None:  # the samples through ``current`` were handed out (one short after an error)
            target.flush()
            target.counted(current - first)


def read_new(file: LocalShard | LocalCopy, size: int, offset: int, views: bool) -> bytes | memoryview:
    """``size`` bytes at ``offset`` of ``file`` in new ``bytes`` (slicing them copies a member:
    measured faster than a reused buffer and ``bytes()``), a memoryview of them for views."""
    data = file.pread(size, offset)
    return memoryview(data) if views else data


def truncated(url: ShardUrl, name: str, offset: int, got: int, wanted: int) -> ShardFormatError:
    """The error for member ``name`` at ``offset``, of which a read got ``got`` of ``wanted`` bytes."""
    return ShardFormatError(url, name, offset, f"truncated: {got} of {wanted} bytes")


def _truncated(url: ShardUrl, span: SpanPlaces, offset: int, got: int, wanted: int) -> ShardFormatError:
    return truncated(url, span.name(span.member_at(offset)), offset, got, wanted)

