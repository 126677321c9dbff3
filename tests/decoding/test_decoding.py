"""Decoding of sample fields: values equal webdataset 1.0.2's decoder (errors, threads: test_decoding_threads.py)."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import warnings

import msgpack
import numpy as np
import pytest
import torch
import webdataset.autodecode as wds_autodecode
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data.datapipes.iter import IterableWrapper

from tests.decoding.decoding_data import (
    IMAGES,
    URL,
    assert_same,
    decoded_by_ours,
    decoded_by_webdataset,
    make_jpeg,
    make_sample,
    upper_text,
)
from wds_datapipes.decoding import images
from wds_datapipes.decoding.decoder import Decoder, SampleDecoder
from wds_datapipes.decoding.images import IMAGE_SPECS, decode_image
from wds_datapipes.errors import DecodeError

# ---------------------------------------------------------------- images


@pytest.mark.parametrize("spec", sorted(IMAGE_SPECS))
@pytest.mark.parametrize("suffix", sorted(IMAGES))
def test_each_image_spec_equals_webdataset(spec, suffix):
    sample = make_sample(**{suffix: IMAGES[suffix]})

    ours = decoded_by_ours(sample, spec)[suffix]

    assert_same(ours, decoded_by_webdataset(sample, spec)[suffix])


JPEG_CASES = [
    pytest.param(width, height, mode, save, id=f"{width}x{height}-{mode}-{label}")
    for width, height in [(256, 256), (257, 131), (1, 1), (17, 9), (33, 500)]
    for mode in ["RGB", "L"]
    for label, save in [
        ("420", {"subsampling": 2}),
        ("422", {"subsampling": 1}),
        ("444", {"subsampling": 0}),
        ("progressive", {"progressive": True}),
        ("q50-optimized", {"quality": 50, "optimize": True}),
    ]
]


@pytest.mark.skipif(images.simplejpeg is None, reason="simplejpeg is not installed")
@pytest.mark.parametrize(("width", "height", "mode", "save"), JPEG_CASES)
@pytest.mark.parametrize("spec", ["rgb8", "rgba8", "l8", "torchrgb8", "torchrgb", "l"])
def test_simplejpeg_fast_path_gives_exactly_webdatasets_pixels(width, height, mode, save, spec):
    data = make_jpeg(width, height, mode, **save)
    assert images._jpeg_pixels(data, IMAGE_SPECS[spec][2]) is not None  # the fast path is taken

    assert_same(decode_image(data, spec), decoded_by_webdataset(make_sample(jpg=data), spec)["jpg"])


@pytest.mark.skipif(images.simplejpeg is None, reason="simplejpeg is not installed")
@settings(max_examples=40, deadline=None)
@given(
    width=st.integers(1, 300),
    height=st.integers(1, 300),
    quality=st.integers(10, 100),
    subsampling=st.sampled_from([0, 1, 2]),
    progressive=st.booleans(),
    gray=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_simplejpeg_equals_pillow_for_any_jpeg(width, height, quality, subsampling, progressive, gray, seed):
    mode = "L" if gray else "RGB"
    data = make_jpeg(width, height, mode, seed, quality=quality, subsampling=subsampling, progressive=progressive)

    for spec in ("rgb8", "l8"):
        assert_same(decode_image(data, spec), decoded_by_webdataset(make_sample(jpg=data), spec)["jpg"])


def test_cmyk_jpeg_is_left_to_pillow_and_equals_webdataset():
    data = make_jpeg(40, 30, mode="CMYK")
    assert images._jpeg_pixels(data, "RGB") is None

    for spec in ("rgb8", "torchrgb", "l8"):
        assert_same(decode_image(data, spec), decoded_by_webdataset(make_sample(jpg=data), spec)["jpg"])


def test_images_decode_with_pillow_alone_when_simplejpeg_is_missing(monkeypatch):
    monkeypatch.setattr(images, "simplejpeg", None)
    data = make_jpeg(257, 131)

    for spec in ("rgb8", "torchrgb8", "torchl"):
        assert_same(decode_image(data, spec), decoded_by_webdataset(make_sample(jpg=data), spec)["jpg"])


def test_torch_uint8_image_is_a_channels_first_view_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns on non-writable numpy arrays
        from_jpeg = decode_image(make_jpeg(30, 20), "torchrgb8")
        from_png = decode_image(IMAGES["png"], "torchrgba8")

    for tensor, channels in ((from_jpeg, 3), (from_png, 4)):
        assert tensor.dtype == torch.uint8 and tensor.shape[0] == channels
        assert not tensor.is_contiguous()
        assert tensor.permute(1, 2, 0).is_contiguous()  # an HWC buffer seen channels-first


def test_float_images_are_float32_in_unit_range():
    image = decode_image(make_jpeg(), "torchrgb")

    assert image.dtype == torch.float32 and image.shape == (3, 48, 64) and image.is_contiguous()
    assert 0.0 <= image.min() and image.max() <= 1.0


def test_numpy_uint8_images_are_writable():
    for data in (make_jpeg(), IMAGES["png"]):
        decode_image(data, "rgb8")[0, 0, 0] = 7


def test_unknown_image_spec_is_refused_when_the_pipe_is_built():
    with pytest.raises(ValueError, match="unknown decode spec 'rgb16'"):
        Decoder(IterableWrapper([]), "rgb16")


def test_images_stay_bytes_without_an_image_spec():
    sample = make_sample(jpg=IMAGES["jpg"])

    assert decoded_by_ours(sample)["jpg"] == IMAGES["jpg"] == decoded_by_webdataset(sample)["jpg"]


# ---------------------------------------------------------------- basic types


def _npy(array: np.ndarray) -> bytes:
    stream = io.BytesIO()
    np.save(stream, array)
    return stream.getvalue()


def _npz(**arrays: np.ndarray) -> bytes:
    stream = io.BytesIO()
    np.savez(stream, **arrays)
    return stream.getvalue()


def _pth(value) -> bytes:
    stream = io.BytesIO()
    torch.save(value, stream)
    return stream.getvalue()


BASIC_FIELDS = {
    "txt": "héllo wörld".encode(),
    "text": b"plain",
    "transcript": b"said this",
    "cls": b"7",
    "cls2": b" 12\n",
    "index": b"3",
    "inx": b"4",
    "id": b"123456789",
    "json": json.dumps({"a": [1, 2.5, None], "b": "c"}).encode(),
    "jsn": b"[1, 2]",
    "npy": _npy(np.arange(12, dtype=np.float64).reshape(3, 4)),
    "npz": _npz(x=np.arange(3), y=np.ones((2, 2), np.float32)),
    "pth": _pth({"w": torch.arange(6).reshape(2, 3), "n": 3}),
    "mp": msgpack.packb({"a": [1, 2], "s": "t"}),
    "msg": msgpack.packb([1, "two", 3.0]),
    "json.gz": gzip.compress(b'{"zipped": true}'),
    "txt.gz": gzip.compress(b"zipped text"),
    "meta.json": b'{"deep": 1}',
    "left.cls": b"5",
    "bin": b"\x00\x01raw",
    "gz": gzip.compress(b"just gunzipped"),
}


@pytest.mark.parametrize("suffix", sorted(BASIC_FIELDS))
def test_each_basic_suffix_equals_webdataset(suffix):
    sample = make_sample(**{suffix: BASIC_FIELDS[suffix]})

    assert_same(decoded_by_ours(sample)[suffix], decoded_by_webdataset(sample)[suffix])


@pytest.mark.parametrize(
    ("suffix", "data", "expected"),
    [
        ("class", b"7", 7),
        ("count", b"42", 42),
        ("msgpack", msgpack.packb({"k": [1, 2]}), {"k": [1, 2]}),
    ],
)
def test_fields_webdataset_leaves_as_bytes_are_decoded(suffix, data, expected):
    sample = make_sample(**{suffix: data})

    assert decoded_by_ours(sample)[suffix] == expected
    assert decoded_by_webdataset(sample)[suffix] == data  # webdataset 1.0.2 returns the raw bytes


def test_tenbin_fields_are_decoded_with_webdatasets_tenbin():
    from webdataset import tenbin

    arrays = [np.arange(6, dtype=np.int16).reshape(2, 3), np.ones(4, np.float32)]
    sample = make_sample(tenbin=tenbin.encode_buffer(arrays), ten=tenbin.encode_buffer(arrays))

    decoded = decoded_by_ours(sample)

    for suffix in ("tenbin", "ten"):
        assert all(np.array_equal(a, b) for a, b in zip(decoded[suffix], arrays, strict=True))


def test_cbor_fields_are_decoded_with_cbor2():
    cbor2 = pytest.importorskip("cbor2")

    assert decoded_by_ours(make_sample(cbor=cbor2.dumps({"a": [1, b"x"]})))["cbor"] == {"a": [1, b"x"]}


@pytest.mark.parametrize(("suffix", "module"), [("msgpack", "msgpack"), ("mp", "msgpack"), ("cbor", "cbor2")])
def test_missing_optional_module_gives_a_clear_error(monkeypatch, suffix, module):
    monkeypatch.setitem(__import__("sys").modules, module, None)  # makes `import module` fail

    with pytest.raises(DecodeError, match=f"pip install {module}"):
        decoded_by_ours(make_sample(**{suffix: b"\x80"}))


def test_unknown_suffix_stays_bytes():
    sample = make_sample(xyz=b"\x00data", **{"weird.ext": b"abc"})

    assert decoded_by_ours(sample) == sample


def test_last_dot_part_of_the_suffix_chooses_the_decoder():
    sample = make_sample(**{"a.b.txt": b"t", "seg.png": IMAGES["png"], "txt.bin": b"stays"})

    decoded = decoded_by_ours(sample, "rgba8")

    assert decoded["a.b.txt"] == "t" and decoded["txt.bin"] == b"stays"
    assert_same(decoded["seg.png"], decoded_by_webdataset(sample, "rgba8")["seg.png"])


def test_gz_member_is_gunzipped_then_decoded_by_the_remaining_suffix():
    sample = make_sample(
        **{
            "json.gz": gzip.compress(b'{"a": 1}'),
            "jpg.gz": gzip.compress(IMAGES["jpg"]),
            "cls.gz.gz": gzip.compress(gzip.compress(b"9")),
        }
    )

    decoded = decoded_by_ours(sample, "rgb8")

    assert decoded["json.gz"] == {"a": 1} and decoded["cls.gz.gz"] == 9
    assert_same(decoded["jpg.gz"], decode_image(IMAGES["jpg"], "rgb8"))


def test_npy_object_arrays_need_allow_pickle():
    data = _npy(np.array([{"a": 1}, None], dtype=object))

    with pytest.raises(DecodeError, match="allow_pickle"):
        decoded_by_ours(make_sample(npy=data))
    assert decoded_by_ours(make_sample(npy=data), allow_pickle=True)["npy"][0] == {"a": 1}


# ---------------------------------------------------------------- pickle


@pytest.mark.parametrize("suffix", ["pyd", "pickle", "pkl"])
def test_pickle_is_refused_by_default_and_says_how_to_allow_it(suffix):
    sample = make_sample(**{suffix: pickle.dumps({"x": 1})})

    with pytest.raises(DecodeError, match="allow_pickle=True"):
        decoded_by_ours(sample)


@pytest.mark.parametrize("suffix", ["pyd", "pickle", "pkl"])
def test_pickle_is_decoded_with_allow_pickle(suffix):
    sample = make_sample(**{suffix: pickle.dumps({"x": [1, 2]})})

    assert_same(decoded_by_ours(sample, allow_pickle=True)[suffix], decoded_by_webdataset(sample)[suffix])


class _Opaque:
    def __eq__(self, other):
        return isinstance(other, _Opaque)


def test_pth_loads_weights_only_unless_allow_pickle():
    sample = make_sample(pth=_pth(_Opaque()))

    with pytest.raises(DecodeError, match="field 'pth'"):
        decoded_by_ours(sample)
    assert decoded_by_ours(sample, allow_pickle=True)["pth"] == _Opaque()


# ---------------------------------------------------------------- choosing fields and handlers


@pytest.mark.parametrize("only", ["cls", "cls json", "cls,json", "cls, json", ["cls", "json"]])
def test_only_decodes_the_named_fields(only):
    sample = make_sample(cls=b"1", json=b"[2]", txt=b"three")
    names = {"cls", "json"} if "json" in only else {"cls"}

    decoded = decoded_by_ours(sample, only=only)

    assert decoded == {**sample, "cls": 1, **({"json": [2]} if "json" in names else {})}


def _reversed(data: bytes) -> bytes:
    return data[::-1]


def test_dict_handler_by_exact_suffix():
    decoded = decoded_by_ours(make_sample(txt=b"abc", cls=b"1"), {"txt": upper_text})

    assert decoded["txt"] == "ABC" and decoded["cls"] == 1


def test_dict_handler_plain_name_matches_the_last_dot_parts():
    sample = make_sample(**{"seg.png": b"png1", "mask.seg.png": b"png2", "png": b"png3", "xpng": b"no"})

    decoded = decoded_by_ours(sample, {"seg.png": _reversed})

    assert decoded["seg.png"] == b"1gnp" and decoded["mask.seg.png"] == b"2gnp"
    assert decoded["png"] == b"png3" and decoded["xpng"] == b"no"


def test_dict_handler_by_glob_pattern():
    sample = make_sample(**{"seg.png": b"ab", "depth.png": b"cd", "seg.txt": b"ef", "txt": b"gh"})

    decoded = decoded_by_ours(sample, {"seg.*": _reversed, "*.png": upper_text})

    assert decoded == {**sample, "seg.png": b"ba", "depth.png": "CD", "seg.txt": b"fe", "txt": "gh"}


def _claims_cls(suffix: str, data: bytes):
    return ("mine", suffix, data) if suffix.endswith("cls") else None


def test_user_callable_comes_before_the_builtins_and_none_passes_on():
    decoded = decoded_by_ours(make_sample(cls=b"1", txt=b"t"), _claims_cls)

    assert decoded["cls"] == ("mine", ".cls", b"1")  # the suffix comes with a dot, as in webdataset
    assert decoded["txt"] == "t"


def test_specs_are_tried_in_the_order_given():
    sample = make_sample(jpg=IMAGES["jpg"])

    assert decoded_by_ours(sample, {"jpg": len}, "rgb8")["jpg"] == len(IMAGES["jpg"])
    assert decoded_by_ours(sample, "rgb8", {"jpg": len})["jpg"].shape == (45, 67, 3)


def test_webdatasets_own_handlers_work_unchanged():
    sample = make_sample(jpg=IMAGES["jpg"], cls=b"3")

    decoded = decoded_by_ours(sample, wds_autodecode.handle_extension("cls", upper_text), wds_autodecode.imagehandler("l8"))

    assert decoded["cls"] == "3"
    assert_same(decoded["jpg"], decoded_by_webdataset(sample, "l8")["jpg"])


def test_metadata_and_already_decoded_values_pass_through():
    sample = {"__key__": "k", "__url__": URL, "__local_path__": "/x", "cls": 3, "txt": b"t"}

    assert decoded_by_ours(sample) == {**sample, "txt": "t"}


def test_memoryview_fields_are_decoded_like_bytes():
    decoded = SampleDecoder()(make_sample(json=memoryview(b"[1]"), cls=bytearray(b"2")))

    assert decoded == {**make_sample(), "json": [1], "cls": 2}


def test_sample_decoder_works_without_a_pipe_and_leaves_its_input_alone():
    sample = make_sample(cls=b"5", jpg=IMAGES["jpg"])
    original = dict(sample)

    decoded = SampleDecoder("torchrgb8")(sample)

    assert sample == original and decoded["cls"] == 5 and decoded["jpg"].shape == (3, 45, 67)
