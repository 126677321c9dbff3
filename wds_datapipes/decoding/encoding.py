"""Field values to bytes, by suffix, as webdataset's writer encodes them; the inverse of decoding.

The tables live beside their decoders (:data:`.values.SAFE_ENCODERS`, keyed by the same
suffix tuples; images by :data:`.images.IMAGE_EXTENSIONS`), so a field written here
decodes back to what it was. The rules, in order, by a field's last dot-part:

- bytes (and bytearray, memoryview) are written as they are;
- str is written as UTF-8, whatever the suffix;
- ``cls cls2 class count index inx id``: an integer, as decimal digits;
- ``txt text transcript``: text; ``json jsn``: JSON; ``mp msg msgpack``, ``cbor``;
- ``npy``, ``npz`` (numpy, no pickles), ``pth`` (``torch.save``);
- an image extension (``jpg png webp ...``): a numpy array (HxW or HxWxC, uint8, or float
  in [0, 1]), a torch tensor (CxHxW or HxW) or a PIL image, through Pillow;
- ``pyd pickle pkl``: only with ``allow_pickle=True`` (readers refuse pickles by default).

Anything else raises ValueError naming the field.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import PIL.Image
import torch

from .images import IMAGE_EXTENSIONS
from .values import PICKLE_ENCODERS, SAFE_ENCODERS

JPEG_QUALITY = 95


def encode_image(value: Any, extension: str, *, quality: int = JPEG_QUALITY) -> bytes:
    """Image bytes in the format ``extension`` names, from a PIL image, a numpy array
    (HxW or HxWxC; uint8, or float in [0, 1]) or a torch tensor (CxHxW or HxW)."""
    image = value if isinstance(value, PIL.Image.Image) else PIL.Image.fromarray(_pixels(value))
    PIL.Image.init()
    fmt = PIL.Image.registered_extensions().get("." + extension.lower())
    if fmt is None:
        raise ValueError(f"Pillow writes no format for the extension {extension!r}")
    options = {"quality": quality} if fmt == "JPEG" else {}
    if fmt == "JPEG" and image.mode not in ("L", "RGB", "CMYK"):
        image = image.convert("RGB")
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def _pixels(value: Any) -> np.ndarray:
    """uint8 HxW or HxWxC pixels from an array or a tensor (channels first for tensors)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.ndim == 3:
            value = value.permute(1, 2, 0)
        value = value.numpy()
    pixels = np.asarray(value)
    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[:, :, 0]
    if pixels.ndim not in (2, 3) or (pixels.ndim == 3 and pixels.shape[2] not in (3, 4)):
        raise ValueError(f"an image is HxW or HxWxC with C in (1, 3, 4); got shape {pixels.shape}")
    if pixels.dtype.kind == "f":
        pixels = np.clip(np.rint(pixels * 255.0), 0, 255).astype(np.uint8)
    elif pixels.dtype != np.uint8:
        raise ValueError(f"image pixels are uint8, or floats in [0, 1]; got {pixels.dtype}")
    return np.ascontiguousarray(pixels)


def encode_value(suffix: str, value: Any, *, allow_pickle: bool = False) -> bytes:
    """The bytes a field named ``suffix`` is written as (see the module's rules)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    extension = suffix.rsplit(".", 1)[-1].lower()
    encoder = SAFE_ENCODERS.get(extension)
    if encoder is not None:
        return encoder(value)
    if extension in IMAGE_EXTENSIONS:
        return encode_image(value, extension)
    if extension in PICKLE_ENCODERS:
        if not allow_pickle:
            raise ValueError(f"field {suffix!r}: pickles are written only with allow_pickle=True "
                             "(a reader must trust them to load them)")
        return PICKLE_ENCODERS[extension](value)
    raise ValueError(f"field {suffix!r}: no encoder for a {type(value).__name__} with the extension {extension!r} "
                     "(give bytes, or a suffix with an encoder)")


def encode_sample(sample: dict, *, allow_pickle: bool = False) -> dict[str, bytes]:
    """Each field of ``sample`` encoded by its suffix; keys starting with ``_`` (``__key__``,
    ``__url__``, ...) are left out, as webdataset's writer leaves them out."""
    return {name: encode_value(name, value, allow_pickle=allow_pickle)
            for name, value in sample.items() if not name.startswith("_")}


__all__ = ["encode_image", "encode_sample", "encode_value"]
