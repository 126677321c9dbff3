"""The walk's slow path: one method per kind of header the hot loop does not read inline.

End of archive, PAX (and global PAX), GNU long names and links, regular members after
extended headers, sparse members (old GNU, PAX 0.0, 0.1 and 1.0), and everything that is
not a file. :class:`HeaderKinds` is a base of :class:`~.walk.TarWalk` and uses its
``blocks``, ``url``, ``limits``, ``_fill`` and ``_too_large``.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import ShardFormatError
from .extended import MEMBER_KEYS, Pending, SparseMap, pairs, pax_records
from .headers import (
    BLOCK,
    LONG_LINK,
    LONG_NAME,
    NO_DATA,
    OLD_SPARSE,
    PAX,
    PAX_GLOBAL,
    REGULAR,
    ZERO_BLOCK,
    Header,
    next_header,
    nts,
    octal,
)


class HeaderKinds:
    """The headers :meth:`TarWalk.members` does not read inline, by kind (see the module)."""

    def _header_data(self, pos: int, header: Header, member: str | None) -> tuple[int, bytes]:
        """(next position, data) of the extended header at ``pos``: its data and the padding after
        it, as tarfile reads them (a record or name may run into the padding), within
        Limits.max_header_bytes."""
        if header.size > self.limits.max_header_bytes:
            raise ShardFormatError(self.url, member, header.offset, f"an extended header of {header.size} bytes, "
                                   f"more than the limit of {self.limits.max_header_bytes} (Limits.max_header_bytes)")
        reader = self.blocks
        start, padded = pos + BLOCK, next_header(0, header.size)
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
    def _other_header(self, pos: int, flag: int, member: str | None, pending: Pending | None,
                      entry_start: int | None, skip_data: Callable[[str], bool] | None, with_offsets: bool):
        """Reads the header at ``pos`` that the loop does not read inline, by its kind.

        Returns (next position, pending extended-header state, entry start, item): the item
        is a member to yield, None, or END at the end of the archive.
        """
        reader = self.blocks
        view = reader.view
        offset = reader.base + pos
        if reader.buf[pos] == 0 and view[pos : pos + BLOCK] == ZERO_BLOCK:
            if pending is not None or entry_start is not None:
                raise ShardFormatError(self.url, member, offset, "extended headers without the member they "
                                                                 "describe before the end-of-archive block")
            return pos, None, None, END
        try:
            header = Header(view, pos, offset)
        except ValueError as exn:
            raise ShardFormatError(self.url, member, offset, f"corrupt tar header ({exn})") from None
        if header.flag in PAX:
            return self._pax(pos, header, member, pending, entry_start)
        if header.flag == LONG_NAME or header.flag == LONG_LINK:
            return self._gnu_long(pos, header, member, pending, entry_start)
        if header.flag == PAX_GLOBAL:
            return self._pax_global(pos, header, member, pending, entry_start)
        if header.flag in REGULAR or header.flag == OLD_SPARSE:
            if header.flag == 0 and nts(header.block[:100]).endswith("/"):  # a v7 directory (tarfile's rule)
                return pos + BLOCK, None, None, None
            return self._regular(pos, header, pending, entry_start, skip_data, with_offsets)
        return self._not_a_file(pos, header, pending)

    def _pax(self, pos, header: Header, member, pending, entry_start):
        """A PAX extended header: its records about the next member (path, size, sparse map)."""
        after, data = self._header_data(pos, header, member)
        records = pax_records(data, self.url, member, header.offset)
        if any(key.startswith(MEMBER_KEYS) for key, _ in records):
            pending = pending or Pending()
            pending.add_pax(records, self.url, member, header.offset)
        return after, pending, header.offset if entry_start is None else entry_start, None

    def _pax_global(self, pos, header: Header, member, pending, entry_start):
        """A global PAX header: records for every later member. Ours may not change names or sizes."""
        after, data = self._header_data(pos, header, member)
        changing = sorted({key for key, _ in pax_records(data, self.url, member, header.offset)
                           if key.startswith(MEMBER_KEYS)})
        if changing:
            raise ShardFormatError(self.url, member, header.offset, f"a global PAX header sets {changing} for "
                                   "every later member; such archives are not supported")
        return after, pending, entry_start, None

    def _gnu_long(self, pos, header: Header, member, pending, entry_start):
        """A GNU long name ('L': the next member's name) or long link name ('K': not needed here)."""
        after, data = self._header_data(pos, header, member)
        if header.flag == LONG_LINK:
            return after, pending, entry_start, None
        pending = pending or Pending()
        if pending.name is None:
            pending.name = nts(data)  # up to the first NUL, padding included, as tarfile
        return after, pending, header.offset if entry_start is None else entry_start, None

    def _not_a_file(self, pos, header: Header, pending):
        """A directory, link, device or fifo (no data), or an unknown kind (its data skipped)."""
        if pending is not None and pending.sparse is not None:
            raise ShardFormatError(self.url, header.name, header.offset, "a GNU sparse map before a member that "
                                                                         "is not a file")
        size = 0 if header.flag in NO_DATA else (pending.stored if pending and pending.stored is not None
                                                  else header.size)
        return next_header(pos + BLOCK, size), None, None, None

    def _regular(self, pos, header: Header, pending, entry_start, skip_data, with_offsets):
        """A regular member after extended headers, with an unusual header, or sparse."""
        name = header.name
        size = header.size
        sparse = None
        if pending is not None:
            name = pending.name if pending.name is not None else name
            size = pending.stored if pending.stored is not None else size
            sparse = pending.sparse
        data_start = pos + BLOCK
        if header.flag == OLD_SPARSE:
            if sparse is not None or (pending is not None and pending.stored is not None):
                raise ShardFormatError(self.url, name, header.offset, "an old GNU sparse member with a PAX sparse map")
            sparse, data_start = self._old_sparse_map(pos, header, name)
        first = header.offset if entry_start is None else entry_start
        if skip_data is not None and skip_data(name):
            self.seeked = (name, header.offset, self.blocks.base + data_start, size)
            place = (first, None if sparse is not None else self.blocks.base + data_start, size)
            return next_header(data_start, size), None, None, (name, place if with_offsets else None)
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
        return next_header(start, size), None, None, (name, data)

    def _old_sparse_map(self, pos: int, header: Header, name: str) -> tuple[SparseMap, int]:
        """The map of an old GNU sparse header ('S'), and where its data starts (after the
        extension blocks that continue the map)."""
        block = header.block
        try:
            pieces = [(octal(block[p : p + 12]), octal(block[p + 12 : p + 24])) for p in range(386, 482, 24)]
            real_size = octal(block[483:495])
            extended = block[482]
            at = pos + BLOCK
            blocks = 0
            while extended:
                blocks += 1
                if blocks * BLOCK > self.limits.max_header_bytes:
                    raise self._map_too_large(name, header.offset, "old GNU", f"more than {blocks - 1} "
                                              "extension blocks")
                at, view = self._data(at, BLOCK, name, header.offset)
                more = bytes(view[at : at + BLOCK])
                for p in range(0, 504, 24):
                    piece = (octal(more[p : p + 12]), octal(more[p + 12 : p + 24]))
                    if piece[0] and piece[1]:  # tarfile keeps only these from extension blocks
                        pieces.append(piece)
                extended = more[504]
                at += BLOCK
        except ValueError as exn:
            raise ShardFormatError(self.url, name, header.offset, f"corrupt old GNU sparse header ({exn})") from None
        return SparseMap("old GNU", pieces, real_size), at

    def _map_in_data(self, sparse: SparseMap, stored: memoryview, name: str,
                     offset: int) -> tuple[SparseMap, memoryview]:
        """PAX 1.0: the map at the start of the data (decimal numbers, one a line, the count
        first, padded to a block), and the data after it."""
        limit = self.limits.max_header_bytes
        data = bytes(stored[: min(len(stored), limit)])
        numbers: list[int] = []
        pos = 0
        try:
            while not numbers or len(numbers) < 2 * numbers[0] + 1:
                newline = data.find(b"\n", pos)
                if newline < 0 and len(stored) > limit:  # the map goes on past what we may read
                    raise self._map_too_large(name, offset, "PAX 1.0", f"more than {limit} bytes")
                if newline < 0:
                    raise ValueError(f"the map ends after {len(numbers)} numbers, unfinished")
                numbers.append(int(data[pos:newline]))
                pos = newline + 1
        except ValueError as exn:
            raise ShardFormatError(self.url, name, offset, f"corrupt PAX 1.0 sparse map ({exn})") from None
        map_bytes = (pos + BLOCK - 1) & ~(BLOCK - 1)
        return SparseMap(sparse.version, pairs(numbers[1:]), sparse.real_size), stored[map_bytes:]


    def _map_too_large(self, name: str, offset: int, version: str, what: str) -> ShardFormatError:
        """The error for a sparse map longer than Limits.max_header_bytes, naming the limit."""
        return ShardFormatError(self.url, name, offset, f"a {version} sparse map of {what}, more than the limit "
                                f"of {self.limits.max_header_bytes} (Limits.max_header_bytes)")


END = ("", None)  # the end of the archive, as an item of _other_header

