"""Image files of every mode the decoders meet, for the differential tests: PNGs written by a
small encoder of our own (Pillow writes no 16-bit colour and no interlaced PNG), the rest
by Pillow; and the reference pixels every path of ours must give."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image

# (x0, y0, dx, dy) of the seven Adam7 passes of an interlaced PNG.
ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # PNG colour type -> samples per pixel


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _scanlines(samples: np.ndarray, bits: int) -> bytes:
    """Rows of H x W x C samples as PNG scanlines (filter 0), big-endian, packed below 8 bits."""
    if samples.size == 0:
        return b""
    if bits == 16:
        rows = samples.astype(">u2").reshape(samples.shape[0], -1).view(np.uint8)
    elif bits == 8:
        rows = samples.astype(np.uint8).reshape(samples.shape[0], -1)
    else:
        flat = samples.reshape(samples.shape[0], -1).astype(np.uint8)
        shifts = np.arange(bits - 1, -1, -1, dtype=np.uint8)
        rows = np.packbits(((flat[..., None] >> shifts) & 1).reshape(flat.shape[0], -1), axis=1)
    return b"".join(b"\0" + row.tobytes() for row in rows)


def png(samples: np.ndarray, color_type: int, bits: int, interlaced: bool = False,
        palette: np.ndarray | None = None, transparency: bytes | None = None) -> bytes:
    """A PNG of H x W x C ``samples`` (ints below 2**bits) as written by the format's rules."""
    height, width = samples.shape[:2]
    samples = samples.reshape(height, width, CHANNELS[color_type])
    if interlaced:
        raw = b"".join(_scanlines(samples[y0::dy, x0::dx], bits) for x0, y0, dx, dy in ADAM7)
    else:
        raw = _scanlines(samples, bits)
    parts = [b"\x89PNG\r\n\x1a\n",
             _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, bits, color_type, 0, 0, int(interlaced)))]
    if palette is not None:
        parts.append(_chunk(b"PLTE", palette.astype(np.uint8).tobytes()))
    if transparency is not None:
        parts.append(_chunk(b"tRNS", transparency))
    parts += [_chunk(b"IDAT", zlib.compress(raw)), _chunk(b"IEND", b"")]
    return b"".join(parts)


def pillow(image: Image.Image, fmt: str, **options) -> bytes:
    """``image`` saved by Pillow as ``fmt``. Pillow's guess of the buffer a progressive JPEG needs
    (2 bytes a pixel at quality >= 95, 1 below) is too small for noisy pictures at high quality
    ("broken data stream when writing image file"): the save gets 4 bytes a pixel."""
    from PIL import ImageFile

    out = io.BytesIO()
    saved, ImageFile.MAXBLOCK = ImageFile.MAXBLOCK, max(ImageFile.MAXBLOCK, 4 * image.width * image.height)
    try:
        image.save(out, format=fmt, **options)
    finally:
        ImageFile.MAXBLOCK = saved
    return out.getvalue()


# What each kind of file is: its suffix and how it is made from random samples.
KINDS = (
    "png-gray-1", "png-gray-2", "png-gray-4", "png-gray-8", "png-gray-16", "png-gray-16-trns", "png-gray-8-trns",
    "png-graya-8", "png-graya-16", "png-rgb-8", "png-rgb-16", "png-rgba-8", "png-rgba-16",
    "png-palette-1", "png-palette-2", "png-palette-4", "png-palette-8", "png-palette-8-trns", "png-1-pillow",
    "jpeg-rgb", "jpeg-rgb-progressive", "jpeg-gray", "jpeg-cmyk", "gif", "gif-trns", "tiff-gray-16",
)


def image_file(kind: str, width: int, height: int, seed: int, interlaced: bool = False) -> tuple[str, bytes]:
    """(suffix, bytes) of an image of ``kind`` (one of KINDS), random pixels from ``seed``."""
    rng = np.random.default_rng(seed)

    def draw(bits: int, channels: int) -> np.ndarray:
        return rng.integers(0, 2**bits, (height, width, channels), dtype=np.uint16 if bits == 16 else np.uint8)

    if kind.startswith("png-") and not kind.endswith("pillow"):
        _, colour, bits, *trns = kind.split("-")
        bits = int(bits)
        if colour == "palette":
            size = 2**bits
            palette = rng.integers(0, 256, (size, 3), dtype=np.uint8)
            alpha = rng.integers(0, 256, size, dtype=np.uint8).tobytes() if trns else None
            return "png", png(draw(bits, 1), 3, bits, interlaced, palette, alpha)
        color_type = {"gray": 0, "graya": 4, "rgb": 2, "rgba": 6}[colour]
        samples = draw(bits, CHANNELS[color_type])
        transparency = None
        if trns:  # the value of one pixel is transparent
            transparency = struct.pack(">H", int(samples.flat[0]))
        return "png", png(samples, color_type, bits, interlaced, transparency=transparency)
    photo = Image.fromarray(draw(8, 3))
    if kind == "png-1-pillow":
        return "png", pillow(photo.convert("1"), "PNG")
    if kind.startswith("jpeg"):
        mode = {"jpeg-gray": "L", "jpeg-cmyk": "CMYK"}.get(kind, "RGB")
        return "jpeg", pillow(photo.convert(mode), "JPEG", quality=int(rng.integers(50, 96)),
                              progressive=kind.endswith("progressive"), subsampling=int(rng.integers(0, 3)))
    if kind.startswith("gif"):
        options = {"transparency": 1} if kind == "gif-trns" else {}
        return "gif", pillow(photo.quantize(int(rng.integers(2, 256))), "GIF", **options)
    if kind == "tiff-gray-16":
        return "tiff", pillow(Image.fromarray(draw(16, 1)[..., 0]), "TIFF")
    raise ValueError(kind)


def reference_rgb(data: bytes) -> np.ndarray:
    """The oracle: Pillow's ``Image.open(data).convert("RGB")`` (H x W x 3 uint8), where a
    16-bit greyscale image (Pillow's ``I;16``) is first reduced to each value's high byte,
    as Pillow itself reads 16-bit colour PNGs (Pillow's convert from ``I;16`` clips at 255)."""
    image = Image.open(io.BytesIO(data))
    image.load()
    if image.mode.startswith("I;16"):
        image = Image.fromarray((np.asarray(image) >> 8).astype(np.uint8), "L")
    return np.asarray(image.convert("RGB"))
