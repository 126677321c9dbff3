"""Image fields: which formats a suffix may be, the size check before decoding, and the decode itself.

Values equal webdataset's, which decodes with Pillow. JPEGs are decoded with simplejpeg
where it gives Pillow's exact pixels (YCbCr and greyscale, accurate DCT, fancy
upsampling), which is several times faster; Pillow decodes everything else. No image is
decoded before its header was checked against ``Limits.max_image_pixels``, and an image
field opens only as the format its suffix names unless the user widens that.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np
import PIL.Image
import torch

from ..limits import get_limits

try:
    import simplejpeg
except ImportError:  # the [fast] extra is optional: Pillow decodes everything
    simplejpeg = None

# What Pillow opens, as listed by webdataset.autodecode.IMAGE_EXTENSIONS.
# fmt: off
IMAGE_EXTENSIONS = frozenset(
    {
        "blp", "bmp", "dib", "bufr", "cur", "pcx", "dcx", "dds", "ps", "eps", "fit", "fits", "fli",
        "flc", "ftc", "ftu", "gbr", "gif", "grib", "h5", "hdf", "png", "apng", "jp2", "j2k", "jpc",
        "jpf", "jpx", "j2c", "icns", "ico", "im", "iim", "tif", "tiff", "jfif", "jpe", "jpg", "jpeg",
        "mpg", "mpeg", "msp", "pcd", "pxr", "pbm", "pgm", "ppm", "pnm", "psd", "bw", "rgb", "rgba",
        "sgi", "ras", "tga", "icb", "vda", "vst", "webp", "wmf", "emf", "xbm", "xpm",
    }
)
# fmt: on

class ImageSpec(NamedTuple):
    """What an image spec name makes: a ``container`` (numpy, torch, pil), an ``element``
    type (uint8, float, or None for PIL) and a Pillow ``mode`` (L, RGB, RGBA)."""

    container: str
    element: str | None
    mode: str


# spec name -> ImageSpec, as webdataset.autodecode.imagespecs.
IMAGE_SPECS: dict[str, ImageSpec] = {
    "l8": ImageSpec("numpy", "uint8", "L"),
    "rgb8": ImageSpec("numpy", "uint8", "RGB"),
    "rgba8": ImageSpec("numpy", "uint8", "RGBA"),
    "l": ImageSpec("numpy", "float", "L"),
    "rgb": ImageSpec("numpy", "float", "RGB"),
    "rgba": ImageSpec("numpy", "float", "RGBA"),
    "torchl8": ImageSpec("torch", "uint8", "L"),
    "torchrgb8": ImageSpec("torch", "uint8", "RGB"),
    "torchrgba8": ImageSpec("torch", "uint8", "RGBA"),
    "torchl": ImageSpec("torch", "float", "L"),
    "torchrgb": ImageSpec("torch", "float", "RGB"),
    "torch": ImageSpec("torch", "float", "RGB"),
    "torchrgba": ImageSpec("torch", "float", "RGBA"),
    "pill": ImageSpec("pil", None, "L"),
    "pil": ImageSpec("pil", None, "RGB"),
    "pilrgb": ImageSpec("pil", None, "RGB"),
    "pilrgba": ImageSpec("pil", None, "RGBA"),
}




# Pillow formats whose plugin starts another program (EPS runs Ghostscript): never opened
# unless the user names them (``image_formats=("EPS",)``).
EXTERNAL_PROGRAM_FORMATS = frozenset({"EPS"})


def register_image_plugins() -> None:
    """Imports and registers every Pillow plugin, once a process (~50 modules, ~70 ms of CPU).

    A decoder calls it when it is built, in the process that builds the pipe: loader workers
    forked from that process then inherit the plugins instead of each importing them again
    at its first image (every epoch of a loader without persistent workers starts new ones).
    """
    PIL.Image.init()


def safe_image_formats() -> tuple[str, ...]:
    """Every format Pillow can open here except those that start another program."""
    PIL.Image.init()
    return tuple(sorted(set(PIL.Image.OPEN) - EXTERNAL_PROGRAM_FORMATS))


def image_formats_for(extension: str) -> tuple[str, ...]:
    """The Pillow formats an image field of this extension (``"jpg"``, ``"png"``) is opened as.

    A ``.jpg`` is opened only as JPEG, a ``.png`` only as PNG, and so on, so the bytes
    cannot pick a format the name does not. Raises ValueError for an extension Pillow has
    no format for, and for one whose format starts another program (EPS).
    """
    PIL.Image.init()
    name = PIL.Image.registered_extensions().get("." + extension.lower())
    if name is None:
        raise ValueError(f"no image format is known for the suffix {extension!r}")
    if name in EXTERNAL_PROGRAM_FORMATS:
        raise ValueError(
            f"{name} images (suffix {extension!r}) make Pillow run an external program; they are opened "
            f"only when named, e.g. decode(..., image_formats=[{name!r}])"
        )
    return (name,)


def decode_image(data: bytes, spec: str, formats: Iterable[str] | None = None, max_pixels: int | None = None) -> Any:
    """Decode image bytes as the named spec (``"rgb8"``, ``"torchrgb"``, ``"pil"``, ...).

    Numpy specs give HxWxC arrays (HxW for the ``l`` kinds), torch specs CxHxW tensors (HxW
    for the ``l`` kinds), ``pil`` specs a ``PIL.Image.Image``. The ``8`` kinds are uint8 in
    [0, 255]; the others are float32 in [0, 1]. Torch uint8 tensors are a channels-first
    *view* of an HxWxC array, so they are not contiguous (call ``.contiguous()`` if needed).
    All values equal webdataset's, which decodes with Pillow; JPEGs are decoded with
    simplejpeg when it is installed and gives the same pixels.

    ``formats`` names the Pillow formats the bytes may be (see :func:`image_formats_for`);
    None allows every format except those that start another program (EPS). An image of
    more than ``max_pixels`` pixels (default: ``Limits.max_image_pixels``) raises ValueError
    before its pixels are decoded.
    """
    if spec not in IMAGE_SPECS:
        raise ValueError(f"unknown image spec {spec!r}; known: {' '.join(IMAGE_SPECS)}")
    formats = safe_image_formats() if formats is None else tuple(formats)
    max_pixels = get_limits().max_image_pixels if max_pixels is None else max_pixels
    container, element, mode = IMAGE_SPECS[spec]
    if container == "pil":
        return _pillow_image(data, mode, formats, max_pixels)
    pixels = _jpeg_pixels(data, mode, max_pixels) if "JPEG" in formats else None
    if pixels is None:
        pixels = _pillow_pixels(data, mode, formats, max_pixels)
    if element == "float":
        floats = _to_float(pixels, channels_first=container == "torch")
        return floats if container == "numpy" else torch.from_numpy(floats)
    if not pixels.flags.writeable:  # Pillow's arrays are read-only; users and torch.from_numpy write
        pixels = pixels.copy()
    if container == "numpy":
        return pixels
    tensor = torch.from_numpy(pixels)
    return tensor.permute(2, 0, 1) if tensor.ndim == 3 else tensor


def _pillow_image(data: bytes, mode: str, formats: tuple[str, ...], max_pixels: int) -> PIL.Image.Image:
    """A plain ``Image`` in ``mode``, as webdataset returns (``convert`` copies even in the same mode)."""
    return open_image(data, formats, max_pixels).convert(mode)


def _pillow_pixels(data: bytes, mode: str, formats: tuple[str, ...], max_pixels: int) -> np.ndarray:
    image = open_image(data, formats, max_pixels)
    return np.asarray(image if image.mode == mode else image.convert(mode))  # read-only


def open_image(data: bytes, formats: tuple[str, ...], max_pixels: int) -> PIL.Image.Image:
    """The image Pillow reads from ``data`` as one of ``formats``, its pixels loaded, with 16-bit
    greyscale made 8-bit by :func:`eight_bits`; ValueError for one of more than ``max_pixels``
    pixels, before its pixels are decoded."""
    with io.BytesIO(data) as stream:
        image = PIL.Image.open(stream, formats=formats)  # reads the header only
        _check_pixels(image.width, image.height, max_pixels)
        image.load()
    return eight_bits(image)


# Pillow's modes for 16-bit greyscale (a 16-bit greyscale PNG or TIFF opens as one of them).
SIXTEEN_BIT_MODES = frozenset({"I;16", "I;16B", "I;16L", "I;16N"})


def eight_bits(image: PIL.Image.Image) -> PIL.Image.Image:
    """``image``, with 16-bit greyscale (``I;16``) turned into 8-bit ``L`` (``LA`` where a
    transparent value is set): each value's high byte, ``v >> 8``.

    That is how Pillow itself reads 16-bit RGB, RGBA and greyscale-with-alpha PNGs, and how
    torchvision scales uint16 to uint8 (``to_dtype(..., scale=True)``); every image path of
    ours gives it. Pillow's own ``convert`` from ``I;16`` clips at 255 instead (any value
    over 255 turns white), and so does webdataset, which we do not follow there.
    """
    if image.mode not in SIXTEEN_BIT_MODES:
        return image
    values = np.asarray(image)
    high = (values >> 8).astype(np.uint8)
    transparent = image.info.get("transparency")
    if isinstance(transparent, int):  # one 16-bit value is transparent: keep that as alpha
        alpha = np.where(values == transparent, 0, 255).astype(np.uint8)
        return PIL.Image.fromarray(np.stack([high, alpha], axis=-1), "LA")
    return PIL.Image.fromarray(high, "L")


def check_image_pixels(data: bytes, formats: tuple[str, ...], max_pixels: int) -> None:
    """Raises ValueError for an image of more than ``max_pixels`` pixels, from its header alone.

    A JPEG's header is read by simplejpeg where it is installed (~1 us, Pillow's open
    ~30 us: 2-5% of a 224 px crop's decode); Pillow reads the rest, and any JPEG simplejpeg
    cannot read or Pillow's own bomb guard would stop.
    """
    header = _simplejpeg_header(data) if formats == ("JPEG",) else None
    if header is not None and not _too_big_for_pillow(header[0] * header[1]):
        _check_pixels(header[1], header[0], max_pixels)
        return
    # Anything else, an unreadable JPEG header included: Pillow's open says what is wrong.
    with io.BytesIO(data) as stream, PIL.Image.open(stream, formats=formats) as image:
        _check_pixels(image.width, image.height, max_pixels)


def _check_pixels(width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise ValueError(f"the image is {width}x{height}, {width * height} pixels: more than the limit of "
                         f"{max_pixels} (Limits.max_image_pixels)")


def _jpeg_pixels(data: bytes, mode: str, max_pixels: int | None = None) -> np.ndarray | None:
    """Decode a JPEG with simplejpeg, or return None where Pillow must do it.

    simplejpeg gives the same pixels as Pillow (same libjpeg-turbo settings: accurate DCT,
    fancy upsampling) for YCbCr and grayscale JPEGs, baseline or progressive, any chroma
    subsampling it can read; tests/test_decoding.py checks this. It does not for CMYK/YCCK
    (Pillow handles Adobe's inverted CMYK its own way), nor for a colour JPEG read as L: Y
    is not Pillow's RGB->L luma, so that one is converted by Pillow from simplejpeg's RGB.
    """
    header = _exact_jpeg_header(data, get_limits().max_image_pixels if max_pixels is None else max_pixels)
    if header is None:
        return None
    colorspace = header[2]
    try:
        if mode != "L":
            return simplejpeg.decode_jpeg(data, mode)
        if colorspace == "Gray":
            return simplejpeg.decode_jpeg(data, "GRAY")[:, :, 0]
        return np.asarray(PIL.Image.fromarray(simplejpeg.decode_jpeg(data, "RGB")).convert("L"))
    except ValueError:  # anything simplejpeg rejects (corrupt, truncated, odd layout): Pillow decides
        return None


def exact_jpeg_pixels(data: bytes, mode: str, max_pixels: int) -> np.ndarray | None:
    """A JPEG's HxWxC (HxW for L) uint8 pixels from simplejpeg where they are exactly
    Pillow's, and so torchvision's and TorchCodec's (YCbCr or greyscale, at most
    ``max_pixels``); None where another decoder must decide (no simplejpeg, CMYK, too
    large, anything simplejpeg refuses)."""
    return _jpeg_pixels(data, mode, max_pixels)


def _exact_jpeg_header(data: bytes, max_pixels: int) -> tuple[int, int, str] | None:
    """(height, width, colorspace) of a JPEG that simplejpeg decodes to Pillow's exact
    pixels (YCbCr or greyscale, within Pillow's size guard and ``max_pixels``), else None
    (Pillow then decodes it, or refuses it)."""
    header = _simplejpeg_header(data) if data[:2] == b"\xff\xd8" else None  # bytes or a memoryview
    if header is None:
        return None
    height, width, colorspace = header
    if colorspace not in ("YCbCr", "Gray") or _too_big_for_pillow(height * width) or height * width > max_pixels:
        return None
    return height, width, colorspace


def _simplejpeg_header(data: bytes) -> tuple[int, int, str] | None:
    """(height, width, colorspace) from a JPEG's header by simplejpeg; None without
    simplejpeg or for a header it cannot read."""
    if simplejpeg is None:
        return None
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None
    return height, width, colorspace


def jpeg_into_buffer_shape(data: bytes, mode: str, max_pixels: int | None = None) -> tuple[int, int, int] | None:
    """(height, width, channels) if ``data`` decodes in ``mode`` by :func:`decode_jpeg_into`
    with Pillow's exact pixels and has at most ``max_pixels`` pixels, else None."""
    max_pixels = get_limits().max_image_pixels if max_pixels is None else max_pixels
    header = _exact_jpeg_header(data, max_pixels) if mode in ("RGB", "RGBA") else None
    return None if header is None else (header[0], header[1], len(mode))


def decode_jpeg_into(data: bytes, mode: str, out: np.ndarray) -> None:
    """Decode a JPEG that :func:`jpeg_into_buffer_shape` accepted straight into ``out`` (HxWxC uint8)."""
    simplejpeg.decode_jpeg(data, mode, buffer=out)


def _too_big_for_pillow(pixels: int) -> bool:
    """Pillow warns or refuses above this size (a decompression-bomb guard): let it."""
    limit = PIL.Image.MAX_IMAGE_PIXELS
    return limit is not None and pixels > limit


def _to_float(pixels: np.ndarray, channels_first: bool) -> np.ndarray:
    if channels_first and pixels.ndim == 3:
        pixels = pixels.transpose(2, 0, 1)
    # One pass into one allocation in the output layout. A float32 division, not a product
    # with 1/255: bit-equal to webdataset's astype(float32) / 255.0.
    return np.divide(pixels, np.float32(255.0), out=np.empty(pixels.shape, np.float32), dtype=np.float32)


def check_image_formats(names: Iterable[str]) -> tuple[str, ...]:
    if isinstance(names, str):
        raise TypeError(f"image_formats is a list of Pillow format names, not the string {names!r}")
    PIL.Image.init()
    formats = tuple(name.upper() for name in names)
    unknown = [name for name in formats if name not in PIL.Image.OPEN]
    if unknown:
        raise ValueError(f"unknown image formats {unknown}; Pillow opens: {' '.join(sorted(PIL.Image.OPEN))}")
    return formats

