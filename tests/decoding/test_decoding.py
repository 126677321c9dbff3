"""Decoding of sample fields: values must equal webdataset 1.0.2's decoder, fields and errors."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import threading
import warnings

import msgpack
import numpy as np
import PIL.Image
import PIL.ImageFile
import pytest
import torch
import webdataset.autodecode as wds_autodecode
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data.datapipes.iter import IterableWrapper

from wds_datapipes.decoding import images
from wds_datapipes.decoding.decoder import Decoder, SampleDecoder
from wds_datapipes.decoding.images import IMAGE_SPECS, decode_image
from wds_datapipes.errors import DecodeError
from wds_datapipes.handlers import warn_and_continue

URL = "file:///data/shard-000017.tar"


# ---------------------------------------------------------------- building data


def _pixels(width: int, height: int, seed: int = 0) -> np.ndarray:
    """Gradients plus noise: real chroma detail, so subsampling and upsampling matter."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) * 7 % 256], -1)
    noise = np.random.default_rng(seed).integers(-40, 40, base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def _encode(width: int, height: int, mode: str = "RGB", fmt: str = "JPEG", seed: int = 0, **save) -> bytes:
    image = PIL.Image.fromarray(_pixels(width, height, seed)).convert(mode)
    stream = io.BytesIO()
    # Pillow's guess of the buffer a progressive JPEG needs (2 bytes a pixel at quality >= 95) is
    # too small for noise at quality 100 ("broken data stream when writing image file").
    saved, PIL.ImageFile.MAXBLOCK = PIL.ImageFile.MAXBLOCK, max(PIL.ImageFile.MAXBLOCK, 4 * width * height)
    try:
        image.save(stream, fmt, **save)
    finally:
        PIL.ImageFile.MAXBLOCK = saved
    return stream.getvalue()


def _jpeg(width: int = 64, height: int = 48, mode: str = "RGB", seed: int = 0, **save) -> bytes:
    return _encode(width, height, mode, "JPEG", seed, **{"quality": 90, **save})


def _sample(key: str = "sample-0", **fields: bytes) -> dict:
    return {"__key__": key, "__url__": URL, **fields}


def _ours(sample: dict, *specs, **options) -> dict:
    (decoded,) = list(Decoder(IterableWrapper([sample]), *specs, **options))
    return decoded


def _webdatasets(sample: dict, *specs: str) -> dict:
    handlers = [wds_autodecode.imagehandler(spec) for spec in specs]
    return wds_autodecode.Decoder(handlers).decode(sample)


def _assert_same(ours, theirs) -> None:
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
            _assert_same(ours[key], theirs[key])
    else:
        assert ours == theirs


IMAGES = {
    "jpg": _jpeg(67, 45),
    "jpeg": _jpeg(16, 16, mode="L"),
    "png": _encode(33, 21, "RGBA", "PNG"),
    "seg.png": _encode(20, 10, "P", "PNG"),
    "ppm": _encode(9, 7, "RGB", "PPM"),
    "webp": _encode(12, 12, "RGB", "WEBP", lossless=True),
    "tiff": _encode(10, 5, "L", "TIFF"),
}


# ---------------------------------------------------------------- images


@pytest.mark.parametrize("spec", sorted(IMAGE_SPECS))
@pytest.mark.parametrize("suffix", sorted(IMAGES))
def test_each_image_spec_equals_webdataset(spec, suffix):
    sample = _sample(**{suffix: IMAGES[suffix]})

    ours = _ours(sample, spec)[suffix]

    _assert_same(ours, _webdatasets(sample, spec)[suffix])


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
    data = _jpeg(width, height, mode, **save)
    assert images._jpeg_pixels(data, IMAGE_SPECS[spec][2]) is not None  # the fast path is taken

    _assert_same(decode_image(data, spec), _webdatasets(_sample(jpg=data), spec)["jpg"])


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
    data = _jpeg(width, height, mode, seed, quality=quality, subsampling=subsampling, progressive=progressive)

    for spec in ("rgb8", "l8"):
        _assert_same(decode_image(data, spec), _webdatasets(_sample(jpg=data), spec)["jpg"])


def test_cmyk_jpeg_is_left_to_pillow_and_equals_webdataset():
    data = _jpeg(40, 30, mode="CMYK")
    assert images._jpeg_pixels(data, "RGB") is None

    for spec in ("rgb8", "torchrgb", "l8"):
        _assert_same(decode_image(data, spec), _webdatasets(_sample(jpg=data), spec)["jpg"])


def test_images_decode_with_pillow_alone_when_simplejpeg_is_missing(monkeypatch):
    monkeypatch.setattr(images, "simplejpeg", None)
    data = _jpeg(257, 131)

    for spec in ("rgb8", "torchrgb8", "torchl"):
        _assert_same(decode_image(data, spec), _webdatasets(_sample(jpg=data), spec)["jpg"])


def test_torch_uint8_image_is_a_channels_first_view_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns on non-writable numpy arrays
        from_jpeg = decode_image(_jpeg(30, 20), "torchrgb8")
        from_png = decode_image(IMAGES["png"], "torchrgba8")

    for tensor, channels in ((from_jpeg, 3), (from_png, 4)):
        assert tensor.dtype == torch.uint8 and tensor.shape[0] == channels
        assert not tensor.is_contiguous()
        assert tensor.permute(1, 2, 0).is_contiguous()  # an HWC buffer seen channels-first


def test_float_images_are_float32_in_unit_range():
    image = decode_image(_jpeg(), "torchrgb")

    assert image.dtype == torch.float32 and image.shape == (3, 48, 64) and image.is_contiguous()
    assert 0.0 <= image.min() and image.max() <= 1.0


def test_numpy_uint8_images_are_writable():
    for data in (_jpeg(), IMAGES["png"]):
        decode_image(data, "rgb8")[0, 0, 0] = 7


def test_unknown_image_spec_is_refused_when_the_pipe_is_built():
    with pytest.raises(ValueError, match="unknown decode spec 'rgb16'"):
        Decoder(IterableWrapper([]), "rgb16")


def test_images_stay_bytes_without_an_image_spec():
    sample = _sample(jpg=IMAGES["jpg"])

    assert _ours(sample)["jpg"] == IMAGES["jpg"] == _webdatasets(sample)["jpg"]


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
    sample = _sample(**{suffix: BASIC_FIELDS[suffix]})

    _assert_same(_ours(sample)[suffix], _webdatasets(sample)[suffix])


@pytest.mark.parametrize(
    ("suffix", "data", "expected"),
    [
        ("class", b"7", 7),
        ("count", b"42", 42),
        ("msgpack", msgpack.packb({"k": [1, 2]}), {"k": [1, 2]}),
    ],
)
def test_fields_webdataset_leaves_as_bytes_are_decoded(suffix, data, expected):
    sample = _sample(**{suffix: data})

    assert _ours(sample)[suffix] == expected
    assert _webdatasets(sample)[suffix] == data  # webdataset 1.0.2 returns the raw bytes


def test_tenbin_fields_are_decoded_with_webdatasets_tenbin():
    from webdataset import tenbin

    arrays = [np.arange(6, dtype=np.int16).reshape(2, 3), np.ones(4, np.float32)]
    sample = _sample(tenbin=tenbin.encode_buffer(arrays), ten=tenbin.encode_buffer(arrays))

    decoded = _ours(sample)

    for suffix in ("tenbin", "ten"):
        assert all(np.array_equal(a, b) for a, b in zip(decoded[suffix], arrays, strict=True))


def test_cbor_fields_are_decoded_with_cbor2():
    cbor2 = pytest.importorskip("cbor2")

    assert _ours(_sample(cbor=cbor2.dumps({"a": [1, b"x"]})))["cbor"] == {"a": [1, b"x"]}


@pytest.mark.parametrize(("suffix", "module"), [("msgpack", "msgpack"), ("mp", "msgpack"), ("cbor", "cbor2")])
def test_missing_optional_module_gives_a_clear_error(monkeypatch, suffix, module):
    monkeypatch.setitem(__import__("sys").modules, module, None)  # makes `import module` fail

    with pytest.raises(DecodeError, match=f"pip install {module}"):
        _ours(_sample(**{suffix: b"\x80"}))


def test_unknown_suffix_stays_bytes():
    sample = _sample(xyz=b"\x00data", **{"weird.ext": b"abc"})

    assert _ours(sample) == sample


def test_last_dot_part_of_the_suffix_chooses_the_decoder():
    sample = _sample(**{"a.b.txt": b"t", "seg.png": IMAGES["png"], "txt.bin": b"stays"})

    decoded = _ours(sample, "rgba8")

    assert decoded["a.b.txt"] == "t" and decoded["txt.bin"] == b"stays"
    _assert_same(decoded["seg.png"], _webdatasets(sample, "rgba8")["seg.png"])


def test_gz_member_is_gunzipped_then_decoded_by_the_remaining_suffix():
    sample = _sample(
        **{
            "json.gz": gzip.compress(b'{"a": 1}'),
            "jpg.gz": gzip.compress(IMAGES["jpg"]),
            "cls.gz.gz": gzip.compress(gzip.compress(b"9")),
        }
    )

    decoded = _ours(sample, "rgb8")

    assert decoded["json.gz"] == {"a": 1} and decoded["cls.gz.gz"] == 9
    _assert_same(decoded["jpg.gz"], decode_image(IMAGES["jpg"], "rgb8"))


def test_npy_object_arrays_need_allow_pickle():
    data = _npy(np.array([{"a": 1}, None], dtype=object))

    with pytest.raises(DecodeError, match="allow_pickle"):
        _ours(_sample(npy=data))
    assert _ours(_sample(npy=data), allow_pickle=True)["npy"][0] == {"a": 1}


# ---------------------------------------------------------------- pickle


@pytest.mark.parametrize("suffix", ["pyd", "pickle", "pkl"])
def test_pickle_is_refused_by_default_and_says_how_to_allow_it(suffix):
    sample = _sample(**{suffix: pickle.dumps({"x": 1})})

    with pytest.raises(DecodeError, match="allow_pickle=True"):
        _ours(sample)


@pytest.mark.parametrize("suffix", ["pyd", "pickle", "pkl"])
def test_pickle_is_decoded_with_allow_pickle(suffix):
    sample = _sample(**{suffix: pickle.dumps({"x": [1, 2]})})

    _assert_same(_ours(sample, allow_pickle=True)[suffix], _webdatasets(sample)[suffix])


class _Opaque:
    def __eq__(self, other):
        return isinstance(other, _Opaque)


def test_pth_loads_weights_only_unless_allow_pickle():
    sample = _sample(pth=_pth(_Opaque()))

    with pytest.raises(DecodeError, match="field 'pth'"):
        _ours(sample)
    assert _ours(sample, allow_pickle=True)["pth"] == _Opaque()


# ---------------------------------------------------------------- choosing fields and handlers


@pytest.mark.parametrize("only", ["cls", "cls json", "cls,json", "cls, json", ["cls", "json"]])
def test_only_decodes_the_named_fields(only):
    sample = _sample(cls=b"1", json=b"[2]", txt=b"three")
    names = {"cls", "json"} if "json" in only else {"cls"}

    decoded = _ours(sample, only=only)

    assert decoded == {**sample, "cls": 1, **({"json": [2]} if "json" in names else {})}


def _upper(data: bytes) -> str:
    return data.decode().upper()


def _reversed(data: bytes) -> bytes:
    return data[::-1]


def test_dict_handler_by_exact_suffix():
    decoded = _ours(_sample(txt=b"abc", cls=b"1"), {"txt": _upper})

    assert decoded["txt"] == "ABC" and decoded["cls"] == 1


def test_dict_handler_plain_name_matches_the_last_dot_parts():
    sample = _sample(**{"seg.png": b"png1", "mask.seg.png": b"png2", "png": b"png3", "xpng": b"no"})

    decoded = _ours(sample, {"seg.png": _reversed})

    assert decoded["seg.png"] == b"1gnp" and decoded["mask.seg.png"] == b"2gnp"
    assert decoded["png"] == b"png3" and decoded["xpng"] == b"no"


def test_dict_handler_by_glob_pattern():
    sample = _sample(**{"seg.png": b"ab", "depth.png": b"cd", "seg.txt": b"ef", "txt": b"gh"})

    decoded = _ours(sample, {"seg.*": _reversed, "*.png": _upper})

    assert decoded == {**sample, "seg.png": b"ba", "depth.png": "CD", "seg.txt": b"fe", "txt": "gh"}


def _claims_cls(suffix: str, data: bytes):
    return ("mine", suffix, data) if suffix.endswith("cls") else None


def test_user_callable_comes_before_the_builtins_and_none_passes_on():
    decoded = _ours(_sample(cls=b"1", txt=b"t"), _claims_cls)

    assert decoded["cls"] == ("mine", ".cls", b"1")  # the suffix comes with a dot, as in webdataset
    assert decoded["txt"] == "t"


def test_specs_are_tried_in_the_order_given():
    sample = _sample(jpg=IMAGES["jpg"])

    assert _ours(sample, {"jpg": len}, "rgb8")["jpg"] == len(IMAGES["jpg"])
    assert _ours(sample, "rgb8", {"jpg": len})["jpg"].shape == (45, 67, 3)


def test_webdatasets_own_handlers_work_unchanged():
    sample = _sample(jpg=IMAGES["jpg"], cls=b"3")

    decoded = _ours(sample, wds_autodecode.handle_extension("cls", _upper), wds_autodecode.imagehandler("l8"))

    assert decoded["cls"] == "3"
    _assert_same(decoded["jpg"], _webdatasets(sample, "l8")["jpg"])


def test_metadata_and_already_decoded_values_pass_through():
    sample = {"__key__": "k", "__url__": URL, "__local_path__": "/x", "cls": 3, "txt": b"t"}

    assert _ours(sample) == {**sample, "txt": "t"}


def test_memoryview_fields_are_decoded_like_bytes():
    decoded = SampleDecoder()(_sample(json=memoryview(b"[1]"), cls=bytearray(b"2")))

    assert decoded == {**_sample(), "json": [1], "cls": 2}


def test_sample_decoder_works_without_a_pipe_and_leaves_its_input_alone():
    sample = _sample(cls=b"5", jpg=IMAGES["jpg"])
    original = dict(sample)

    decoded = SampleDecoder("torchrgb8")(sample)

    assert sample == original and decoded["cls"] == 5 and decoded["jpg"].shape == (3, 45, 67)


# ---------------------------------------------------------------- errors


def _with_corrupt_jpeg() -> list[dict]:
    return [
        _sample("good-1", jpg=IMAGES["jpg"], cls=b"1"),
        _sample("bad", jpg=b"\xff\xd8\xff\xe0 not a jpeg", cls=b"2"),
        _sample("good-2", jpg=IMAGES["jpg"], cls=b"3"),
    ]


def test_default_handler_raises_decode_error_naming_url_key_and_field():
    with pytest.raises(DecodeError) as caught:
        list(Decoder(IterableWrapper(_with_corrupt_jpeg()), "rgb8"))

    error = caught.value
    assert (error.url, error.key, error.field) == (URL, "bad", "jpg")
    assert URL in str(error) and "'bad'" in str(error) and "'jpg'" in str(error)
    assert isinstance(error.__cause__, OSError)  # Pillow's own error, chained


@pytest.mark.parametrize("num_threads", [0, 2])
def test_warn_and_continue_skips_the_whole_corrupt_sample_with_a_warning(num_threads):
    pipe = Decoder(
        IterableWrapper(_with_corrupt_jpeg()), "rgb8", handler=warn_and_continue, num_threads=num_threads
    )

    with pytest.warns(UserWarning) as caught:
        decoded = list(pipe)

    assert [sample["__key__"] for sample in decoded] == ["good-1", "good-2"]
    (warning,) = [str(w.message) for w in caught]
    assert URL in warning and "'bad'" in warning and "'jpg'" in warning


def _stop_quietly(exn: BaseException) -> bool:
    return False


def test_a_handler_that_does_not_say_skip_lets_the_error_through():
    with pytest.raises(DecodeError):
        list(Decoder(IterableWrapper(_with_corrupt_jpeg()), "rgb8", handler=_stop_quietly))


# ---------------------------------------------------------------- threads


def _many_samples(count: int = 200) -> list[dict]:
    samples = []
    for index in range(count):
        jpg = _jpeg(20 + index % 50, 10 + index % 37, seed=index)
        if index % 41 == 5:
            jpg = b"broken"
        samples.append(_sample(f"s{index:04d}", jpg=jpg, cls=str(index).encode(), json=b'{"i": %d}' % index))
    return samples


def _skip_quietly(exn: BaseException) -> bool:
    return True


def test_threads_give_the_same_samples_in_the_same_order():
    samples = IterableWrapper(_many_samples())

    inline = list(Decoder(samples, "torchrgb8", handler=_skip_quietly))
    threaded = list(Decoder(samples, "torchrgb8", handler=_skip_quietly, num_threads=2))

    assert len(inline) == 200 - 5
    assert [s["__key__"] for s in threaded] == [s["__key__"] for s in inline]
    for ours, reference in zip(threaded, inline, strict=True):
        _assert_same(ours, reference)


def _decode_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("wds-decode")]


def test_closing_a_threaded_iterator_early_shuts_its_pool_down():
    iterator = iter(Decoder(IterableWrapper(_many_samples(50)), "rgb8", num_threads=3))
    next(iterator)
    assert _decode_threads()

    iterator.close()

    assert not _decode_threads()


def test_threaded_errors_surface_in_input_order():
    pipe = Decoder(IterableWrapper(_many_samples(60)), "rgb8", num_threads=4)
    keys = []

    with pytest.raises(DecodeError) as caught:
        for sample in pipe:
            keys.append(sample["__key__"])

    assert caught.value.key == "s0005" and keys == ["s0000", "s0001", "s0002", "s0003", "s0004"]


# ---------------------------------------------------------------- pipe mechanics


def test_decode_is_the_functional_name():
    pipe = IterableWrapper([_sample(cls=b"1")]).decode("rgb8", only="cls")

    assert isinstance(pipe, Decoder) and list(pipe) == [{**_sample(), "cls": 1}]


def test_pipe_pickles_before_and_after_iterating_with_threads():
    samples = IterableWrapper(_many_samples(20))
    pipe = Decoder(samples, "rgb8", {"*.json": _upper}, handler=_skip_quietly, num_threads=2)
    expected = [sample["__key__"] for sample in pipe]

    clone = pickle.loads(pickle.dumps(pipe))

    assert [sample["__key__"] for sample in clone] == expected
    assert clone.num_threads == 2


def test_pipe_has_no_length():
    with pytest.raises(TypeError):
        len(Decoder(IterableWrapper([_sample()])))


def test_negative_thread_count_is_refused():
    with pytest.raises(ValueError, match="num_threads"):
        Decoder(IterableWrapper([]), num_threads=-1)
