"""Field encoders (decoding/encoding.py, values.SAFE_ENCODERS): decode(encode(x)) == x per suffix."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from wds_datapipes.decoding import SampleDecoder
from wds_datapipes.decoding.encoding import encode_sample, encode_value
from wds_datapipes.decoding.values import _INT, _TEXT, SAFE_DECODERS, SAFE_ENCODERS

_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                  max_size=3), max_leaves=8)


def _ours(suffix: str, value, *specs):
    return SampleDecoder(*specs)({"__key__": "k", suffix: encode_value(suffix, value)})[suffix]


def _webdataset(suffix: str, value, spec: str = "rgb8"):
    import webdataset

    return webdataset.autodecode.Decoder([webdataset.autodecode.imagehandler(spec)])(
        {"__key__": "k", suffix: encode_value(suffix, value)})[suffix]


def test_every_safe_decoder_suffix_but_tenbin_has_an_encoder():
    """oracle: the decoders' table (the same suffix tuples key both)."""
    assert set(SAFE_DECODERS) - set(SAFE_ENCODERS) == {"ten", "tb", "tenbin"}


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(_INT), st.integers(-10**12, 10**12))
def test_integer_suffixes_round_trip(suffix, value):
    """oracle: our decoder, and webdataset 1.0.2's for the suffixes it reads as int."""
    assert _ours(suffix, value) == value
    if suffix not in ("class", "count"):  # webdataset reads these back as bytes
        assert _webdataset(suffix, value) == value


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(_TEXT), st.text())
def test_text_suffixes_round_trip(suffix, value):
    """oracle: our decoder and webdataset 1.0.2's."""
    assert _ours(suffix, value) == value == _webdataset(suffix, value)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["json", "jsn"]), _JSON.filter(lambda v: not isinstance(v, str)))
def test_json_round_trips(suffix, value):
    """oracle: json.loads in our decoder (webdataset's reads .json the same way)."""
    assert _ours(suffix, value) == value
    if suffix == "json" and value is not None:  # webdataset takes a handler's None as "not mine": bytes
        assert _webdataset(suffix, value) == value


@settings(max_examples=30, deadline=None)
@given(hnp.arrays(st.sampled_from([np.uint8, np.int32, np.float32, np.float64]), hnp.array_shapes(max_dims=3,
                                                                                                  max_side=5)))
def test_npy_round_trips(array):
    """oracle: numpy's reader in our decoder and in webdataset 1.0.2's."""
    np.testing.assert_array_equal(_ours("npy", array), array)
    np.testing.assert_array_equal(_webdataset("npy", array), array)


def test_npz_and_pth_round_trip():
    """oracle: numpy's and torch's own readers through our decoder."""
    arrays = {"a": np.arange(6).reshape(2, 3), "b": np.ones(3, dtype=np.float32)}
    back = _ours("npz", arrays)
    assert set(back) == set(arrays) and all(np.array_equal(back[k], arrays[k]) for k in arrays)
    tensor = torch.arange(12.0).reshape(3, 4)
    assert torch.equal(_ours("pth", tensor), tensor)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["png", "bmp", "tiff", "ppm"]), st.integers(1, 17), st.integers(1, 17), st.booleans(),
       st.integers(0, 2**32 - 1))
def test_lossless_images_round_trip_from_numpy_torch_and_pil(ext, h, w, grey, seed):
    """oracle: Pillow's reader in webdataset 1.0.2's decoder, and ours."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (h, w) if grey else (h, w, 3), dtype=np.uint8)
    spec = "l8" if grey else "rgb8"
    for value in (pixels, torch.from_numpy(pixels if grey else pixels.transpose(2, 0, 1).copy())):
        np.testing.assert_array_equal(_ours(ext, value, spec), pixels)
        np.testing.assert_array_equal(_webdataset(ext, value, spec), pixels)
    import PIL.Image

    np.testing.assert_array_equal(_ours(ext, PIL.Image.fromarray(pixels), spec), pixels)


def test_jpeg_keeps_the_shape_and_nearly_the_pixels():
    """oracle: Pillow's JPEG reader (lossy: within a small error of the smooth input)."""
    y, x = np.mgrid[0:32, 0:48]
    pixels = np.stack([x * 5, y * 7, (x + y) * 3], axis=-1).astype(np.uint8)
    back = _ours("jpg", pixels, "rgb8")
    assert back.shape == pixels.shape and np.abs(back.astype(int) - pixels).mean() < 4
    floats = _ours("jpg", pixels / 255.0, "rgb8")
    assert floats.shape == pixels.shape


def test_bytes_and_str_pass_through_whatever_the_suffix():
    """oracle: webdataset's writer rule (bytes as they are, str as UTF-8)."""
    assert encode_value("jpg", b"\xff\xd8raw") == b"\xff\xd8raw"
    assert encode_value("weird.suffix", "héllo") == "héllo".encode()
    assert encode_sample({"__key__": "k", "__url__": "u", "cls": 3, "txt": "a"}) == {"cls": b"3", "txt": b"a"}


def test_pickle_is_written_only_on_request():
    """oracle: pickle.loads gives the value back when allowed."""
    import pickle

    with pytest.raises(ValueError, match="allow_pickle"):
        encode_value("pyd", {"a": 1})
    assert pickle.loads(encode_value("pyd", {"a": 1}, allow_pickle=True)) == {"a": 1}


def test_a_value_without_an_encoder_is_a_clear_error():
    """oracle: the rule that unknown suffixes take bytes or str only."""
    with pytest.raises(ValueError, match="'blob'"):
        encode_value("blob", 3.5)
    with pytest.raises(ValueError, match="integer"):
        encode_value("cls", 3.5)
