"""A sequential tar reader: (member name, bytes) for each regular file of a tar stream, plain or compressed.

It never seeks backwards, so pipes and HTTP bodies work. It fills one reusable buffer
with ``readinto`` and parses headers in place, copying each member's bytes once: several
times faster than ``tarfile`` (see benchmarks/bench_pipeline.py). Its members are those
``tarfile`` (and so webdataset) reads, with the same names and bytes: ustar and v7
headers, the ustar name prefix, GNU long names, PAX records, GNU sparse members (old GNU,
PAX 0.0, 0.1 and 1.0), and gzip, bzip2, xz and zstd streams (found by their first bytes).
Where the two differ on a damaged archive, this reader stops with an error where tarfile
yields less or other data; the README lists each difference.

Nothing it reads allocates more than the bytes that arrived (a size field can claim
anything), and members are bounded by :class:`~wds_datapipes.limits.Limits`. Every
failure, whatever raised it, ends as a :class:`ShardFormatError` or
:class:`ShardReadError` naming the shard, the member and the byte offset.
"""

from __future__ import annotations

import bz2
import gzip
import logging
import lzma
import re
import zlib
from collections.abc import Callable, Iterator
from typing import BinaryIO

from .errors import ShardFormatError, ShardOpenError, ShardReadError, WdsError, shard_error
from .limits import Limits, get_limits

try:
    import zstandard
except ImportError:  # the [zstd] extra is optional: .tar.zst shards then raise a clear error
    zstandard = None

logger = logging.getLogger("wds_datapipes")

BLOCK = 512
CHUNK = 1 << 20
_ZERO_BLOCK = bytes(BLOCK)
_ENDS = frozenset(b"\0 ")  # what ends a number field

# Typeflags, as tarfile reads them.
_REGULAR = frozenset(b"07\0")  # REGTYPE, CONTTYPE, AREGTYPE
_NO_DATA = frozenset(b"123456")  # links, devices, directories, fifos: their size field is ignored
_PAX = frozenset(b"xX")  # a PAX extended header ('X': Solaris' name for it, which tarfile reads too)
_PAX_GLOBAL, _LONG_NAME, _LONG_LINK, _OLD_SPARSE = b"g"[0], b"L"[0], b"K"[0], b"S"[0]
_GNU_TYPES = frozenset(b"LKS")  # headers whose bytes 345-500 are not a ustar name prefix
# PAX keys that change which bytes or which name a member gets; any other record is ignored.
_MEMBER_KEYS = ("path", "size", "GNU.sparse.")
_MEMBER_KEY_STARTS = tuple(key.encode() for key in _MEMBER_KEYS)
_PAX_RECORD = re.compile(rb"(\d+) ([^=]+)=")  # tarfile's rule: "<length> <key>=<value>\n"
# "<n> ": how a PAX header of n bytes holding one record begins (webdataset's: an mtime).
_PAX_LENGTHS = [b"%d " % n for n in range(BLOCK + 1)]
# After the end-of-archive block of a compressed shard, read this much more at most, so
# that the checksum trailer of its last gzip member (or xz/zstd frame) is checked.
_DRAIN_LIMIT = 16 << 20

_MAGICS = (
    ("gzip", b"\x1f\x8b"),
    ("bzip2", b"BZh"),
    ("xz", b"\xfd7zXZ\x00"),
    ("zstd", b"\x28\xb5\x2f\xfd"),
)

ReadInto = Callable[[memoryview], int]


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
    return _TarWalk(stream, url, chunk_size, start, limits or get_limits()).members(skip_data)


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
    walk = _TarWalk(stream, url, chunk_size, 0, limits or get_limits())
    for name, (entry, data, size) in walk.members(_ALWAYS, with_offsets=True):
        if walk.compression:
            yield name, None, None, size
        else:
            yield name, entry, data, size


def _ALWAYS(name: str) -> bool:
    return True


# ---------------------------------------------------------------- the stream below the tar


class _Source:
    """The shard's own stream: ``readinto``/``read`` with any failure restated as ours, and a byte count."""

    def __init__(self, stream: BinaryIO, url: str, pos: int):
        self.stream = stream
        self.url = url
        self.pos = pos  # bytes of the stream passed so far (from the tar's start for a plain tar)
        self._readinto = getattr(stream, "readinto", None) or self._readinto_by_read
        try:
            self.seekable = bool(stream.seekable())
        except Exception:  # noqa: BLE001 - any stream without a working seekable() reads on
            self.seekable = False

    def readinto(self, target: memoryview) -> int:
        try:
            n = self._readinto(target) or 0
        except WdsError:
            raise
        except Exception as exn:
            raise shard_error(exn, self.url, None, self.pos) from exn
        self.pos += n
        return n

    def read(self, size: int = -1) -> bytes:
        try:
            data = self.stream.read(size)
        except WdsError:
            raise
        except Exception as exn:
            raise shard_error(exn, self.url, None, self.pos) from exn
        self.pos += len(data)
        return data

    def skip(self, count: int) -> None:
        """Moves ``count`` bytes on: a seek where the stream can (nothing is read)."""
        try:
            self.stream.seek(count, 1)
        except Exception as exn:
            raise shard_error(exn, self.url, None, self.pos) from exn
        self.pos += count

    def _readinto_by_read(self, target: memoryview) -> int:
        data = self.stream.read(len(target))
        target[: len(data)] = data
        return len(data)


class _Prefixed:
    """``read`` over ``head`` (bytes already taken from ``source``) and then the rest of ``source``."""

    def __init__(self, head: bytes, source: _Source):
        self._head = head
        self._source = source

    def read(self, size: int = -1) -> bytes:
        if self._head:
            if size < 0 or size >= len(self._head):
                data, self._head = self._head, b""
                return data
            data, self._head = self._head[:size], self._head[size:]
            return data
        return self._source.read(size)

    def readable(self) -> bool:
        return True


class _Decompressed:
    """``readinto`` over the decompressed bytes of a gzip/bzip2/xz/zstd stream, in bounded reads.

    The stdlib's readers check each gzip member's CRC and length trailer (and bzip2's and
    xz's checks); zstandard checks a frame's checksum where the writer stored one.
    """

    def __init__(self, kind: str, head: bytes, source: _Source, url: str):
        self.kind = kind
        self.url = url
        self._source = source
        raw = _Prefixed(head, source)
        if kind == "gzip":
            self._stream = gzip.GzipFile(fileobj=raw, mode="rb")
        elif kind == "bzip2":
            self._stream = bz2.BZ2File(raw)
        elif kind == "xz":
            self._stream = lzma.LZMAFile(raw)  # noqa: SIM115 - it lives as long as the walk
        else:
            if zstandard is None:
                raise ShardOpenError(url, "it is zstd-compressed, and reading .tar.zst needs the zstandard "
                                          "package: pip install zstandard (or wds-datapipes[zstd])")
            self._stream = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)

    def readinto(self, target: memoryview) -> int:
        try:
            return self._stream.readinto1(target)  # one read below: errors surface where they occur
        except WdsError:
            raise
        except Exception as exn:
            # EOFError: the compressed stream ends early; others: it is corrupt (bad CRC, ...).
            raise shard_error(exn, self.url, None, self._source.pos, as_format=f"{self.kind} stream") from exn


def _compression(head: bytes | bytearray) -> str | None:
    """The compression whose magic bytes ``head`` starts with; None for a plain tar.

    A valid tar header is a plain tar whatever its first bytes (a member may be named "BZh9...").
    """
    try:
        if len(head) >= BLOCK and _header_ok(memoryview(head), 0):
            return None
    except ValueError:  # a checksum field that is no number: not a tar header
        pass
    for kind, magic in _MAGICS:
        if head.startswith(magic):
            return kind
    return None


class _BlockReader:
    """A buffer filled from ``readinto``; ``fill`` keeps [pos, end) and appends.

    It grows only when full of bytes that arrived (a member that claims 8 GiB and brings
    1 KiB costs 1 KiB), and shrinks back to its usual size after a large member.
    """

    def __init__(self, readinto: ReadInto, size: int, base: int = 0, skip: Callable[[int], None] | None = None):
        self.readinto = readinto
        self.skip = skip  # seeks over bytes, where the stream can: skipping then reads nothing
        self.size = size
        self.buf = bytearray(size)
        self.view = memoryview(self.buf)
        self.end = 0  # bytes of buf that hold data
        self.base = base  # offset of buf[0] in the tar

    def fill(self, pos: int, need: int) -> int:
        """Moves buf[pos:end] to the front and reads until ``need`` bytes are there (or EOF).

        ``pos`` may lie past ``end`` (padding or a member not read yet): that much is
        skipped. Returns how many bytes from the (new) position 0 are available.
        """
        keep = self.end - pos
        if keep < 0:
            self._skip(-keep)
            keep = 0
        elif keep and pos:
            self.view[:keep] = self.view[pos : self.end]
        self.base += pos
        self.end = keep
        if len(self.buf) > self.size and need <= self.size and keep <= self.size:
            self._resize(self.size)  # back to the usual size after a large member
        while self.end < need:
            if self.end == len(self.buf):
                self._resize(min(need, 2 * len(self.buf)))  # at most twice what arrived
            n = self.readinto(self.view[self.end :])
            if not n:
                break
            self.end += n
        return self.end

    def _resize(self, size: int) -> None:
        buf = bytearray(size)
        buf[: self.end] = self.view[: self.end]
        self.buf, self.view = buf, memoryview(buf)

    def _skip(self, count: int) -> None:
        """Reads and drops ``count`` bytes (fewer at the end of the stream), or seeks over them."""
        if self.skip is not None:
            self.skip(count)
            return
        while count > 0:
            n = self.readinto(self.view[: min(count, len(self.buf))])
            if not n:
                return
            count -= n


# ---------------------------------------------------------------- header fields


def _octal(field: bytes | bytearray | memoryview) -> int:
    """A number field as tar writes it: octal digits (empty: 0), or GNU base-256 for large sizes."""
    field = bytes(field)
    if field[0] & 0x80:  # GNU base-256, for sizes of 8 GiB and more
        if field[0] != 0x80:
            raise ValueError("negative or malformed base-256 number")
        return int.from_bytes(field[1:], "big")
    digits = field.split(b"\0", 1)[0].strip(b" ")
    if not digits:
        return 0
    if digits.isdigit() and b"8" not in digits and b"9" not in digits:
        return int(digits, 8)
    raise ValueError(f"bad number field {field!r}")


def _header_sum(view: memoryview, pos: int) -> int:
    """The header checksum as tar defines it: the block's byte sum, its checksum field as spaces."""
    # adler32's low half is 1 + the byte sum mod 65521, exact for up to 256 bytes (<= 65280):
    # three C calls around the checksum field beat any Python loop over the block (~10 us).
    return (
        (zlib.adler32(view[pos : pos + 148]) & 0xFFFF)
        + (zlib.adler32(view[pos + 156 : pos + 412]) & 0xFFFF)
        + (zlib.adler32(view[pos + 412 : pos + 512]) & 0xFFFF)
        + (8 * 32 - 3)
    )


def _header_ok(view: memoryview, pos: int) -> bool:
    """Whether the block at ``pos`` has a valid checksum (unsigned, or the signed sum some old
    writers used); ValueError for a checksum field that is not a number."""
    stored = _octal(view[pos + 148 : pos + 156])
    total = _header_sum(view, pos)
    if stored == total:
        return True
    block = bytes(view[pos : pos + BLOCK])
    field = block[148:156]
    return stored == total - 256 * sum(b > 127 for b in block) + 256 * sum(b > 127 for b in field)


def _nts(data: bytes | bytearray | memoryview) -> str:
    """A NUL-terminated text field, as tarfile decodes it."""
    data = bytes(data)
    end = data.find(0)
    return (data if end < 0 else data[:end]).decode("utf-8", "surrogateescape")


def _member_name(block: bytes, flag: int) -> str:
    """The name a header gives its member: the name field, after the ustar prefix where there is one.

    As tarfile: the prefix (bytes 345-500) counts whatever the magic says, except in GNU
    long-name, long-link and sparse headers, which use those bytes for other things.
    """
    name = _nts(block[:100])
    if block[345] and flag not in _GNU_TYPES:
        return _nts(block[345:500]) + "/" + name
    return name


class _Header:
    """One header block that is not a plain regular file's: its fields, checked."""

    __slots__ = ("block", "flag", "offset", "size")

    def __init__(self, view: memoryview, pos: int, offset: int):
        self.block = bytes(view[pos : pos + BLOCK])
        self.offset = offset
        self.flag = self.block[156]
        if not _header_ok(view, pos):
            raise ValueError("header checksum mismatch")
        self.size = _octal(self.block[124:136])

    @property
    def name(self) -> str:
        return _member_name(self.block, self.flag)


# ---------------------------------------------------------------- extended headers


class _Pending:
    """What extended headers (PAX, GNU long name) said about the member that follows them.

    As in tarfile, the first header that sets a value wins: tarfile applies the outermost
    extended header last.
    """

    __slots__ = ("name", "sparse", "stored")

    def __init__(self):
        self.name: str | None = None
        self.stored: int | None = None  # a PAX "size": the member's bytes in the archive
        self.sparse: _SparseMap | None = None

    def add_pax(self, records: list[tuple[str, str]], url: str, member: str | None, offset: int) -> None:
        values: dict[str, str] = {}
        name = None
        for key, value in records:  # tarfile keeps the last of repeated keys, in first-seen order
            values[key] = value
        for key, value in values.items():
            if key == "path":
                name = value.rstrip("/")
            elif key == "GNU.sparse.name":
                name = value
        if self.name is None and name is not None:
            self.name = name
        sparse = _SparseMap.from_pax(values, records, url, member, offset)
        if sparse is None and "GNU.sparse.realsize" in values:
            raise ShardFormatError(url, member, offset, "a GNU sparse size without a sparse map")
        if "size" in values:
            if sparse is not None:
                raise ShardFormatError(url, member, offset, "a PAX header gives both a size and a GNU sparse size")
            if self.stored is None:
                try:
                    self.stored = int(values["size"])
                except ValueError:
                    raise ShardFormatError(url, member, offset, f"bad PAX size {values['size']!r}") from None
                if self.stored < 0:
                    raise ShardFormatError(url, member, offset, f"negative PAX size {self.stored}")
        if sparse is not None:
            if self.sparse is not None:
                raise ShardFormatError(url, member, offset, "two PAX headers describe one sparse member")
            self.sparse = sparse


def _pax_records(data: bytes, url: str, member: str | None, offset: int) -> list[tuple[str, str]]:
    """The (key, value) records of a PAX header's data, read by tarfile's rules."""
    records = []
    pos = 0
    while True:
        match = _PAX_RECORD.match(data, pos)
        if not match:
            return records
        try:
            length = int(match.group(1))
        except ValueError:  # thousands of digits
            raise ShardFormatError(url, member, offset, "corrupt PAX header (a record length too long)") from None
        if length == 0:
            raise ShardFormatError(url, member, offset, "corrupt PAX header (a record of length 0)")
        value = data[match.end(2) + 1 : match.start(1) + length - 1]
        records.append((match.group(2).decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")))
        pos += length


# ---------------------------------------------------------------- GNU sparse members


class _SparseMap:
    """Where a sparse member's stored pieces go: (offset, length) pairs and the full size.

    ``in_data``: the map is at the start of the member's data (PAX 1.0), still to be read.
    """

    __slots__ = ("in_data", "pieces", "real_size", "version")

    def __init__(self, version: str, pieces: list[tuple[int, int]], real_size: int, in_data: bool = False):
        self.version = version
        self.pieces = pieces
        self.real_size = real_size
        self.in_data = in_data

    @classmethod
    def from_pax(cls, values: dict[str, str], records: list[tuple[str, str]], url: str,
                 member: str | None, offset: int) -> _SparseMap | None:
        """The map of PAX sparse formats 0.0, 0.1 or 1.0 (tested in tarfile's order), or None."""
        try:
            if "GNU.sparse.map" in values:  # 0.1: "offset,length,offset,length..."
                numbers = [int(x) for x in values["GNU.sparse.map"].split(",")]
                return cls("PAX 0.1", _pairs(numbers), int(values["GNU.sparse.size"]))
            if "GNU.sparse.size" in values:  # 0.0: repeated offset and numbytes records
                offsets = [int(v) for k, v in records if k == "GNU.sparse.offset"]
                lengths = [int(v) for k, v in records if k == "GNU.sparse.numbytes"]
                if len(offsets) != len(lengths):
                    raise ValueError("as many offsets as lengths are needed")
                return cls("PAX 0.0", list(zip(offsets, lengths)), int(values["GNU.sparse.size"]))
            if values.get("GNU.sparse.major") == "1" and values.get("GNU.sparse.minor") == "0":
                return cls("PAX 1.0", [], int(values["GNU.sparse.realsize"]), in_data=True)
        except (KeyError, ValueError) as exn:
            raise ShardFormatError(url, member, offset, f"corrupt GNU sparse header ({type(exn).__name__}: "
                                                        f"{exn})") from None
        return None

    def expand(self, data: memoryview, url: str, name: str, offset: int) -> bytes:
        """The member's full bytes: its stored ``data`` at the map's places, zeros in the holes."""
        pieces = [(o, n) for o, n in self.pieces if n]  # tarfile skips empty pieces too
        total, end = 0, 0
        for piece_offset, length in pieces:
            if piece_offset < end or length < 0 or piece_offset + length > self.real_size:
                raise ShardFormatError(url, name, offset, f"{self.version} sparse map out of order or past "
                                                          f"the member's size {self.real_size}: {self.pieces[:8]}")
            end = piece_offset + length
            total += length
        if total > len(data):
            raise ShardFormatError(url, name, offset, f"{self.version} sparse map places {total} bytes, the "
                                                      f"member stores {len(data)}")
        out = bytearray(self.real_size)
        at = 0
        for piece_offset, length in pieces:
            out[piece_offset : piece_offset + length] = data[at : at + length]
            at += length
        return bytes(out)


def _pairs(numbers: list[int]) -> list[tuple[int, int]]:
    if len(numbers) % 2:
        raise ValueError(f"an odd count of sparse map numbers ({len(numbers)})")
    return list(zip(numbers[::2], numbers[1::2]))


# ---------------------------------------------------------------- the walk over headers


class _TarWalk:
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
        self.source = _Source(stream, url, start)
        self.compression: str | None = None
        self.blocks = _BlockReader(self.source.readinto, chunk_size, start,
                                   self.source.skip if self.source.seekable else None)

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
            pending: _Pending | None = None  # what those headers said, where it matters
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
                    flag in _REGULAR and pending is None
                    and buf[pos + 154] in _ENDS and buf[pos + 135] in _ENDS
                    and buf[pos + 148 : pos + 154].isdigit() and buf[pos + 124 : pos + 135].isdigit()
                    # adler32's low half is 1 + the byte sum mod 65521, exact below 65521 (above,
                    # this test fails and the slow path checks exactly). Chained over the block
                    # around the checksum field, it is tar's sum less the field's 8 spaces.
                    # ~7% of the raw rate (9.8x -> 10.5x webdataset) over _header_ok.
                    and int(buf[pos + 148 : pos + 154], 8) == (
                        (zlib.adler32(view[pos + 156 : pos + BLOCK], zlib.adler32(view[pos : pos + 148])) & 0xFFFF)
                        + 8 * 32 - 1
                    )
                ):
                    # A plain regular member, fields as tar writes them ("%06o\0 ", "%011o\0").
                    # Its name field is read here as _member_name reads it, a call less per member.
                    size = int(buf[pos + 124 : pos + 135], 8)
                    end = buf.find(0, pos, pos + 100)
                    name = buf[pos : pos + 100 if end < 0 else end].decode("utf-8", "surrogateescape")
                    if flag == 0 and name.endswith("/"):  # an old-style (v7) directory entry
                        pos += BLOCK
                        entry_start = None
                        continue
                    if buf[pos + 345]:  # a ustar prefix (rare): the one name rule
                        name = _member_name(bytes(view[pos : pos + BLOCK]), flag)
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
                        yield name, (offset if entry_start is None else entry_start, reader.base + start, size)
                    else:  # its bytes are skipped: the next header's fill seeks or reads past them
                        yield name, None
                    entry_start = None
                    pos = start + ((size + BLOCK - 1) & ~(BLOCK - 1))
                    continue
                if flag in _PAX and reader.end - pos >= 2 * BLOCK:
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
                        and buf.startswith(_PAX_LENGTHS[size], start)  # one record, its length exact
                        and not buf.startswith(_MEMBER_KEY_STARTS, start + len(_PAX_LENGTHS[size]))
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
                if item is _END:
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
        kind = _compression(bytes(reader.view[: min(reader.end, BLOCK)]))
        if kind is not None:
            head = bytes(reader.view[: reader.end])
            self.compression = kind
            self.blocks = _BlockReader(_Decompressed(kind, head, self.source, self.url).readinto, self.chunk_size)

    def _fill_header(self, pos: int, member: str | None) -> None:
        reader = self.blocks
        available = self._fill(pos, BLOCK, member, None)
        if available == 0:
            # tarfile accepts this; we do not: a shard cut at a block boundary would
            # otherwise lose its remaining members without a word.
            raise ShardFormatError(self.url, member, reader.base,
                                   "truncated: the stream ends before tar's end-of-archive block")
        if available < BLOCK:
            raise ShardFormatError(self.url, member, reader.base, "truncated tar header")

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
            if not _header_ok(view, pos):
                return -1
            size = _octal(block[124:136])
        except ValueError:
            return -1
        if len(verified) >= 16:
            verified.clear()
        verified[block] = size
        return size

    def _header_data(self, pos: int, header: _Header, member: str | None) -> tuple[int, bytes]:
        """(next position, data) of the extended header at ``pos``: its data and the padding after
        it, as tarfile reads them (a record or name may run into the padding), within
        Limits.max_header_bytes."""
        if header.size > self.limits.max_header_bytes:
            raise ShardFormatError(self.url, member, header.offset, f"an extended header of {header.size} bytes, "
                                   f"more than the limit of {self.limits.max_header_bytes} (Limits.max_header_bytes)")
        reader = self.blocks
        start, padded = pos + BLOCK, _next(0, header.size)
        if reader.end - start < padded:
            available = self._fill(start, padded, member or header.name, header.offset)
            start = 0
            if available < header.size:
                raise ShardFormatError(self.url, member or header.name, header.offset, f"truncated: member needs "
                                       f"{header.size} bytes, the stream ends after {available}")
        return start + padded, bytes(reader.view[start : min(start + padded, reader.end)])

    def _data(self, pos: int, size: int, name: str, offset: int) -> tuple[int, memoryview]:
        """(position, view) of the ``size`` bytes at ``pos`` (a member's data), read into the buffer."""
        if self.blocks.end - pos < size:
            self._fill_data(pos, size, name, offset)
            pos = 0
        return pos, self.blocks.view

    # ------------------------------------------------------------ header kinds

    def _other_header(self, pos: int, flag: int, member: str | None, pending: _Pending | None,
                      entry_start: int | None, skip_data: Callable[[str], bool] | None, with_offsets: bool):
        """Reads the header at ``pos`` that the loop does not read inline, by its kind.

        Returns (next position, pending extended-header state, entry start, item): the item
        is a member to yield, None, or _END at the end of the archive.
        """
        reader = self.blocks
        view = reader.view
        offset = reader.base + pos
        if reader.buf[pos] == 0 and view[pos : pos + BLOCK] == _ZERO_BLOCK:
            if pending is not None or entry_start is not None:
                raise ShardFormatError(self.url, member, offset, "extended headers without the member they "
                                                                 "describe before the end-of-archive block")
            return pos, None, None, _END
        try:
            header = _Header(view, pos, offset)
        except ValueError as exn:
            raise ShardFormatError(self.url, member, offset, f"corrupt tar header ({exn})") from None
        if header.flag in _PAX:
            return self._pax(pos, header, member, pending, entry_start)
        if header.flag == _LONG_NAME or header.flag == _LONG_LINK:
            return self._gnu_long(pos, header, member, pending, entry_start)
        if header.flag == _PAX_GLOBAL:
            return self._pax_global(pos, header, member, pending, entry_start)
        if header.flag in _REGULAR or header.flag == _OLD_SPARSE:
            if header.flag == 0 and _nts(header.block[:100]).endswith("/"):  # a v7 directory (tarfile's rule)
                return pos + BLOCK, None, None, None
            return self._regular(pos, header, pending, entry_start, skip_data, with_offsets)
        return self._not_a_file(pos, header, pending)

    def _pax(self, pos, header: _Header, member, pending, entry_start):
        """A PAX extended header: its records about the next member (path, size, sparse map)."""
        after, data = self._header_data(pos, header, member)
        records = _pax_records(data, self.url, member, header.offset)
        if any(key.startswith(_MEMBER_KEYS) for key, _ in records):
            pending = pending or _Pending()
            pending.add_pax(records, self.url, member, header.offset)
        return after, pending, header.offset if entry_start is None else entry_start, None

    def _pax_global(self, pos, header: _Header, member, pending, entry_start):
        """A global PAX header: records for every later member. Ours may not change names or sizes."""
        after, data = self._header_data(pos, header, member)
        changing = sorted({key for key, _ in _pax_records(data, self.url, member, header.offset)
                           if key.startswith(_MEMBER_KEYS)})
        if changing:
            raise ShardFormatError(self.url, member, header.offset, f"a global PAX header sets {changing} for "
                                   "every later member; such archives are not supported")
        return after, pending, entry_start, None

    def _gnu_long(self, pos, header: _Header, member, pending, entry_start):
        """A GNU long name ('L': the next member's name) or long link name ('K': not needed here)."""
        after, data = self._header_data(pos, header, member)
        if header.flag == _LONG_LINK:
            return after, pending, entry_start, None
        pending = pending or _Pending()
        if pending.name is None:
            pending.name = _nts(data)  # up to the first NUL, padding included, as tarfile
        return after, pending, header.offset if entry_start is None else entry_start, None

    def _not_a_file(self, pos, header: _Header, pending):
        """A directory, link, device or fifo (no data), or an unknown kind (its data skipped)."""
        if pending is not None and pending.sparse is not None:
            raise ShardFormatError(self.url, header.name, header.offset, "a GNU sparse map before a member that "
                                                                         "is not a file")
        size = 0 if header.flag in _NO_DATA else (pending.stored if pending and pending.stored is not None
                                                  else header.size)
        return _next(pos + BLOCK, size), None, None, None

    def _regular(self, pos, header: _Header, pending, entry_start, skip_data, with_offsets):
        """A regular member after extended headers, with an unusual header, or sparse."""
        name = header.name
        size = header.size
        sparse = None
        if pending is not None:
            name = pending.name if pending.name is not None else name
            size = pending.stored if pending.stored is not None else size
            sparse = pending.sparse
        data_start = pos + BLOCK
        if header.flag == _OLD_SPARSE:
            if sparse is not None or (pending is not None and pending.stored is not None):
                raise ShardFormatError(self.url, name, header.offset, "an old GNU sparse member with a PAX sparse map")
            sparse, data_start = self._old_sparse_map(pos, header, name)
        first = header.offset if entry_start is None else entry_start
        if skip_data is not None and skip_data(name):
            place = (first, None if sparse is not None else self.blocks.base + data_start, size)
            return _next(data_start, size), None, None, (name, place if with_offsets else None)
        real = sparse.real_size if sparse is not None else size
        if max(size, real) > self.limits.max_member_bytes:
            raise self._too_large(name, header.offset, max(size, real))
        start, view = self._data(data_start, size, name, header.offset)
        stored = view[start : start + size]
        if sparse is None:
            data = bytes(stored)
        else:
            if sparse.in_data:
                sparse, stored = self._map_in_data(sparse, stored, name, header.offset)
            data = sparse.expand(stored, self.url, name, header.offset)
        return _next(start, size), None, None, (name, data)

    def _old_sparse_map(self, pos: int, header: _Header, name: str) -> tuple[_SparseMap, int]:
        """The map of an old GNU sparse header ('S'), and where its data starts (after the
        extension blocks that continue the map)."""
        block = header.block
        try:
            pieces = [(_octal(block[p : p + 12]), _octal(block[p + 12 : p + 24])) for p in range(386, 482, 24)]
            real_size = _octal(block[483:495])
            extended = block[482]
            at = pos + BLOCK
            blocks = 0
            while extended:
                blocks += 1
                if blocks * BLOCK > self.limits.max_header_bytes:
                    raise ValueError(f"more than {blocks - 1} extension blocks (Limits.max_header_bytes)")
                at, view = self._data(at, BLOCK, name, header.offset)
                more = bytes(view[at : at + BLOCK])
                for p in range(0, 504, 24):
                    piece = (_octal(more[p : p + 12]), _octal(more[p + 12 : p + 24]))
                    if piece[0] and piece[1]:  # tarfile keeps only these from extension blocks
                        pieces.append(piece)
                extended = more[504]
                at += BLOCK
        except ValueError as exn:
            raise ShardFormatError(self.url, name, header.offset, f"corrupt old GNU sparse header ({exn})") from None
        return _SparseMap("old GNU", pieces, real_size), at

    def _map_in_data(self, sparse: _SparseMap, stored: memoryview, name: str,
                     offset: int) -> tuple[_SparseMap, memoryview]:
        """PAX 1.0: the map at the start of the data (decimal numbers, one a line, the count
        first, padded to a block), and the data after it."""
        data = bytes(stored[: min(len(stored), self.limits.max_header_bytes)])
        numbers: list[int] = []
        pos = 0
        try:
            while not numbers or len(numbers) < 2 * numbers[0] + 1:
                newline = data.index(b"\n", pos)
                numbers.append(int(data[pos:newline]))
                pos = newline + 1
        except ValueError as exn:
            raise ShardFormatError(self.url, name, offset, f"corrupt PAX 1.0 sparse map ({exn})") from None
        map_bytes = (pos + BLOCK - 1) & ~(BLOCK - 1)
        return _SparseMap(sparse.version, _pairs(numbers[1:]), sparse.real_size), stored[map_bytes:]


_END = ("", None)  # the end of the archive, as an item of _other_header


def _next(start: int, size: int) -> int:
    """Where the header after ``size`` bytes of data starting at ``start`` begins."""
    return start + ((size + BLOCK - 1) & ~(BLOCK - 1))
