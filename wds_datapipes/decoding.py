"""Decoding of sample fields (images, text, numbers, JSON, arrays, tensors), by webdataset's rules.

A sample's fields hold raw bytes. A decoder turns each one into a value chosen by its
suffix: the user's handlers first, then the built-in ones, which pick a decoder by the
*last* dot-part of the suffix (``seg.png`` is an image, ``json.gz`` is gunzipped and then
parsed as JSON). A field no handler takes stays as it was. Values equal those of
webdataset 1.0.2's ``webdataset.autodecode.Decoder``; the few places where we differ on
purpose are listed in :class:`SampleDecoder`.
"""

from __future__ import annotations

import fnmatch
import io
import json
import math
import pickle
import re
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np
import PIL.Image
import torch

from .errors import DecodeError
from .handlers import Handler, reraise_exception, skips
from .limits import Limits, get_limits
from .pipe_base import Pipe
from .threads import check_positive, ordered_map, worker_threads
from .torch_datapipes import IterDataPipe, functional_datapipe

try:
    import simplejpeg
except ImportError:  # the [fast] extra is optional: Pillow decodes everything
    simplejpeg = None

__all__ = [
    "EXTERNAL_PROGRAM_FORMATS",
    "IMAGE_EXTENSIONS",
    "IMAGE_SPECS",
    "Decoder",
    "SampleDecoder",
    "decode_image",
    "decode_jpeg_into",
    "image_formats_for",
    "jpeg_into_buffer_shape",
    "safe_image_formats",
]

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

# A user handler: an image spec name, fn(".suffix", data) -> value or None, or {pattern: fn(data)}.
Spec = str | Callable[[str, bytes], Any] | Mapping[str, Callable[[bytes], Any]]

PICKLE_EXTENSIONS = frozenset({"pyd", "pickle", "pkl"})


################################################################
# images
################################################################


# Pillow formats whose plugin starts another program (EPS runs Ghostscript): never opened
# unless the user names them (``image_formats=("EPS",)``).
EXTERNAL_PROGRAM_FORMATS = frozenset({"EPS"})


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
    return _pillow_open(data, formats, max_pixels).convert(mode)


def _pillow_pixels(data: bytes, mode: str, formats: tuple[str, ...], max_pixels: int) -> np.ndarray:
    image = _pillow_open(data, formats, max_pixels)
    return np.asarray(image if image.mode == mode else image.convert(mode))  # read-only


def _pillow_open(data: bytes, formats: tuple[str, ...], max_pixels: int) -> PIL.Image.Image:
    with io.BytesIO(data) as stream:
        image = PIL.Image.open(stream, formats=formats)  # reads the header only
        _check_pixels(image.width, image.height, max_pixels)
        image.load()
    return image


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


################################################################
# basic types
################################################################


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _json(data: bytes) -> Any:
    return json.loads(data)


def _npy(data: bytes, allow_pickle: bool, limits: Limits) -> np.ndarray:
    stream = io.BytesIO(data)
    _check_npy_header(stream, len(data), limits.max_array_bytes)
    stream.seek(0)
    return np.lib.format.read_array(stream, allow_pickle=allow_pickle)


def _check_npy_header(stream: Any, available: int, limit: int) -> None:
    """Raises ValueError where an npy header claims more bytes than ``limit``, or than the
    ``available`` bytes hold: numpy allocates the array before it reads the data."""
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
    else:  # 3.0 (utf-8 field names): numpy reads it with the same private helper as the others
        shape, _, dtype = np.lib.format._read_array_header(stream, version)
    if dtype.hasobject:
        return  # pickled objects: only with allow_pickle, and no size to check
    claimed = math.prod(shape) * dtype.itemsize
    if claimed > limit:
        raise ValueError(f"the array is {shape} of {dtype}, {claimed} bytes: more than the limit of {limit} "
                         "(Limits.max_array_bytes)")
    if claimed > available - stream.tell():
        raise ValueError(f"the array header claims {shape} of {dtype}, {claimed} bytes; the data holds "
                         f"{available - stream.tell()}")


def _npz(data: bytes, allow_pickle: bool, limits: Limits) -> dict[str, np.ndarray]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        _check_npz(archive, limits.max_array_bytes)
    with np.load(io.BytesIO(data), allow_pickle=allow_pickle) as arrays:
        return dict(arrays)


def _check_npz(archive: zipfile.ZipFile, limit: int) -> None:
    """Raises ValueError where an npz unpacks to more than ``limit`` bytes (a zip bomb), or
    where an array's header claims more than its zip member holds."""
    members = archive.infolist()
    unpacked = sum(info.file_size for info in members)
    if unpacked > limit:
        raise ValueError(f"the npz unpacks to {unpacked} bytes: more than the limit of {limit} "
                         "(Limits.max_array_bytes)")
    for info in members:
        with archive.open(info) as member:
            if member.read(len(np.lib.format.MAGIC_PREFIX)) != np.lib.format.MAGIC_PREFIX:
                continue  # not an array: numpy returns its bytes
        with archive.open(info) as member:
            _check_npy_header(member, info.file_size, limit)


def _torch(data: bytes, allow_pickle: bool, limits: Limits) -> Any:
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=not allow_pickle)


def _gunzip(data: bytes, limit: int) -> bytes:
    """The bytes of a gzip field (concatenated members joined), at most ``limit`` of them."""
    out: list[bytes] = []
    total = 0
    while data:
        inflater = zlib.decompressobj(wbits=31)  # checks each member's CRC and length
        chunk = inflater.decompress(data, limit + 1 - total)
        total += len(chunk)
        if total > limit:
            raise ValueError(f"the gzip data unpacks to more than the limit of {limit} bytes (Limits.max_gz_bytes)")
        if not inflater.eof:
            raise ValueError("truncated gzip data")
        out.append(chunk)
        data = inflater.unused_data
    return b"".join(out)


def _unpickle(data: bytes, allow_pickle: bool, limits: Limits) -> Any:
    if not allow_pickle:
        raise ValueError(
            "pickled data can run arbitrary code when loaded, so it is refused; "
            "pass allow_pickle=True to decode() if you trust these shards"
        )
    return pickle.loads(data)


def _msgpack(data: bytes) -> Any:
    try:
        import msgpack
    except ImportError:
        raise ImportError("decoding msgpack fields needs the msgpack package: pip install msgpack") from None
    return msgpack.unpackb(data)


def _cbor(data: bytes) -> Any:
    try:
        import cbor2
    except ImportError:
        raise ImportError("decoding cbor fields needs the cbor2 package: pip install cbor2") from None
    return cbor2.loads(data)


def _tenbin(data: bytes) -> Any:
    from webdataset import tenbin

    return tenbin.decode_buffer(data)


_TEXT = ("txt", "text", "transcript")
_INT = ("cls", "cls2", "class", "count", "index", "inx", "id")
_SAFE_DECODERS: dict[str, Callable[[bytes], Any]] = {
    **dict.fromkeys(_TEXT, _text),
    **dict.fromkeys(_INT, int),
    **dict.fromkeys(("json", "jsn"), _json),
    **dict.fromkeys(("mp", "msg", "msgpack"), _msgpack),
    "cbor": _cbor,
    **dict.fromkeys(("ten", "tb", "tenbin"), _tenbin),
}
# These take allow_pickle (object arrays, full torch.load and pickle only when it is True) and the limits.
_TRUSTING_DECODERS: dict[str, Callable[[bytes, bool, Limits], Any]] = {
    "npy": _npy,
    "npz": _npz,
    "pth": _torch,
    **dict.fromkeys(PICKLE_EXTENSIONS, _unpickle),
}


################################################################
# fields and samples
################################################################


def _split_names(names: str | Iterable[str] | None) -> frozenset[str] | None:
    if names is None:
        return None
    if isinstance(names, str):
        names = re.split(r"[\s,]+", names.strip())
    return frozenset(name for name in names if name)


def _pattern_matches(pattern: str, suffix: str) -> bool:
    """A glob matches the whole suffix; a plain name matches its last dot-parts (``png``, ``seg.png``)."""
    if any(char in pattern for char in "*?["):
        return fnmatch.fnmatchcase(suffix, pattern)
    return suffix == pattern or suffix.endswith("." + pattern)


def _check_formats(names: Iterable[str]) -> tuple[str, ...]:
    if isinstance(names, str):
        raise TypeError(f"image_formats is a list of Pillow format names, not the string {names!r}")
    PIL.Image.init()
    formats = tuple(name.upper() for name in names)
    unknown = [name for name in formats if name not in PIL.Image.OPEN]
    if unknown:
        raise ValueError(f"unknown image formats {unknown}; Pillow opens: {' '.join(sorted(PIL.Image.OPEN))}")
    return formats


class ImageHandler:
    """An image spec name, compiled: decodes the fields whose last dot-part is an image suffix."""

    def __init__(self, name: str):
        if name not in IMAGE_SPECS:
            raise ValueError(f"unknown image spec {name!r}; known: {' '.join(IMAGE_SPECS)}")
        self.name, self.spec = name, IMAGE_SPECS[name]

    def __call__(self, suffix: str, data: bytes, decoder: SampleDecoder) -> Any:
        if suffix.rpartition(".")[2] not in IMAGE_EXTENSIONS:
            return None
        return decode_image(data, self.name, decoder.formats_for(suffix), decoder.limits.max_image_pixels)


class PatternHandler:
    """A ``{pattern: fn(data)}`` dict, compiled: the first pattern that matches the suffix decides."""

    def __init__(self, patterns: Mapping[str, Callable[[bytes], Any]]):
        self.patterns = [(pattern.lower(), fn) for pattern, fn in patterns.items()]

    def __call__(self, suffix: str, data: bytes, decoder: SampleDecoder) -> Any:
        for pattern, fn in self.patterns:
            if _pattern_matches(pattern, suffix):
                return fn(data)
        return None


class CallableHandler:
    """A webdataset-style handler ``fn(".suffix", data) -> value or None``."""

    def __init__(self, fn: Callable[[str, bytes], Any]):
        self.fn = fn

    def __call__(self, suffix: str, data: bytes, decoder: SampleDecoder) -> Any:
        return self.fn("." + suffix, data)


def compile_spec(spec: Spec) -> ImageHandler | PatternHandler | CallableHandler:
    """One handler object for a decode spec: checked and normalised once, when the pipe is built."""
    if isinstance(spec, str):
        return ImageHandler(spec)
    if isinstance(spec, Mapping):
        return PatternHandler(spec)
    if callable(spec):
        return CallableHandler(spec)
    raise TypeError(f"a decode spec is an image spec name, a callable or a dict, not {spec!r}")


class SampleDecoder:
    """Decodes the fields of one sample dict; the logic of :class:`Decoder`, usable without a pipe.

    For each field, in order: ``.gz`` layers are gunzipped; then each spec is tried in the
    order given (an image spec name takes image suffixes; a callable ``fn(".suffix", data)``
    takes the field when it returns something other than None, and gets the suffix with a
    leading dot, as webdataset's handlers do, so those work here unchanged; a dict
    ``{pattern: fn(data)}`` takes the field when a pattern matches its suffix, ``fnmatch``
    globs against the whole suffix, plain names against its last dot-parts); then the
    built-ins, chosen by the last dot-part of the suffix:

    - txt text transcript -> str; cls cls2 class count index inx id -> int
    - json jsn -> parsed JSON; mp msg msgpack -> msgpack; cbor -> cbor2
    - npy -> numpy array; npz -> dict of arrays; pth -> ``torch.load`` (CPU)
    - ten tb tenbin -> webdataset's tenbin; pyd pickle pkl -> pickle, only if allowed

    Anything else stays as it was. Fields whose name starts with ``__`` and values that
    are not bytes-like (already decoded) pass through unchanged.

    Where we differ from webdataset 1.0.2 on purpose: ``class`` and ``count`` become int and
    ``msgpack``, ``tenbin`` are decoded (webdataset's writer writes them but its decoder
    leaves them as bytes); cbor uses ``cbor2`` (webdataset imports the long-dead ``cbor``);
    several ``.gz`` layers are all removed; ``.pth`` loads with ``weights_only=True`` unless
    allow_pickle; pickle is refused unless allow_pickle; non-bytes values pass through
    instead of failing; ``only`` also takes commas.

    Args:
        *specs: image spec names, callables and dicts, tried in order before the built-ins.
        only: field names to decode (a list, or a string of names separated by spaces or
            commas); the other fields stay as they are. None decodes all.
        allow_pickle: trust the data: allow pickle, object arrays in npy/npz, and
            ``torch.load(weights_only=False)``.
        image_formats: None (default) opens each image field only as the format its suffix
            names (``.jpg`` as JPEG, ``.png`` as PNG; see :func:`image_formats_for`). A list
            of Pillow format names (``["JPEG", "PNG", "WEBP"]``) opens every image field as
            any of them, for data whose suffixes lie; formats that start another program
            (EPS) open only when named here.
        limits: the largest image (pixels), ``.gz`` field and npy/npz arrays decoded (see
            :class:`~wds_datapipes.limits.Limits`); default: :func:`~wds_datapipes.limits.get_limits`.
    """

    def __init__(
        self,
        *specs: Spec,
        only: str | Iterable[str] | None = None,
        allow_pickle: bool = False,
        image_formats: Iterable[str] | None = None,
        limits: Limits | None = None,
    ):
        self.specs = specs
        self.handlers = [compile_spec(spec) for spec in specs]
        self.only = _split_names(only)
        self.allow_pickle = allow_pickle
        self.image_formats = None if image_formats is None else _check_formats(image_formats)
        self.limits = limits or get_limits()

    def formats_for(self, suffix: str) -> tuple[str, ...]:
        """The Pillow formats an image field with this suffix may be opened as."""
        if self.image_formats is not None:
            return self.image_formats
        return image_formats_for(suffix.rpartition(".")[2])

    def __call__(self, sample: dict) -> dict:
        """Return a new sample with its fields decoded; raise DecodeError naming the first that fails."""
        decoded = {}
        for field, value in sample.items():
            if field.startswith("__") or (self.only is not None and field not in self.only):
                decoded[field] = value
                continue
            try:
                decoded[field] = self.decode_field(field, value)
            except Exception as exn:
                url, key = str(sample.get("__url__")), str(sample.get("__key__"))
                raise DecodeError(url, key, field, f"{type(exn).__name__}: {exn}") from exn
        return decoded

    def decode_field(self, suffix: str, value: Any) -> Any:
        """Decode one field's value by its suffix (``"jpg"``, ``"seg.png"``, ``"json.gz"``)."""
        if not isinstance(value, (bytes, bytearray, memoryview)):
            return value
        data = bytes(value)
        while suffix == "gz" or suffix.endswith(".gz"):
            data = _gunzip(data, self.limits.max_gz_bytes)
            suffix = suffix[:-3].rstrip(".")
        if not suffix:
            return data
        for handler in self.handlers:
            result = handler(suffix, data, self)
            if result is not None:
                return result
        return self._decode_builtin(suffix.rpartition(".")[2], data)

    def _decode_builtin(self, extension: str, data: bytes) -> Any:
        if extension in _SAFE_DECODERS:
            return _SAFE_DECODERS[extension](data)
        if extension in _TRUSTING_DECODERS:
            return _TRUSTING_DECODERS[extension](data, self.allow_pickle, self.limits)
        return data


################################################################
# the DataPipe
################################################################


@functional_datapipe("decode")
class Decoder(Pipe[dict]):
    """Yields each sample dict with its fields decoded (functional name: ``decode``).

    Fields are decoded by :class:`SampleDecoder`'s rules: the specs given here first, then
    the built-ins (text, int, JSON, msgpack, cbor, npy, npz, pth, tenbin; pickle only with
    ``allow_pickle``), by the last dot-part of each suffix; unknown fields stay bytes.
    Images stay bytes unless an image spec is given. A sample whose decoding fails is
    either passed whole to ``handler`` (as a DecodeError naming the shard URL, key and
    field) and skipped when the handler returns True, or the error stops the run; a
    half-decoded sample is never yielded.

    Args:
        source_datapipe: yields sample dicts (``__key__``, ``__url__``, one entry per suffix).
        *specs: image spec names (``"rgb8"``, ``"torchrgb"``, ``"pil"``, ... see
            ``IMAGE_SPECS``), callables ``fn(".suffix", data) -> value or None`` (None: not
            mine, try the next), or dicts ``{suffix or glob: fn(data) -> value}`` (e.g.
            ``{"seg.png": f, "*.npy": g}``). They are tried in order, before the built-ins.
        only: the field names to decode (list, or string separated by spaces or commas);
            the others stay bytes. None (default) decodes every field.
        handler: error policy (see ``wds_datapipes.handlers``); default re-raises.
        allow_pickle: decode pickle, object arrays and full ``torch.load``; only for
            shards you trust. Without it a pickle field is a DecodeError.
        num_threads: 0 decodes in the iterating thread; N > 0 decodes in a pool of N
            threads (decoders release the GIL), keeping the input order, with at most 4*N
            samples in flight.
        image_formats: None (default) opens an image field only as the format its suffix
            names (``.jpg`` as JPEG, ...); a list of Pillow format names widens that for
            every image field (``["JPEG", "PNG"]`` for mislabeled files). EPS, which starts
            Ghostscript, opens only when named here.
        limits: the largest image (pixels), ``.gz`` field and npy/npz arrays decoded; by
            default the process's :func:`~wds_datapipes.limits.get_limits` when the pipe is built.

    Example:
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> dp = IterableWrapper([{"__key__": "a", "__url__": "s.tar", "cls": b"3", "txt": b"hi"}])
        >>> list(dp.decode("torchrgb8"))
        [{'__key__': 'a', '__url__': 's.tar', 'cls': 3, 'txt': 'hi'}]
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[dict],
        *specs: Spec,
        only: str | Iterable[str] | None = None,
        handler: Handler = reraise_exception,
        allow_pickle: bool = False,
        num_threads: int = 0,
        image_formats: Iterable[str] | None = None,
        limits: Limits | None = None,
    ):
        self.source_datapipe = source_datapipe
        self.decoder = SampleDecoder(*specs, only=only, allow_pickle=allow_pickle, image_formats=image_formats,
                                     limits=limits)
        self.handler = handler
        self.num_threads = check_positive("num_threads", num_threads, 0)

    def __iter__(self) -> Iterator[dict]:
        if self.num_threads == 0:
            for sample in self.source_datapipe:
                decoded = self._settle(sample, self.decoder, sample)
                if decoded is not None:
                    yield decoded
            return
        with worker_threads(self.num_threads) as pool:
            for sample, future in ordered_map(self.decoder, self.source_datapipe, pool, 4 * self.num_threads):
                decoded = self._settle(sample, future.result)
                if decoded is not None:
                    yield decoded

    def _settle(self, sample: dict, decode: Callable[..., dict], *args: Any) -> dict | None:
        """``sample`` decoded by ``decode(*args)``, or None when it failed and the handler skips it."""
        try:
            return decode(*args)
        except DecodeError as exn:
            if skips(self.handler, exn, sample):
                return None
            raise
