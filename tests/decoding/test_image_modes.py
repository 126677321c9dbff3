"""Every image mode gives the reference pixels on every decoding path: ``decode``,
``decode_batches`` without a transform (rows or per sample) and with one (torchvision's,
TorchCodec's or Pillow's decoders).

Oracle: Pillow's ``Image.open(data).convert("RGB")``, with 16-bit greyscale reduced to its
high byte first (``image_files.reference_rgb``; docs/reading.md says why). JPEGs are
compared exactly too: every decoder here is libjpeg-turbo with its accurate integer IDCT
and fancy upsampling, so they agree to the bit (simplejpeg vs Pillow is pinned in
test_decoding.py, torchvision vs Pillow here).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from image_files import KINDS, image_file, png, reference_rgb
from torch.utils.data.datapipes.iter import IterableWrapper

import wds_datapipes as wd
from wds_datapipes.decoding import SampleDecoder, vision

# Every path of the crops: torchvision's (or TorchCodec's) tensor decoders; Pillow's decoding
# with torchvision's crop; Pillow alone (no torchvision).
DECODERS = ["tensor", "pillow", "pillow alone"] if vision.tensor_decoders() is not None else ["pillow alone"]


def _sample(key: str, suffix: str, data: bytes) -> dict:
    return {"__key__": key, "__url__": "mem.tar", suffix: data, "cls": b"1"}


def _centre(pixels: np.ndarray, size: int) -> np.ndarray:
    """torchvision's center_crop of ``size`` x ``size`` from an H x W x C array."""
    top, left = round((pixels.shape[0] - size) / 2.0), round((pixels.shape[1] - size) / 2.0)
    return pixels[top : top + size, left : left + size]


def _hwc(image: torch.Tensor) -> np.ndarray:
    return image.permute(1, 2, 0).numpy()


def _check_every_path(suffix: str, data: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    reference = reference_rgb(data)
    height, width = reference.shape[:2]
    decoded = SampleDecoder("torchrgb8")(_sample("a", suffix, data))[suffix]
    assert np.array_equal(_hwc(decoded), reference), "decode('torchrgb8')"

    twice = [_sample("a", suffix, data), _sample("b", suffix, data)]  # one size: JPEGs decode into rows
    (batch,) = IterableWrapper(twice).decode_batches("torchrgb8", batch_size=2)
    for row in batch[suffix]:
        assert np.array_equal(_hwc(row), reference), "decode_batches without a transform"

    size = min(height, width)  # resizing the short side to its own length keeps every pixel
    for decoder in DECODERS:
        with monkeypatch.context() as patch:
            if decoder == "pillow":
                patch.setattr(vision, "tensor_decoders", lambda: None)
            if decoder == "pillow alone":
                patch.setattr(vision, "torchvision_parts", lambda: None)
            (batch,) = IterableWrapper(twice).decode_batches("torchrgb8", batch_size=2,
                                                             transform=wd.CenterCrop(size, resize=size))
        assert batch[suffix].shape == (2, 3, size, size)
        for row in batch[suffix]:
            assert np.array_equal(_hwc(row), _centre(reference, size)), f"decode_batches with a transform ({decoder})"


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(KINDS), width=st.integers(1, 40), height=st.integers(1, 40), seed=st.integers(0, 2**16),
       interlaced=st.booleans())
def test_every_image_mode_gives_the_reference_pixels_on_every_path(kind, width, height, seed, interlaced):
    """Oracle: Pillow's convert('RGB'), 16-bit greyscale by its high byte (image_files.reference_rgb)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        _check_every_path(*image_file(kind, width, height, seed, interlaced), monkeypatch)


@pytest.mark.parametrize("kind", KINDS)
def test_each_image_mode_gives_the_reference_pixels_on_every_path(kind, monkeypatch):
    """Each kind once, interlaced where it is a PNG of ours. Oracle: image_files.reference_rgb."""
    _check_every_path(*image_file(kind, 23, 17, seed=7, interlaced=kind.startswith("png-")), monkeypatch)


def test_a_16_bit_png_is_cropped_from_its_high_bytes():
    """The defect: the crops kept each 16-bit value's low byte. Oracle: v >> 8 of the written values."""
    values = np.random.default_rng(3).integers(0, 2**16, (16, 16, 3), dtype=np.uint16)
    (batch,) = IterableWrapper([_sample("a", "png", png(values, 2, 16))]).decode_batches(
        "torchrgb8", batch_size=1, transform=wd.CenterCrop(16, resize=16))
    assert np.array_equal(_hwc(batch["png"][0]), (values >> 8).astype(np.uint8))
