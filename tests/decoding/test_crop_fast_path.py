"""The crops' JPEG fast path (simplejpeg, cropped as a view) against the library decoder's path."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from PIL import Image
from torch.utils.data.datapipes.iter import IterableWrapper

import wds_datapipes as wd
from tests.decoding.image_files import pillow
from wds_datapipes.decoding import images, vision
from wds_datapipes.decoding.vision import CenterCrop, RandomResizedCrop, tensor_decoders

pytest.importorskip("torchvision", reason="the fast path crops with torchvision")
pytest.importorskip("simplejpeg", reason="the fast path decodes with simplejpeg")
T = pytest.importorskip("torchvision.transforms.v2")
F = T.functional


def _jpeg(seed: int, width: int, height: int, mode: str, subsampling: int, quality: int, progressive: bool) -> bytes:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(height // 8, 1), max(width // 8, 1), 3), dtype=np.uint8)
    picture = Image.fromarray(small).resize((width, height), Image.BICUBIC)
    noise = rng.integers(-12, 13, (height, width, 3))
    picture = Image.fromarray(np.clip(np.asarray(picture, dtype=np.int16) + noise, 0, 255).astype(np.uint8))
    return pillow(picture.convert(mode), "JPEG", quality=quality, subsampling=subsampling, progressive=progressive)


def _library_decoded(data: bytes) -> torch.Tensor:
    return tensor_decoders()["JPEG"](torch.frombuffer(bytearray(data), dtype=torch.uint8))


jpegs = st.builds(_jpeg, seed=st.integers(0, 2**16), width=st.integers(8, 400), height=st.integers(8, 400),
                  mode=st.sampled_from(["RGB", "L"]), subsampling=st.sampled_from([0, 1, 2]),
                  quality=st.integers(40, 100), progressive=st.booleans())


@settings(max_examples=40, deadline=None)
@given(jpegs=st.lists(jpegs, min_size=1, max_size=4), as_view=st.booleans(), seed=st.integers(0, 99))
@example(jpegs=[_jpeg(0, 146, 400, "RGB", 0, 100, True)], as_view=False, seed=0)  # noisy, progressive: Pillow's buffer
def test_fast_path_crops_equal_torchvisions_transforms_of_the_library_decoders_pixels(jpegs, as_view, seed):
    """Oracle: the library decoder the crops used before (torchvision.io / TorchCodec) and
    torchvision's own Resize + CenterCrop, and resized_crop + horizontal_flip with the same draws."""
    samples = [{"__key__": f"k{i}", "__url__": "mem.tar", "jpg": memoryview(data) if as_view else data}
               for i, data in enumerate(jpegs)]
    center, randomly = CenterCrop(24, 32), RandomResizedCrop(24, seed=seed)
    for transform in (center, randomly):
        (batch,) = IterableWrapper(samples, deepcopy=False).decode_batches("torchrgb8", batch_size=len(samples),
                                                                        transform=transform)
        for sample, data, crop in zip(samples, jpegs, batch["jpg"], strict=True):
            decoded = _library_decoded(data)
            if transform is center:
                expected = T.Compose([T.Resize(32, antialias=True), T.CenterCrop(24)])(decoded)
            else:
                box = transform.crop(decoded.shape[1], decoded.shape[2], sample["__key__"], epoch=0)
                expected = F.resized_crop(decoded, *box.box, [24, 24], antialias=True)
                expected = F.horizontal_flip(expected) if box.flip else expected
            assert torch.equal(crop, expected)


def test_ycbcr_and_greyscale_jpegs_skip_the_library_decoder_and_cmyk_takes_it(monkeypatch):
    calls = []
    library = tensor_decoders()["JPEG"]
    monkeypatch.setitem(tensor_decoders(), "JPEG", lambda encoded: calls.append(1) or library(encoded))
    for mode in ("RGB", "L"):
        data = _jpeg(1, 90, 60, mode, 2, 90, False)
        assert images.exact_jpeg_pixels(data, "RGB", 10**6) is not None
        list(IterableWrapper([{"__key__": "k", "jpg": data}]).decode_batches(
            "torchrgb8", batch_size=1, transform=CenterCrop(24, 32)))
    assert calls == []
    out = io.BytesIO()
    Image.new("CMYK", (90, 60), (10, 200, 30, 5)).save(out, format="JPEG")
    assert images.exact_jpeg_pixels(out.getvalue(), "RGB", 10**6) is None
    list(IterableWrapper([{"__key__": "k", "jpg": out.getvalue()}]).decode_batches(
        "torchrgb8", batch_size=1, transform=CenterCrop(24, 32)))
    assert calls == [1]


def test_a_jpeg_over_the_pixel_limit_is_refused_on_the_fast_path_too():
    data = _jpeg(2, 90, 60, "RGB", 2, 90, False)
    row = torch.empty(3, 24, 24, dtype=torch.uint8)
    with pytest.raises(ValueError, match="pixels"):
        vision.decode_transform_into(data, ("JPEG",), CenterCrop(24, 32), "k", 0, row, 90 * 60 - 1)
    vision.decode_transform_into(data, ("JPEG",), CenterCrop(24, 32), "k", 0, row, 90 * 60)


def test_a_truncated_jpeg_is_its_samples_error_as_before():
    data = _jpeg(3, 90, 60, "RGB", 2, 90, False)
    samples = [{"__key__": "a", "__url__": "m.tar", "jpg": data}, {"__key__": "b", "__url__": "m.tar", "jpg": data[:300]}]
    with pytest.raises(wd.DecodeError, match="'b'.*'jpg'"):
        list(IterableWrapper(samples).decode_batches("torchrgb8", batch_size=2, transform=CenterCrop(24, 32)))
