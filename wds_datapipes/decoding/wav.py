"""WAV fields read before decoding: where the samples are, how many there are, and whether the data is cut.

FFmpeg decodes a cut WAV without a word (it reads what is there), and TorchCodec's WAV
reader trusts the header's length; a WAV written to a pipe (``ffmpeg -f wav -``) cannot
seek back to write its length and leaves 0xFFFFFFFF (or 0) there. :func:`wav_layout`
walks the RIFF chunks of the bytes themselves, so every decoding path sees the same
facts: a data chunk shorter than its header says, or a header cut before it, is a
truncated WAV; a WAV of unknown length holds the whole sample frames that follow its
header; :class:`WavView` is the same WAV with those lengths written in (no copy of the
samples).
"""

from __future__ import annotations

import io
import struct
from typing import NamedTuple

__all__ = ["UNKNOWN_SIZES", "WavLayout", "WavView", "wav_layout"]

# What writers that cannot seek back leave as the data chunk's size; FFmpeg reads both as "to the end".
UNKNOWN_SIZES = frozenset({0, 0xFFFFFFFF})


class WavLayout(NamedTuple):
    """Where a WAV's samples are: ``offset`` of the first sample byte, ``size`` the bytes of whole
    sample frames, ``header_size`` the data chunk's size field as written (at ``size_at``),
    whether it told no length (``streamed``), and ``encoding`` the format tag (an extensible
    format's sub-format: 1 PCM, 3 float, ...; 0 where the header tells none) and whether the
    format is WAVE_FORMAT_EXTENSIBLE."""

    offset: int
    size: int
    header_size: int
    size_at: int
    streamed: bool
    big_endian: bool
    encoding: int = 0
    extensible: bool = False


def wav_layout(data: bytes | memoryview) -> WavLayout | None:
    """The layout of a RIFF/RIFX/RF64 WAVE's samples; None for data that is not one.

    Raises ValueError for a truncated WAV: a header cut before the data chunk, a data chunk
    holding fewer bytes than its header says, or (for a WAV of unknown length) one ending
    inside a sample frame.
    """
    magic, form = bytes(data[:4]), bytes(data[8:12])
    if magic not in (b"RIFF", b"RIFX", b"RF64") or form != b"WAVE":
        return None
    big = magic == b"RIFX"
    word, long = (">I", ">Q") if big else ("<I", "<Q")
    at, block, ds64, encoding, extensible = 12, 0, None, 0, False
    while True:
        if at + 8 > len(data):
            raise ValueError(f"truncated WAV: its {len(data)} bytes end in the header, before the data chunk")
        kind = bytes(data[at : at + 4])
        (size,) = struct.unpack_from(word, data, at + 4)
        body = at + 8
        if kind == b"data":
            break
        if kind in (b"fmt ", b"ds64") and body + 16 > len(data):  # both hold at least 16 bytes
            raise ValueError(f"truncated WAV: its {len(data)} bytes end in its {kind.decode().strip()!r} chunk")
        if kind == b"fmt " and size >= 14:
            short = ">H" if big else "<H"
            (encoding,) = struct.unpack_from(short, data, body)
            (block,) = struct.unpack_from(short, data, body + 12)
            extensible = encoding == 0xFFFE
            if extensible:  # the sub-format GUID starts with the tag
                encoding = struct.unpack_from(short, data, body + 24)[0] if size >= 26 and body + 26 <= len(data) else 0
        elif kind == b"ds64":
            (ds64,) = struct.unpack_from(long, data, body + 8)  # riff size, then data size
        at = body + size + (size & 1)  # chunks are padded to an even size
    present = len(data) - body
    declared = ds64 if magic == b"RF64" and size == 0xFFFFFFFF and ds64 is not None else size
    streamed = magic != b"RF64" and declared in UNKNOWN_SIZES and present > 0
    if streamed:
        whole = present - present % block if block else present
        if whole != present:
            raise ValueError(f"truncated WAV: its samples ({present} bytes, of unknown length) end inside a "
                             f"frame of {block} bytes")
        return WavLayout(body, whole, size, at + 4, True, big, encoding, extensible)
    if declared > present:
        raise ValueError(f"truncated WAV: its header says {declared} bytes of samples, {present} follow")
    return WavLayout(body, declared, size, at + 4, False, big, encoding, extensible)


class WavView(io.RawIOBase):
    """A WAV of unknown length as a readable, seekable file with its lengths written in (the
    RIFF size and the data chunk's size), ending after its last whole sample frame; the samples
    are read from ``data`` in place."""

    def __init__(self, data: bytes, layout: WavLayout):
        super().__init__()
        header = bytearray(data[: layout.offset])
        word = ">I" if layout.big_endian else "<I"
        struct.pack_into(word, header, layout.size_at, layout.size)
        struct.pack_into(word, header, 4, min(layout.offset - 8 + layout.size, 0xFFFFFFFF))
        self._header = bytes(header)
        self._samples = memoryview(data)[layout.offset : layout.offset + layout.size]
        self._length = layout.offset + layout.size
        self._at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self._length}[whence]
        self._at = max(0, base + offset)
        return self._at

    def tell(self) -> int:
        return self._at

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        out = memoryview(buffer).cast("B")
        n = 0
        while n < len(out) and self._at < self._length:
            if self._at < len(self._header):
                piece = self._header[self._at : self._at + len(out) - n]
            else:
                start = self._at - len(self._header)
                piece = self._samples[start : start + len(out) - n]
            out[n : n + len(piece)] = piece
            n += len(piece)
            self._at += len(piece)
        return n
