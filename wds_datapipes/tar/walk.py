"""The tar walk: (member name, bytes) for each regular file of a tar stream, plain or compressed.

It never seeks backwards, so pipes and HTTP bodies work. It fills one reusable buffer
with ``readinto`` and parses headers in place, copying each member's bytes once: several
times faster than ``tarfile`` (see benchmarks/bench_pipeline.py). Its members are those
``tarfile`` (and so webdataset) reads, with the same names and bytes: ustar and v7
headers, the ustar name prefix, GNU long names, PAX records, GNU sparse members (old GNU,
PAX 0.0, 0.1 and 1.0), and gzip, bzip2, xz and zstd streams (found by their first bytes).
Where the two differ on a damaged archive, this reader stops with an error where tarfile
yields less or other data; docs/security.md lists each difference.

Nothing it reads allocates more than the bytes that arrived (a size field can claim
anything), and members are bounded by :class:`~wds_datapipes.limits.Limits`. Every
failure, whatever raised it, ends as a :class:`ShardFormatError` or
:class:`ShardReadError` naming the shard, the member and the byte offset.

The layers, bottom up: :mod:`.sources` (the shard's bytes, decompressed), :mod:`.blocks`
(the buffer), :mod:`.headers` and :mod:`.extended` (what a header says), this module's
hot loop over plain members, and :mod:`.header_kinds` for every other kind of header.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterator
from typing import BinaryIO

from ..errors import ShardFormatError, ShardReadError, WdsError, shard_error
from ..limits import Limits, get_limits
from .blocks import CHUNK, BlockReader
from .extended import MEMBER_KEY_STARTS, Pending
from .header_kinds import END, HeaderKinds
from .headers import BLOCK, ENDS, PAX, PAX_LENGTHS, REGULAR, header_ok, member_name, octal
from .sources import Decompressed, Source, compression

logger = logging.getLogger("wds_datapipes")
# After the end-of-archive block of a compressed shard, read this much more at most, so
# that the checksum trailer of its last gzip member (or xz/zstd frame) is checked.
_DRAIN_LIMIT = 16 << 20

# ---------------------------------------------------------------- public entry points


def iter_tar_members(stream: BinaryIO, url: str, chunk_size: int = CHUNK, *, start: int = 0,
                     skip_data: Callable[[str], bool] | None = None,
                     limits: Limits | None = None) -> Iterator[tuple[str, bytes | None]]:
    """Yields (member name, bytes) for each regular file in the tar ``stream`` (plain or compressed).

    Directories, links and other non-files are skipped. A truncated or corrupt archive
    raises :class:`ShardFormatError`, a broken stream :class:`ShardReadError`, each naming
    ``url``, the member and the byte offset (in the uncompressed tar). Unlike ``tarfile``,
    a stream that stops without tar's end-of-archive block counts as truncated: a cut at a
    block boundary would otherwise drop the rest of the shard unnoticed.

    Args:
        start: the byte of the tar at which ``stream`` stands (a member's first header
            block, e.g. from a shard index); offsets in errors count from the tar's start.
        skip_data: called with each member's name; where it returns True the member is
            yielded as (name, None) and its bytes are not read (seeked over where the
            stream can seek).
        limits: the largest member and extended header read (default: :func:`get_limits`).
    """
    return TarWalk(stream, url, chunk_size, start, limits or get_limits()).members(skip_data)


def iter_tar_index(stream: BinaryIO, url: str, chunk_size: int = CHUNK,
                   limits: Limits | None = None) -> Iterator[tuple[str, int | None]]:
    """Yields (member name, byte offset of its first header block) for each regular file.

    The offset is where a reader may start to get this member (its PAX or GNU long-name
    header blocks included); None for compressed shards, where no byte can be seeked to.
    Member bytes are never copied.
    """
    for name, offset, _, _ in iter_tar_places(stream, url, chunk_size, limits):
        yield name, offset


def iter_tar_places(stream: BinaryIO, url: str, chunk_size: int = CHUNK,
                    limits: Limits | None = None) -> Iterator[tuple[str, int | None, int | None, int]]:
    """Yields (member name, offset of its first header block, offset of its bytes, size) for each regular file.

    The offsets are None for compressed shards (no byte can be seeked to), and the bytes'
    offset None for a sparse member (its bytes are not one run of the tar). Member bytes
    are never copied.
    """
    walk = TarWalk(stream, url, chunk_size, 0, limits or get_limits())
    for name, (entry, data, size) in walk.members(_ALWAYS, with_offsets=True):
        if walk.compression:
            yield name, None, None, size
        else:
            yield name, entry, data, size


def _ALWAYS(name: str) -> bool:
    return True


# ---------------------------------------------------------------- the walk over headers


class TarWalk(HeaderKinds):
    """One pass over a tar stream: the header loop and one small method per kind of header.

    The loop reads plain regular members (and the one-record PAX headers before them)
    inline, with fields as tar writes them: that is nearly every member of a real shard.
    Everything else goes through :meth:`_other_header`, which picks the method for the
    header's kind: end of archive, PAX, global PAX, GNU long name or link, sparse,
    regular after extended headers, and the rest (directories, links, devices, unknown).
    """

    def __init__(self, stream: BinaryIO, url: str, chunk_size: int, start: int, limits: Limits):
        self.url = url
        self.limits = limits
        self.chunk_size = chunk_size
        self.start = start
        self.source = Source(stream, url, start)
        self.compression: str | None = None
        self.blocks = BlockReader(self.source.readinto, chunk_size, start,
                                   self.source.skip if self.source.seekable else None)
        self.seeked: tuple[str, int, int, int] | None = None  # (name, header offset, data offset, size)

    def members(self, skip_data: Callable[[str], bool] | None = None,
                with_offsets: bool = False) -> Iterator[tuple[str, bytes | int | None]]:
        """The members: (name, bytes); (name, None) for a member ``skip_data`` skips;
        (name, (offset of its first header block, offset of its bytes or None where they are
        not one run, size)) ``with_offsets``."""
        reader = self.blocks
        url = self.url
        limit = self.limits.max_member_bytes
        member = None  # the last member seen, for error messages
        offset = self.start
        pos = 0
        try:
            if self.start == 0:
                self._sniff()
                reader = self.blocks
            buf, view = reader.buf, reader.view
            entry_start: int | None = None  # offset of the extended headers before the next member
            pending: Pending | None = None  # what those headers said, where it matters
            verified_pax: dict[bytes, int] = {}
            last_pax: bytes | None = None  # the last verified PAX block, and its size
            last_pax_size = -1
            while True:
                if reader.end - pos < BLOCK:
                    self._fill_header(pos, member)
                    pos, buf, view = 0, reader.buf, reader.view
                offset = reader.base + pos
                flag = buf[pos + 156]
                if (
                    flag in REGULAR and pending is None
                    and buf[pos + 154] in ENDS and buf[pos + 135] in ENDS
                    and buf[pos + 148 : pos + 154].isdigit() and buf[pos + 124 : pos + 135].isdigit()
                    # adler32's low half is 1 + the byte sum mod 65521, exact below 65521 (above,
                    # this test fails and the slow path checks exactly). Chained over the block
                    # around the checksum field, it is tar's sum less the field's 8 spaces.
                    # ~7% of the raw rate (9.8x -> 10.5x webdataset) over header_ok.
                    and int(buf[pos + 148 : pos + 154], 8) == (
                        (zlib.adler32(view[pos + 156 : pos + BLOCK], zlib.adler32(view[pos : pos + 148])) & 0xFFFF)
                        + 8 * 32 - 1
                    )
                ):
                    # A plain regular member, fields as tar writes them ("%06o\0 ", "%011o\0").
                    # Its name field is read here as member_name reads it, a call less per member.
                    size = int(buf[pos + 124 : pos + 135], 8)
                    end = buf.find(0, pos, pos + 100)
                    name = buf[pos : pos + 100 if end < 0 else end].decode("utf-8", "surrogateescape")
                    if flag == 0 and name.endswith("/"):  # an old-style (v7) directory entry
                        pos += BLOCK
                        entry_start = None
                        continue
                    if buf[pos + 345]:  # a ustar prefix (rare): the one name rule
                        name = member_name(bytes(view[pos : pos + BLOCK]), flag)
                    member = name
                    start = pos + BLOCK
                    if skip_data is None or not skip_data(name):
                        if size > limit:
                            raise self._too_large(name, offset, size)
                        if reader.end - start < size:
                            self._fill_data(start, size, name, offset)
                            start, buf, view = 0, reader.buf, reader.view
                        yield name, bytes(view[start : start + size])
                    elif with_offsets:
                        self.seeked = (name, offset, reader.base + start, size)
                        yield name, (offset if entry_start is None else entry_start, reader.base + start, size)
                    else:  # its bytes are skipped: the next header's fill seeks or reads past them
                        self.seeked = (name, offset, reader.base + start, size)
                        yield name, None
                    entry_start = None
                    pos = start + ((size + BLOCK - 1) & ~(BLOCK - 1))
                    continue
                if flag in PAX and reader.end - pos >= 2 * BLOCK:
                    # Writers repeat the same few PAX header blocks (only the record length
                    # varies), and webdataset's puts one with just an mtime before every
                    # member: a verified block is not checked again, and such a record is
                    # not parsed (1.2x the raw rate on webdataset-written shards).
                    # The block seen last is compared in place first (most often the same).
                    if last_pax is not None and buf.startswith(last_pax, pos):
                        size = last_pax_size
                    else:
                        block = bytes(view[pos : pos + BLOCK])
                        size = verified_pax.get(block, -1)
                        if size < 0:
                            size = self._pax_size(view, pos, block, verified_pax)
                        if size >= 0:
                            last_pax, last_pax_size = block, size
                    start = pos + BLOCK
                    if (
                        0 < size <= BLOCK and buf[start + size - 1] == 10
                        and buf.startswith(PAX_LENGTHS[size], start)  # one record, its length exact
                        and not buf.startswith(MEMBER_KEY_STARTS, start + len(PAX_LENGTHS[size]))
                        and (size == BLOCK or not 48 <= buf[start + size] <= 57)  # no record in the padding
                    ):
                        entry_start = offset if entry_start is None else entry_start
                        pos += 2 * BLOCK
                        continue
                pos, pending, entry_start, item = self._other_header(
                    pos, flag, member, pending, entry_start, skip_data, with_offsets)
                buf, view = reader.buf, reader.view
                if item is None:
                    continue
                if item is END:
                    self._drain()
                    return
                member = item[0]
                yield item
        except WdsError:
            raise
        except Exception as exn:  # anything unforeseen still ends as our error, naming where
            raise shard_error(exn, url, member, offset) from exn

    # ------------------------------------------------------------ reading

    def _sniff(self) -> None:
        """Finds the shard's compression from its first bytes; reads it decompressed from then on."""
        reader = self.blocks
        reader.fill(0, BLOCK)
        kind = compression(bytes(reader.view[: min(reader.end, BLOCK)]))
        if kind is not None:
            head = bytes(reader.view[: reader.end])
            self.compression = kind
            self.blocks = BlockReader(Decompressed(kind, head, self.source, self.url).readinto, self.chunk_size)

    def _fill_header(self, pos: int, member: str | None) -> None:
        reader = self.blocks
        available = self._fill(pos, BLOCK, member, None)
        if available < BLOCK:
            self._check_seeked()
        if available == 0:
            # tarfile accepts this; we do not: a shard cut at a block boundary would
            # otherwise lose its remaining members without a word.
            raise ShardFormatError(self.url, member, reader.base,
                                   "truncated: the stream ends before tar's end-of-archive block")
        if available < BLOCK:
            raise ShardFormatError(self.url, member, reader.base, "truncated tar header")

    def _check_seeked(self) -> None:
        """Where the stream ends inside the bytes of a member that were seeked over (an index
        scan reads headers only), the error is that member's, as a read of its bytes gives it."""
        if self.seeked is None or self.compression:
            return
        name, offset, data, size = self.seeked
        end = self.source.size()
        if end is not None and end < data + size:
            raise ShardFormatError(self.url, name, offset,
                                   f"truncated: member needs {size} bytes, the stream ends after {max(end - data, 0)}")

    def _fill_data(self, pos: int, size: int, name: str, offset: int) -> None:
        available = self._fill(pos, size, name, offset)
        if available < size:
            raise ShardFormatError(self.url, name, offset,
                                   f"truncated: member needs {size} bytes, the stream ends after {available}")

    def _fill(self, pos: int, need: int, member: str | None, offset: int | None) -> int:
        """``reader.fill``, with a stream error restated for the tar member and offset being read."""
        reader = self.blocks
        try:
            return reader.fill(pos, need)
        except (ShardFormatError, ShardReadError) as exn:
            if exn.member is not None or exn.reason is None:
                raise
            at = reader.base + pos if offset is None else offset
            where = f" (compressed byte {exn.offset})" if self.compression else ""
            raise type(exn)(self.url, member, at, f"{exn.reason}{where}") from exn.__cause__

    def _drain(self) -> None:
        """After the end-of-archive block of a compressed shard, read on to the end of the stream
        (at most _DRAIN_LIMIT bytes), so the last gzip member's CRC and length are checked."""
        if self.compression is None:
            return
        reader = self.blocks
        drained = 0
        while drained < _DRAIN_LIMIT:
            n = reader.readinto(reader.view)
            if not n:
                return
            drained += n
        logger.debug("%s: more than %d bytes follow the end-of-archive block; not read", self.url, _DRAIN_LIMIT)

    def _too_large(self, name: str, offset: int, size: int) -> ShardFormatError:
        return ShardFormatError(self.url, name, offset, f"the member claims {size} bytes, more than the "
                                f"limit of {self.limits.max_member_bytes} (Limits.max_member_bytes)")

    def _pax_size(self, view: memoryview, pos: int, block: bytes, verified: dict[bytes, int]) -> int:
        """The size of the PAX header at ``pos`` once its checksum holds (cached), else -1."""
        try:
            if not header_ok(view, pos):
                return -1
            size = octal(block[124:136])
        except ValueError:
            return -1
        if len(verified) >= 16:
            verified.clear()
        verified[block] = size
        return size
