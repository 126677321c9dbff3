"""Decoding sample fields, by webdataset's rules and faster.

``decoder`` (the ``decode`` pipe and :class:`SampleDecoder`: start here), ``specs`` (how
the user's specs become handlers), ``images`` (image formats, limits and decoding),
``media`` (audio and video: ``decode("audio", "video")``, :class:`AudioSpec`, :class:`VideoSpec`),
``values`` (text, numbers, JSON, arrays, tensors, ...), ``batch_decoder``
(``decode_batches``: images decoded straight into the batch) and ``vision`` (the crops).
"""

from .decoder import Decoder, SampleDecoder
from .images import (
    EXTERNAL_PROGRAM_FORMATS,
    IMAGE_EXTENSIONS,
    IMAGE_SPECS,
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

__all__ = [
    "AUDIO_EXTENSIONS",
    "EXTERNAL_PROGRAM_FORMATS",
    "IMAGE_EXTENSIONS",
    "IMAGE_SPECS",
    "VIDEO_EXTENSIONS",
    "Audio",
    "AudioBatch",
    "AudioSpec",
    "Decoder",
    "SampleDecoder",
    "Video",
    "VideoSpec",
    "collate_media",
    "decode_audio",
    "decode_image",
    "decode_jpeg_into",
    "decode_video",
    "image_formats_for",
    "jpeg_into_buffer_shape",
    "pad_audio",
    "safe_image_formats",
]
