"""Tar header blocks: the typeflags, number fields, checksums and names, as tarfile reads them."""

from __future__ import annotations

import zlib

BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)
ENDS = frozenset(b"\0 ")  # what ends a number field

# Typeflags, as tarfile reads them.
REGULAR = frozenset(b"07\0")  # REGTYPE, CONTTYPE, AREGTYPE
NO_DATA = frozenset(b"123456")  # links, devices, directories, fifos: their size field is ignored
PAX = frozenset(b"xX")  # a PAX extended header ('X': Solaris' name for it, which tarfile reads too)
PAX_GLOBAL, LONG_NAME, LONG_LINK, OLD_SPARSE = b"g"[0], b"L"[0], b"K"[0], b"S"[0]
GNU_TYPES = frozenset(b"LKS")  # headers whose bytes 345-500 are not a ustar name prefix
# "<n> ": how a PAX header of n bytes holding one record begins (webdataset's: an mtime).
PAX_LENGTHS = [b"%d " % n for n in range(BLOCK + 1)]


def octal(field: bytes | bytearray | memoryview) -> int:
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


def header_ok(view: memoryview, pos: int) -> bool:
    """Whether the block at ``pos`` has a valid checksum (unsigned, or the signed sum some old
    writers used); ValueError for a checksum field that is not a number."""
    stored = octal(view[pos + 148 : pos + 156])
    total = _header_sum(view, pos)
    if stored == total:
        return True
    block = bytes(view[pos : pos + BLOCK])
    field = block[148:156]
    return stored == total - 256 * sum(b > 127 for b in block) + 256 * sum(b > 127 for b in field)


def nts(data: bytes | bytearray | memoryview) -> str:
    """A NUL-terminated text field, as tarfile decodes it."""
    data = bytes(data)
    end = data.find(0)
    return (data if end < 0 else data[:end]).decode("utf-8", "surrogateescape")


def member_name(block: bytes, flag: int) -> str:
    """The name a header gives its member: the name field, after the ustar prefix where there is one.

    As tarfile: the prefix (bytes 345-500) counts whatever the magic says, except in GNU
    long-name, long-link and sparse headers, which use those bytes for other things.
    """
    name = nts(block[:100])
    if block[345] and flag not in GNU_TYPES:
        return nts(block[345:500]) + "/" + name
    return name


class Header:
    """One header block that is not a plain regular file's: its fields, checked."""

    __slots__ = ("block", "flag", "offset", "size")

    def __init__(self, view: memoryview, pos: int, offset: int):
        self.block = bytes(view[pos : pos + BLOCK])
        self.offset = offset
        self.flag = self.block[156]
        if not header_ok(view, pos):
            raise ValueError("header checksum mismatch")
        self.size = octal(self.block[124:136])

    @property
    def name(self) -> str:
        return member_name(self.block, self.flag)


def next_header(start: int, size: int) -> int:
    """Where the header after ``size`` bytes of data starting at ``start`` begins."""
    return start + ((size + BLOCK - 1) & ~(BLOCK - 1))
