"""The stream below the tar: the shard's own bytes, and their decompression (gzip, bzip2, xz, zstd).

Every failure of the stream below is restated as our error naming the shard and the byte
reached; the compression is found by the first bytes, whatever the shard's name says.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
from typing import BinaryIO

from ..errors import ShardOpenError, WdsError, shard_error
from .headers import BLOCK, header_ok

try:
    import zstandard
except ImportError:  # the [zstd] extra is optional: .tar.zst shards then raise a clear error
    zstandard = None
_MAGICS = (
    ("gzip", b"\x1f\x8b"),
    ("bzip2", b"BZh"),
    ("xz", b"\xfd7zXZ\x00"),
    ("zstd", b"\x28\xb5\x2f\xfd"),
)

class Source:
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

    def size(self) -> int | None:
        """The stream's length where it can tell (a file), else None."""
        try:
            return os.fstat(self.stream.fileno()).st_size
        except (AttributeError, OSError, ValueError):
            return None

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

    def __init__(self, head: bytes, source: Source):
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


class Decompressed:
    """``readinto`` over the decompressed bytes of a gzip/bzip2/xz/zstd stream, in bounded reads.

    The stdlib's readers check each gzip member's CRC and length trailer (and bzip2's and
    xz's checks); zstandard checks a frame's checksum where the writer stored one.
    """

    def __init__(self, kind: str, head: bytes, source: Source, url: str):
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


def compression(head: bytes | bytearray) -> str | None:
    """The compression whose magic bytes ``head`` starts with; None for a plain tar.

    A valid tar header is a plain tar whatever its first bytes (a member may be named "BZh9...").
    """
    try:
        if len(head) >= BLOCK and header_ok(memoryview(head), 0):
            return None
    except ValueError:  # a checksum field that is no number: not a tar header
        pass
    for kind, magic in _MAGICS:
        if head.startswith(magic):
            return kind
    return None

