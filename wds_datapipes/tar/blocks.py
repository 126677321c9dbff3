"""The block reader: one reusable buffer that the walk parses headers in, filled with ``readinto``."""

from __future__ import annotations

from collections.abc import Callable

CHUNK = 1 << 20  # the buffer's usual size: a read of this much at a time
ReadInto = Callable[[memoryview], int]

class BlockReader:
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

