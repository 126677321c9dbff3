"""Decode specs, compiled once when a pipe is built: image spec names, ``fn(".suffix", data)``
callables and ``{pattern: fn(data)}`` dicts become handler objects with one call shape."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from ..limits import Limits
from .images import IMAGE_EXTENSIONS, IMAGE_SPECS, decode_image

# A user handler: an image spec name, fn(".suffix", data) -> value or None, or {pattern: fn(data)}.
Spec = str | Callable[[str, bytes], Any] | Mapping[str, Callable[[bytes], Any]]


class DecodeContext(Protocol):
    """What a handler is given of the decoder that calls it (a
    :class:`~wds_datapipes.decoding.decoder.SampleDecoder` is one): its limits and the image
    formats a suffix may be. Handlers name this, not the decoder, whose module imports them."""

    limits: Limits

    def formats_for(self, suffix: str) -> tuple[str, ...]: ...


def split_names(names: str | Iterable[str] | None) -> frozenset[str] | None:
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



class ImageHandler:
    """An image spec name, compiled: decodes the fields whose last dot-part is an image suffix."""

    def __init__(self, name: str):
        if name not in IMAGE_SPECS:
            raise ValueError(f"unknown decode spec {name!r}; known: {' '.join(IMAGE_SPECS)} (images), "
                             "audio, video (or an AudioSpec / VideoSpec)")
        self.name, self.spec = name, IMAGE_SPECS[name]

    def __call__(self, suffix: str, data: bytes, decoder: DecodeContext) -> Any:
        if suffix.rpartition(".")[2] not in IMAGE_EXTENSIONS:
            return None
        return decode_image(data, self.name, decoder.formats_for(suffix), decoder.limits.max_image_pixels)


class PatternHandler:
    """A ``{pattern: fn(data)}`` dict, compiled: the first pattern that matches the suffix decides."""

    def __init__(self, patterns: Mapping[str, Callable[[bytes], Any]]):
        self.patterns = [(pattern.lower(), fn) for pattern, fn in patterns.items()]

    def __call__(self, suffix: str, data: bytes, decoder: DecodeContext) -> Any:
        for pattern, fn in self.patterns:
            if _pattern_matches(pattern, suffix):
                return fn(data)
        return None


class CallableHandler:
    """A webdataset-style handler ``fn(".suffix", data) -> value or None``."""

    def __init__(self, fn: Callable[[str, bytes], Any]):
        self.fn = fn

    def __call__(self, suffix: str, data: bytes, decoder: DecodeContext) -> Any:
        return self.fn("." + suffix, data)


def compile_spec(spec: Spec) -> ImageHandler | PatternHandler | CallableHandler:
    """One handler object for a decode spec: checked and normalised once, when the pipe is built."""
    if isinstance(spec, str):
        return ImageHandler(spec)
    if isinstance(spec, Mapping):
        return PatternHandler(spec)
    if callable(spec):
        return CallableHandler(spec)
    raise TypeError(f"a decode spec is an image spec name, 'audio' or 'video', an AudioSpec or VideoSpec, "
                    f"a callable or a dict, not {spec!r}")

