"""Extended headers: PAX records and GNU sparse maps, and what they say about the next member.

PAX headers may rename the member that follows them, give its size, or describe it as
sparse (GNU's PAX formats 0.0, 0.1 and 1.0); old GNU sparse headers carry their map in
the header itself (read in :mod:`.header_kinds`). Records are read by tarfile's rules.
"""

from __future__ import annotations

import re

from ..errors import ShardFormatError

# PAX keys that change which bytes or which name a member gets; any other record is ignored.
MEMBER_KEYS = ("path", "size", "GNU.sparse.")
MEMBER_KEY_STARTS = tuple(key.encode() for key in MEMBER_KEYS)
_PAX_RECORD = re.compile(rb"(\d+) ([^=]+)=")  # tarfile's rule: "<length> <key>=<value>\n"

class Pending:
    """What extended headers (PAX, GNU long name) said about the member that follows them.

    As in tarfile, the first header that sets a value wins: tarfile applies the outermost
    extended header last.
    """

    __slots__ = ("name", "sparse", "stored")

    def __init__(self):
        self.name: str | None = None
        self.stored: int | None = None  # a PAX "size": the member's bytes in the archive
        self.sparse: SparseMap | None = None

    def add_pax(self, records: list[tuple[str, str]], url: str, member: str | None, offset: int) -> None:
        values: dict[str, str] = {}
        for key, value in records:  # tarfile keeps the last of repeated keys, in first-seen order
            values[key] = value
        # A sparse member's name is GNU.sparse.name, wherever a "path" record stands: GNU tar's
        # PAX 0.x and 1.0 writers put "./GNUSparseFile.<pid>/<name>" in the ustar name, and in
        # a "path" record (after GNU.sparse.name) when it is long or not ASCII. GNU tar reads
        # the real name; tarfile, applying the records in order, the made-up one.
        name = values.get("GNU.sparse.name")
        if name is None and "path" in values:
            name = values["path"].rstrip("/")
        if self.name is None and name is not None:
            self.name = name
        sparse = SparseMap.from_pax(values, records, url, member, offset)
        if sparse is None and "GNU.sparse.realsize" in values:
            raise ShardFormatError(url, member, offset, "a GNU sparse size without a sparse map")
        # A "size" record beside a sparse map is the member's size in the archive (what follows
        # its header: the stored pieces, and for PAX 1.0 the map before them), as the ustar size
        # field it replaces; GNU.sparse.size / GNU.sparse.realsize is the file's size, holes
        # included. So GNU tar reads it, and writes it for sparse members stored in 8 GiB or
        # more (tarfile lets the real size replace it and misreads what follows).
        if "size" in values and self.stored is None:
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


def pax_records(data: bytes, url: str, member: str | None, offset: int) -> list[tuple[str, str]]:
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


class SparseMap:
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
                 member: str | None, offset: int) -> SparseMap | None:
        """The map of PAX sparse formats 0.0, 0.1 or 1.0 (tested in tarfile's order), or None."""
        try:
            if "GNU.sparse.map" in values:  # 0.1: "offset,length,offset,length..."
                numbers = [int(x) for x in values["GNU.sparse.map"].split(",")]
                return cls("PAX 0.1", pairs(numbers), int(values["GNU.sparse.size"]))
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


def pairs(numbers: list[int]) -> list[tuple[int, int]]:
    if len(numbers) % 2:
        raise ValueError(f"an odd count of sparse map numbers ({len(numbers)})")
    return list(zip(numbers[::2], numbers[1::2]))

