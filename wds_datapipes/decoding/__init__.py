"""Decoding sample fields, by webdataset's rules and faster.

``decoder`` (the ``decode`` pipe and :class:`SampleDecoder`: start here), ``specs`` (how
the user's specs become handlers), ``images`` (image formats, limits and decoding),
``media`` (audio and video: ``decode("audio", "video")``, :class:`AudioSpec`, :class:`VideoSpec`),
``values`` (text, numbers, JSON, arrays, tensors, ...), ``batch_decoder``
(``decode_batches``: images decoded straight into the batch) and ``vision`` (the crops).
"""

import importlib
import warnings

from .decoder import Decoder, SampleDecoder
from .images import (
    EXTERNAL_PROGRAM_FORMATS,
    IMAGE_EXTENSIONS,
    IMAGE_SPECS,
    ImageSpec,
    check_image_pixels,
    decode_image,
    decode_jpeg_into,
    image_formats_for,
    jpeg_into_buffer_shape,
    safe_image_formats,
)
from .media import (
    AUDIO_EXTENSIONS,
    VIDEO_EXTENSIONS,
    Audio,
    AudioBatch,
    AudioSpec,
    Video,
    VideoSpec,
    collate_media,
    decode_audio,
    decode_video,
    pad_audio,
)
from .specs import CallableHandler, ImageHandler, PatternHandler, Spec, compile_spec
from .values import PICKLE_EXTENSIONS

# Names the flat layout's decoding.py imported from the shared basics, which code may have
# taken from it: found in their home, with a DeprecationWarning.
_BASICS = {
    "DecodeError": "errors", "Handler": "handlers", "reraise_exception": "handlers", "skips": "handlers",
    "IterDataPipe": "torch_datapipes", "functional_datapipe": "torch_datapipes", "Limits": "limits",
    "get_limits": "limits", "Pipe": "pipe_base", "check_positive": "threads", "ordered_map": "threads",
    "worker_threads": "threads",
}


def __getattr__(name: str):
    if name in _BASICS:
        home = f"{__name__.rpartition('.')[0]}.{_BASICS[name]}"
        warnings.warn(f"{__name__}.{name} is {home}.{name}: import it from there", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(home), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AUDIO_EXTENSIONS",
    "EXTERNAL_PROGRAM_FORMATS",
    "IMAGE_EXTENSIONS",
    "IMAGE_SPECS",
    "PICKLE_EXTENSIONS",
    "VIDEO_EXTENSIONS",
    "Audio",
    "AudioBatch",
    "AudioSpec",
    "CallableHandler",
    "Decoder",
    "ImageHandler",
    "ImageSpec",
    "PatternHandler",
    "SampleDecoder",
    "Spec",
    "Video",
    "VideoSpec",
    "check_image_pixels",
    "collate_media",
    "compile_spec",
    "decode_audio",
    "decode_image",
    "decode_jpeg_into",
    "decode_video",
    "image_formats_for",
    "jpeg_into_buffer_shape",
    "pad_audio",
    "safe_image_formats",
]
