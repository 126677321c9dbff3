"""Decoding sample fields, by webdataset's rules and faster.

``decoder`` (the ``decode`` pipe and :class:`SampleDecoder`: start here), ``specs`` (how
the user's specs become handlers), ``images`` (image formats, limits and decoding),
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
