"""Tar bytes out: the header blocks, PAX records, padding and end blocks a shard writer writes.

Pure functions (no I/O), the inverses of :mod:`.headers` and :mod:`.extended`: the
checksum is :func:`.headers._header_sum`, the same code that checks it on the way in.
Headers are deterministic by default: mtime 0, uid and gid 0, no user or group names,
mode 0o444, so the same members give the same bytes on every machine. A name that does
not fit the ustar name field (100 bytes, or a 155-byte prefix split at a ``/``), a name
that is not ASCII, and a size of 8 GiB or more go into a PAX header before the member,
as POSIX and tarfile's PAX format write them. A name that is not UTF-8 (a ``str`` holding
a file name's bytes by ``surrogateescape``, as ``os.listdir`` gives them) keeps its bytes
in its PAX ``path`` record, as GNU tar writes it (tarfile and GNU tar read the same bytes back).
:func:`header_size` is what the shard planner counts: the size of these headers.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Iterable

from .headers import BLOCK, _header_sum

END = bytes(2 * BLOCK)  # the end-of-archive marker: two zero blocks
_MAX_OCTAL_SIZE = 8**11 - 1  # an 11-digit octal size field: below 8 GiB
_USTAR_MAGIC = b"ustar\x0000"


def padding(size: int) -> bytes:
    """The zero bytes after ``size`` bytes of member data, up to the next block."""
    return bytes(-size % BLOCK)


def _octal(value: int, width: int) -> bytes:
    """A number field: ``width - 1`` octal digits and a NUL."""
    return b"%0*o\0" % (width - 1, value)


def _ustar_name(name: bytes) -> tuple[bytes, bytes] | None:
    """(prefix, name) fields for ``name``, or None where it fits neither way."""
    if len(name) <= 100:
        return b"", name
    # the longest prefix (at most 155 bytes) ending at a '/': the shortest name after it
    cut = name.rfind(b"/", 0, 156)
    if cut > 0 and 0 < len(name) - cut - 1 <= 100:
        return name[:cut], name[cut + 1 :]
    return None


def pax_record(key: str, value: str) -> bytes:
    """One PAX record, ``"<length> <key>=<value>\\n"``, its length counting its own digits; a
    value's undecodable bytes (``surrogateescape``: a file name that is not UTF-8) as they were."""
    body = b" " + key.encode("utf-8") + b"=" + value.encode("utf-8", "surrogateescape") + b"\n"
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length = len(str(length)) + len(body)
    return str(length).encode() + body


def ustar_block(name: bytes, size: int, *, mtime: int = 0, mode: int = 0o444, flag: bytes = b"0",
                prefix: bytes = b"") -> bytes:
    """One 512-byte ustar header block with its checksum; ``name`` at most 100 bytes,
    ``prefix`` at most 155, ``size`` below 8 GiB."""
    block = bytearray(_template(mtime, mode, flag))
    block[0 : len(name)] = name
    block[124:136] = _octal(size, 12)
    if prefix:
        block[345 : 345 + len(prefix)] = prefix
    block[148:156] = b"%06o\0 " % _header_sum(memoryview(block), 0)
    return bytes(block)


@functools.lru_cache(maxsize=64)
def _template(mtime: int, mode: int, flag: bytes) -> bytes:
    """The fields every header of these settings shares (a writer uses one or two kinds)."""
    block = bytearray(BLOCK)
    block[100:108] = _octal(mode, 8)
    block[108:116] = _octal(0, 8)  # uid
    block[116:124] = _octal(0, 8)  # gid
    block[136:148] = _octal(mtime, 12)
    block[156:157] = flag
    block[257:265] = _USTAR_MAGIC
    block[329:337] = _octal(0, 8)  # devmajor
    block[337:345] = _octal(0, 8)  # devminor
    return bytes(block)


@functools.lru_cache(maxsize=64)
def _parts(mtime: int, mode: int) -> tuple[bytes, bytes, int, bytes]:
    """A plain member's header around its name, size and checksum fields: bytes 100-124,
    bytes 136-148, the checksum of the block with the name and size zero, bytes 156-512."""
    block = _template(mtime, mode, b"0")
    return block[100:124], block[136:148], _header_sum(memoryview(block), 0), block[156:]


def member_header(name: str, size: int, *, mtime: int = 0, mode: int = 0o444) -> bytes:
    """The header bytes of a regular file member: one ustar block, or a PAX header (its
    block, records and padding) and then the ustar block, where the name or size needs it.

    The member's ``size`` bytes of data follow, then :func:`padding`.
    """
    if size < 0 or mtime < 0:
        raise ValueError(f"a member's size and mtime must be >= 0 (got {size}, {mtime})")
    if _one_block(name, size, mtime) and "\0" not in name:  # the common case: one ustar block; its checksum
        # is the fixed fields' sum plus the name's and size's (adler32's low half: 1 + the byte sum, exact below 65521)
        encoded = name.encode("ascii")
        head, middle, base, tail = _parts(mtime, mode)
        digits = b"%011o\0" % size
        return b"".join((encoded.ljust(100, b"\0"), head, digits, middle,
                         b"%06o\0 " % (base + (zlib.adler32(digits, zlib.adler32(encoded)) & 0xFFFF) - 1), tail))
    encoded = name.encode("utf-8", "surrogateescape")  # a file name's undecodable bytes as they were
    if not name or b"\0" in encoded:
        raise ValueError(f"a member name must be non-empty without NUL bytes: {name!r}")
    split = _ustar_name(encoded) if encoded.isascii() else None
    records = b""
    if split is None:
        records += pax_record("path", name)
        split = (b"", _fallback_name(encoded))
    if size > _MAX_OCTAL_SIZE:
        records += pax_record("size", str(size))
    if mtime > _MAX_OCTAL_SIZE:
        records += pax_record("mtime", str(mtime))
    head = ustar_block(split[1], size if size <= _MAX_OCTAL_SIZE else 0,
                       mtime=min(mtime, _MAX_OCTAL_SIZE), mode=mode, prefix=split[0])
    if not records:
        return head
    pax_name = b"PaxHeader/" + split[1][:90]
    return ustar_block(pax_name, len(records), mtime=min(mtime, _MAX_OCTAL_SIZE), mode=mode, flag=b"x") + \
        records + padding(len(records)) + head


def _one_block(name: str, size: int, mtime: int) -> bool:
    """Whether a member named ``name`` gets one ustar block and no PAX header (given no NUL in
    it): an ASCII name of 1-100 bytes, a size and an mtime that fit their octal fields."""
    return name.isascii() and 0 < len(name) <= 100 and size <= _MAX_OCTAL_SIZE and mtime <= _MAX_OCTAL_SIZE


def header_size(name: str, size: int, *, mtime: int = 0) -> int:
    """How many bytes :func:`member_header` writes before a member's data: 512, or more where
    the name, size or mtime need a PAX header (the shard planner's count of them: the same code).

    Raises :class:`ValueError` for a name :func:`member_header` refuses (empty, a NUL) and
    :class:`UnicodeEncodeError` for one it cannot encode.
    """
    if _one_block(name, size, mtime) and "\0" not in name:
        return BLOCK
    return len(member_header(name, size, mtime=mtime))


def _fallback_name(encoded: bytes) -> bytes:
    """The ustar name field under a PAX path: its last 100 bytes' ASCII, for readers without PAX."""
    tail = encoded[-100:].decode("ascii", "replace").encode("ascii", "replace")
    return tail.replace(b"?", b"_")[-100:]


def member_bytes(name: str, data: bytes, *, mtime: int = 0, mode: int = 0o444) -> bytes:
    """A whole member: its header, ``data`` and the padding."""
    return member_header(name, len(data), mtime=mtime, mode=mode) + data + padding(len(data))


def build_tar(members: Iterable[tuple[str, bytes]], *, mtime: int = 0, mode: int = 0o444) -> bytes:
    """A whole archive of regular files from (name, bytes) pairs, with its end blocks."""
    return b"".join(member_bytes(name, data, mtime=mtime, mode=mode) for name, data in members) + END


__all__ = ["END", "build_tar", "header_size", "member_bytes", "member_header", "padding", "pax_record", "ustar_block"]
