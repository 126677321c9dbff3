"""decode_batches: the same batches as decode().batch_samples(), images decoded into the batch."""

from __future__ import annotations

import io
import pickle
import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data.datapipes.iter import IterableWrapper

import wds_datapipes as wd
from wds_datapipes.errors import DecodeError


def _jpeg(seed: int, size: tuple[int, int] = (40, 24), mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(seed)
    shape = (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0])
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(out, format="JPEG", quality=85)
    return out.getvalue()


def _png(seed: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (24, 40, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def _samples(n: int, image=_jpeg) -> list[dict]:
    return [{"__key__": f"k{i}", "__url__": "mem.tar", "jpg": image(i), "cls": str(i % 7).encode(),
             "txt": f"t{i}".encode()} for i in range(n)]


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("spec", ["torchrgb8", "rgb8", "torchrgba8", "torchrgb", "l8", "pil"])
@pytest.mark.parametrize("threads", [0, 2])
def test_decode_batches_equals_decode_then_batch_samples(spec: str, threads: int) -> None:
    samples = _samples(23)
    expected = list(IterableWrapper(samples).decode(spec).batch_samples(8))
    got = list(IterableWrapper(samples).decode_batches(spec, batch_size=8, num_threads=threads))
    assert [len(b["__key__"]) for b in got] == [8, 8, 7]
    assert _equal(got, expected)


def test_decode_batches_gives_channels_last_uint8_images() -> None:
    (batch,) = IterableWrapper(_samples(4)).decode_batches("torchrgb8", batch_size=4)
    assert batch["jpg"].shape == (4, 3, 24, 40)
    assert batch["jpg"].is_contiguous(memory_format=torch.channels_last)


def test_decode_batches_handles_mixed_sizes_and_formats_like_decode() -> None:
    samples = _samples(6)
    samples[2]["jpg"] = _jpeg(99, size=(17, 9))  # another size: no shared rows for this batch
    samples[4]["jpg"] = _jpeg(98, mode="L")  # greyscale JPEG read as RGB
    mislabeled = [{**s, "jpg": _png(i)} if i % 2 else s for i, s in enumerate(_samples(6))]
    for source, formats in ((samples, None), (mislabeled, ["JPEG", "PNG"])):
        expected = list(IterableWrapper(source).decode("torchrgb8", image_formats=formats).batch_samples(3))
        got = list(IterableWrapper(source).decode_batches("torchrgb8", batch_size=3, image_formats=formats))
        assert _equal(got, expected)


def test_decode_batches_refuses_a_png_in_a_jpg_field_unless_formats_are_widened() -> None:
    mislabeled = [{**s, "jpg": _png(i)} if i % 2 else s for i, s in enumerate(_samples(4))]
    with pytest.raises(DecodeError, match="'k1'.*cannot identify image"):
        list(IterableWrapper(mislabeled).decode_batches("torchrgb8", batch_size=2))


def test_decode_batches_drops_partial_batch_when_asked() -> None:
    got = list(IterableWrapper(_samples(10)).decode_batches("torchrgb8", batch_size=4, partial=False))
    assert [b["__key__"] for b in got] == [["k0", "k1", "k2", "k3"], ["k4", "k5", "k6", "k7"]]


@pytest.mark.parametrize("threads", [0, 2])
def test_decode_batches_corrupt_jpeg_raises_decode_error_naming_sample(threads: int) -> None:
    samples = _samples(5)
    samples[3]["jpg"] = samples[3]["jpg"][:40]
    with pytest.raises(DecodeError) as info:
        list(IterableWrapper(samples).decode_batches("torchrgb8", batch_size=5, num_threads=threads))
    assert info.value.key == "k3" and info.value.field == "jpg" and info.value.url == "mem.tar"


@pytest.mark.parametrize("threads", [0, 2])
def test_decode_batches_skips_bad_sample_with_warning_and_keeps_the_rest(threads: int) -> None:
    samples = _samples(6)
    samples[1]["jpg"] = b"\xff\xd8 not a jpeg"
    samples[4]["cls"] = b"four"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = list(IterableWrapper(samples).decode_batches("torchrgb8", batch_size=6, num_threads=threads,
                                                            handler=wd.warn_and_continue))
    assert [b["__key__"] for b in got] == [["k0", "k2", "k3", "k5"]]
    good = [s for i, s in enumerate(samples) if i not in (1, 4)]
    (expected,) = IterableWrapper(good).decode("torchrgb8").batch_samples(6)
    assert _equal(got[0], expected)
    messages = " ".join(str(w.message) for w in caught)
    assert "'k1'" in messages and "'k4'" in messages and "mem.tar" in messages


def test_decode_batches_reads_jpeg_that_only_pillow_accepts() -> None:
    # A stray restart marker mid-scan: simplejpeg (strict) refuses it, Pillow decodes it.
    samples = _samples(3)
    whole = samples[1]["jpg"]
    samples[1]["jpg"] = whole[: len(whole) // 2] + b"\xff\xd0" + whole[len(whole) // 2 :]
    expected = list(IterableWrapper(samples).decode("torchrgb8").batch_samples(3))
    got = list(IterableWrapper(samples).decode_batches("torchrgb8", batch_size=3))
    assert _equal(got, expected)
    assert got[0]["jpg"].shape == (3, 3, 24, 40)


def test_decode_batches_pipe_pickles_and_rejects_bad_arguments() -> None:
    dp = IterableWrapper(_samples(3)).decode_batches("torchrgb8", batch_size=2, num_threads=2)
    clone = pickle.loads(pickle.dumps(dp))
    assert _equal(list(clone), list(dp))
    with pytest.raises(ValueError):
        IterableWrapper([]).decode_batches("torchrgb8", batch_size=0)
    with pytest.raises(ValueError):
        IterableWrapper([]).decode_batches("torchrgb8", batch_size=2, num_threads=-1)


@pytest.mark.parametrize(("threads", "pulled_for_first_batch"), [(0, 8), (2, 16)])
def test_decode_batches_decodes_ahead_only_with_threads(threads: int, pulled_for_first_batch: int) -> None:
    # Inline decoding gains nothing from starting the next batch early: it would only hand
    # out every batch a batch later (a loader worker's first batch took twice as long).
    pulled = []
    source = IterableWrapper(_samples(24)).map(lambda s: pulled.append(s["__key__"]) or s)
    batches = iter(source.decode_batches("torchrgb8", batch_size=8, num_threads=threads))
    first = next(batches)
    assert list(first["__key__"]) == [f"k{i}" for i in range(8)]
    assert len(pulled) == pulled_for_first_batch
    assert [list(b["__key__"]) for b in batches] == [[f"k{i}" for i in range(j, j + 8)] for j in (8, 16)]
