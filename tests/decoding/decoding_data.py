"""Samples and images the decoding tests share, and the comparison with webdataset 1.0.2's decoder."""

from __future__ import annotations

import numpy as np
import PIL.Image
import PIL.ImageFile
import torch
import webdataset.autodecode as wds_autodecode
from torch.utils.data.datapipes.iter import IterableWrapper

from tests.decoding.image_files import pillow
from wds_datapipes.decoding.decoder import Decoder

URL = "file:///data/shard-000017.tar"


# ---------------------------------------------------------------- building data


def pixels(width: int, height: int, seed: int = 0) -> np.ndarray:
    """Gradients plus noise: real chroma detail, so subsampling and upsampling matter."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) * 7 % 256], -1)
    noise = np.random.default_rng(seed).integers(-40, 40, base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def encode_image(width: int, height: int, mode: str = "RGB", fmt: str = "JPEG", seed: int = 0, **save) -> bytes:
    return pillow(PIL.Image.fromarray(pixels(width, height, seed)).convert(mode), fmt, **save)


def make_jpeg(width: int = 64, height: int = 48, mode: str = "RGB", seed: int = 0, **save) -> bytes:
    return encode_image(width, height, mode, "JPEG", seed, **{"quality": 90, **save})


def make_sample(key: str = "sample-0", **fields: bytes) -> dict:
    return {"__key__": key, "__url__": URL, **fields}


def decoded_by_ours(sample: dict, *specs, **options) -> dict:
    (decoded,) = list(Decoder(IterableWrapper([sample]), *specs, **options))
    return decoded


def decoded_by_webdataset(sample: dict, *specs: str) -> dict:
    handlers = [wds_autodecode.imagehandler(spec) for spec in specs]
    return wds_autodecode.Decoder(handlers).decode(sample)


def assert_same(ours, theirs) -> None:
    assert type(ours) is type(theirs)
    if isinstance(ours, torch.Tensor):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        assert torch.equal(ours, theirs)
    elif isinstance(ours, np.ndarray):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        assert np.array_equal(ours, theirs)
    elif isinstance(ours, PIL.Image.Image):
        assert (ours.mode, ours.size) == (theirs.mode, theirs.size)
        assert ours.tobytes() == theirs.tobytes()
    elif isinstance(ours, dict):
        assert ours.keys() == theirs.keys()
        for key in ours:
            assert_same(ours[key], theirs[key])
    else:
        assert ours == theirs


IMAGES = {
    "jpg": make_jpeg(67, 45),
    "jpeg": make_jpeg(16, 16, mode="L"),
    "png": encode_image(33, 21, "RGBA", "PNG"),
    "seg.png": encode_image(20, 10, "P", "PNG"),
    "ppm": encode_image(9, 7, "RGB", "PPM"),
    "webp": encode_image(12, 12, "RGB", "WEBP", lossless=True),
    "tiff": encode_image(10, 5, "L", "TIFF"),
}


def upper_text(data: bytes) -> str:
    """A user's decoder (module-level: a pipe holding it pickles)."""
    return data.decode().upper()
