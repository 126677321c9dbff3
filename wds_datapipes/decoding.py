"""Decoding of sample fields (images, text, numbers, JSON, arrays, tensors), by webdataset's rules.

A sample's fields hold raw bytes. A decoder turns each one into a value chosen by its
suffix: the user's handlers first, then the built-in ones, which pick a decoder by the
*last* dot-part of the suffix (``seg.png`` is an image, ``json.gz`` is gunzipped and then
parsed as JSON). A field no handler takes stays as it was. Values equal those of
webdataset 1.0.2's ``webdataset.autodecode.Decoder``; the few places where we differ on
purpose are listed in :class:`SampleDecoder`.
"""

from __future__ import annotations

import collections
import fnmatch
import gzip
import io
import json
import pickle
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import PIL.Image
import torch
from torch.utils.data import IterDataPipe, functional_datapipe

from .errors import DecodeError
from .handlers import Handler, reraise_exception
from .pipe_base import Pipe

try:
    import simplejpeg
except ImportError:  # the [fast] extra is optional: Pillow decodes everything
    simplejpeg = None

__all__ = [
    "IMAGE_EXTENSIONS",
    "IMAGE_SPECS",
    "Decoder",
    "SampleDecoder",
    "decode_image",
    "decode_jpeg_into",
    "jpeg_into_buffer_shape",
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

# spec name -> (container, element type, Pillow mode), as webdataset.autodecode.imagespecs.
IMAGE_SPECS: dict[str, tuple[str, str | None, str]] = {
    "l8": ("numpy", "uint8", "L"),
    "rgb8": ("numpy", "uint8", "RGB"),
    "rgba8": ("numpy", "uint8", "RGBA"),
    "l": ("numpy", "float", "L"),
    "rgb": ("numpy", "float", "RGB"),
    "rgba": ("numpy", "float", "RGBA"),
    "torchl8": ("torch", "uint8", "L"),
    "torchrgb8": ("torch", "uint8", "RGB"),
    "torchrgba8": ("torch", "uint8", "RGBA"),
    "torchl": ("torch", "float", "L"),
    "torchrgb": ("torch", "float", "RGB"),
    "torch": ("torch", "float", "RGB"),
    "torchrgba": ("torch", "float", "RGBA"),
    "pill": ("pil", None, "L"),
    "pil": ("pil", None, "RGB"),
    "pilrgb": ("pil", None, "RGB"),
    "pilrgba": ("pil", None, "RGBA"),
}

# A user handler: an image spec name, fn(".suffix", data) -> value or None, or {pattern: fn(data)}.
Spec = str | Callable[[str, bytes], Any] | Mapping[str, Callable[[bytes], Any]]

PICKLE_EXTENSIONS = frozenset({"pyd", "pickle", "pkl"})


################################################################
# images
################################################################


def decode_image(data: bytes, spec: str) -> Any:
    """Decode image bytes as the named spec (``"rgb8"``, ``"torchrgb"``, ``"pil"``, ...).

    Numpy specs give HxWxC arrays (HxW for the ``l`` kinds), torch specs CxHxW tensors (HxW
    for the ``l`` kinds), ``pil`` specs a ``PIL.Image.Image``. The ``8`` kinds are uint8 in
    [0, 255]; the others are float32 in [0, 1]. Torch uint8 tensors are a channels-first
    *view* of an HxWxC array, so they are not contiguous (call ``.contiguous()`` if needed).
    All values equal webdataset's, which decodes with Pillow; JPEGs are decoded with
    simplejpeg when it is installed and gives the same pixels.
    """
    if spec not in IMAGE_SPECS:
        raise ValueError(f"unknown image spec {spec!r}; known: {' '.join(IMAGE_SPECS)}")
    container, element, mode = IMAGE_SPECS[spec]
    if container == "pil":
        return _pillow_image(data, mode)
    pixels = _jpeg_pixels(data, mode)
    if pixels is None:
        pixels = _pillow_pixels(data, mode)
    if element == "float":
        floats = _to_float(pixels, channels_first=container == "torch")
        return floats if container == "numpy" else torch.from_numpy(floats)
    if not pixels.flags.writeable:  # Pillow's arrays are read-only; users and torch.from_numpy write
        pixels = pixels.copy()
    if container == "numpy":
        return pixels
    tensor = torch.from_numpy(pixels)
    return tensor.permute(2, 0, 1) if tensor.ndim == 3 else tensor


def _pillow_image(data: bytes, mode: str) -> PIL.Image.Image:
    """A plain ``Image`` in ``mode``, as webdataset returns (``convert`` copies even in the same mode)."""
    return _pillow_open(data).convert(mode)


def _pillow_pixels(data: bytes, mode: str) -> np.ndarray:
    image = _pillow_open(data)
    return np.asarray(image if image.mode == mode else image.convert(mode))  # read-only


def _pillow_open(data: bytes) -> PIL.Image.Image:
    with io.BytesIO(data) as stream:
        image = PIL.Image.open(stream)
        image.load()
    return image


def _jpeg_pixels(data: bytes, mode: str) -> np.ndarray | None:
    """Decode a JPEG with simplejpeg, or return None where Pillow must do it.

    simplejpeg gives the same pixels as Pillow (same libjpeg-turbo settings: accurate DCT,
    fancy upsampling) for YCbCr and grayscale JPEGs, baseline or progressive, any chroma
    subsampling it can read; tests/test_decoding.py checks this. It does not for CMYK/YCCK
    (Pillow handles Adobe's inverted CMYK its own way), nor for a colour JPEG read as L: Y
    is not Pillow's RGB->L luma, so that one is converted by Pillow from simplejpeg's RGB.
    """
    header = _exact_jpeg_header(data)
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


def _exact_jpeg_header(data: bytes) -> tuple[int, int, str] | None:
    """(height, width, colorspace) of a JPEG that simplejpeg decodes to Pillow's exact
    pixels (YCbCr or greyscale, within Pillow's size guard), else None."""
    if simplejpeg is None or not data.startswith(b"\xff\xd8"):
        return None
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None
    if colorspace not in ("YCbCr", "Gray") or _too_big_for_pillow(height * width):
        return None
    return height, width, colorspace


def jpeg_into_buffer_shape(data: bytes, mode: str) -> tuple[int, int, int] | None:
    """(height, width, channels) if ``data`` decodes in ``mode`` by :func:`decode_jpeg_into`
    with Pillow's exact pixels, else None."""
    header = _exact_jpeg_header(data) if mode in ("RGB", "RGBA") else None
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


def _npy(data: bytes, allow_pickle: bool) -> np.ndarray:
    return np.lib.format.read_array(io.BytesIO(data), allow_pickle=allow_pickle)


def _npz(data: bytes, allow_pickle: bool) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=allow_pickle) as arrays:
        return dict(arrays)


def _torch(data: bytes, allow_pickle: bool) -> Any:
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=not allow_pickle)


def _unpickle(data: bytes, allow_pickle: bool) -> Any:
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
# These take allow_pickle: object arrays, full torch.load and pickle only when it is True.
_TRUSTING_DECODERS: dict[str, Callable[[bytes, bool], Any]] = {
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


def _check_spec(spec: Any) -> None:
    if isinstance(spec, str):
        if spec not in IMAGE_SPECS:
            raise ValueError(f"unknown image spec {spec!r}; known: {' '.join(IMAGE_SPECS)}")
    elif not (callable(spec) or isinstance(spec, Mapping)):
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
    """

    def __init__(
        self,
        *specs: Spec,
        only: str | Iterable[str] | None = None,
        allow_pickle: bool = False,
    ):
        for spec in specs:
            _check_spec(spec)
        self.specs = specs
        self.only = _split_names(only)
        self.allow_pickle = allow_pickle

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
            data = gzip.decompress(data)
            suffix = suffix[:-3].rstrip(".")
        if not suffix:
            return data
        for spec in self.specs:
            result = self._apply_spec(spec, suffix, data)
            if result is not None:
                return result
        return self._decode_builtin(suffix.rpartition(".")[2], data)

    def _apply_spec(self, spec: Spec, suffix: str, data: bytes) -> Any:
        if isinstance(spec, str):
            return decode_image(data, spec) if suffix.rpartition(".")[2] in IMAGE_EXTENSIONS else None
        if isinstance(spec, Mapping):
            for pattern, fn in spec.items():
                if _pattern_matches(pattern.lower(), suffix):
                    return fn(data)
            return None
        return spec("." + suffix, data)

    def _decode_builtin(self, extension: str, data: bytes) -> Any:
        if extension in _SAFE_DECODERS:
            return _SAFE_DECODERS[extension](data)
        if extension in _TRUSTING_DECODERS:
            return _TRUSTING_DECODERS[extension](data, self.allow_pickle)
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
    ):
        if num_threads < 0:
            raise ValueError(f"num_threads must be >= 0, not {num_threads}")
        self.source_datapipe = source_datapipe
        self.decoder = SampleDecoder(*specs, only=only, allow_pickle=allow_pickle)
        self.handler = handler
        self.num_threads = num_threads

    def __iter__(self) -> Iterator[dict]:
        if self.num_threads == 0:
            for sample in self.source_datapipe:
                decoded = self._settle(self.decoder, sample)
                if decoded is not None:
                    yield decoded
        else:
            yield from self._decode_in_threads()

    def _decode_in_threads(self) -> Iterator[dict]:
        # The pool lives only as long as this generator, so the pipe itself still pickles.
        pool = ThreadPoolExecutor(self.num_threads, thread_name_prefix="wds-decode")
        in_flight: collections.deque[Future] = collections.deque()
        try:
            for sample in self.source_datapipe:
                in_flight.append(pool.submit(self.decoder, sample))
                if len(in_flight) >= 4 * self.num_threads:
                    decoded = self._settle(in_flight.popleft().result)
                    if decoded is not None:
                        yield decoded
            while in_flight:
                decoded = self._settle(in_flight.popleft().result)
                if decoded is not None:
                    yield decoded
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _settle(self, decode: Callable[..., dict], *args: Any) -> dict | None:
        """The decoded sample, or None when it failed and the handler says skip it."""
        try:
            return decode(*args)
        except DecodeError as exn:
            if self.handler(exn):
                return None
            raise
