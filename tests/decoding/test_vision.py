"""The vision stage: image bytes of any size to fixed-size crops, equal to torchvision's transforms."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
from builders import write_index
from PIL import Image
from torch.utils.data.datapipes.iter import IterableWrapper

import wds_datapipes as wd
from wds_datapipes.decoding import vision
from wds_datapipes.decoding.vision import (
    TORCHVISION_DEPRECATES_DECODING,
    CenterCrop,
    RandomResizedCrop,
    tensor_decoders,
)

tv = pytest.importorskip("torchvision", reason="torchvision is a dependency; missing only on odd stacks")
T = pytest.importorskip("torchvision.transforms.v2")
F = T.functional


def _photo(seed: int, width: int, height: int, fmt: str = "JPEG", mode: str = "RGB") -> bytes:
    """Smooth noise upsampled: compresses like a photo."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(height // 16, 1), max(width // 16, 1), 3), dtype=np.uint8)
    image = Image.fromarray(small).resize((width, height), Image.BICUBIC).convert(mode)
    out = io.BytesIO()
    image.save(out, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue()


SIZES = [(500, 375), (300, 450), (333, 333), (640, 200), (260, 500), (257, 300)]


def _samples(n: int = 12, fmt: str = "JPEG", suffix: str = "jpg") -> list[dict]:
    return [{"__key__": f"k{i:03d}", "__url__": "mem.tar", suffix: _photo(i, *SIZES[i % len(SIZES)], fmt),
             "cls": str(i % 10).encode()} for i in range(n)]


def _decoded(data: bytes) -> torch.Tensor:
    return tensor_decoders()["JPEG"](torch.frombuffer(bytearray(data), dtype=torch.uint8))


@pytest.mark.parametrize(("fmt", "decode"), [("JPEG", "decode_jpeg"), ("PNG", "decode_png")])
def test_torchcodec_and_torchvision_decode_the_same_pixels(fmt, decode):
    decoders = pytest.importorskip("torchcodec.decoders", reason="TorchCodec is not installed")
    for i, size in enumerate([*SIZES, (17, 9)]):
        data = torch.frombuffer(bytearray(_photo(i, *size, fmt)), dtype=torch.uint8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torchvision >= 0.29 deprecates its own
            expected = getattr(tv.io, decode)(data, mode=tv.io.ImageReadMode.RGB)
        assert torch.equal(getattr(decoders, decode)(data, mode="RGB"), expected)


def test_the_crops_call_no_deprecated_decoder():
    """On torchvision >= 0.29 the crops decode through TorchCodec: no DeprecationWarning."""
    release = tuple(int(p) for p in tv.__version__.split("+")[0].split(".")[:2])
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for fmt, suffix in (("JPEG", "jpg"), ("PNG", "png")):
            batches = list(IterableWrapper(_samples(4, fmt, suffix)).decode_batches(
                "torchrgb8", batch_size=4, transform=CenterCrop(32, 40)))
            assert batches[0][suffix].shape == (4, 3, 32, 32)
    uses = tensor_decoders()["JPEG"].func.__module__
    assert ("torchcodec" in uses) == (release >= TORCHVISION_DEPRECATES_DECODING)


@pytest.mark.parametrize("threads", [0, 2])
def test_center_crop_equals_torchvisions_resize_and_center_crop(threads):
    samples = _samples()
    batches = list(IterableWrapper(samples).decode_batches("torchrgb8", batch_size=5, num_threads=threads,
                                                            transform=CenterCrop(224, 256)))
    assert [b["jpg"].shape for b in batches] == [(5, 3, 224, 224), (5, 3, 224, 224), (2, 3, 224, 224)]
    assert all(b["jpg"].is_contiguous() and b["jpg"].dtype == torch.uint8 for b in batches)
    reference = T.Compose([T.Resize(256, antialias=True), T.CenterCrop(224)])
    images = torch.cat([b["jpg"] for b in batches])
    for sample, image in zip(samples, images):
        assert torch.equal(image, reference(_decoded(sample["jpg"])))
    assert torch.cat([b["cls"] for b in batches]).tolist() == [i % 10 for i in range(12)]


def test_random_resized_crop_equals_torchvisions_with_the_same_draws():
    transform = RandomResizedCrop(224, seed=5)
    samples = _samples()
    (batch,) = IterableWrapper(samples).decode_batches("torchrgb8", batch_size=12, num_threads=2,
                                                       transform=transform)
    flips = 0
    for sample, image in zip(samples, batch["jpg"]):
        decoded = _decoded(sample["jpg"])
        crop = transform.crop(decoded.shape[1], decoded.shape[2], sample["__key__"], epoch=0)
        expected = F.resized_crop(decoded, *crop.box, [224, 224], antialias=True)
        if crop.flip:
            expected = F.horizontal_flip(expected)
            flips += 1
        assert torch.equal(image, expected)
    assert 0 < flips < 12


def test_random_draws_follow_torchvisions_distribution():
    transform = RandomResizedCrop(224, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), seed=1)
    ours = np.array([transform.crop(400, 600, f"k{i}", 0).box for i in range(4000)])
    torch.manual_seed(0)
    image = torch.zeros(3, 400, 600, dtype=torch.uint8)
    theirs = np.array([T.RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(4000)])
    for boxes in (ours, theirs):
        assert (boxes[:, 0] >= 0).all() and (boxes[:, 0] + boxes[:, 2] <= 400).all()
        assert (boxes[:, 1] + boxes[:, 3] <= 600).all()
    area = [b[:, 2] * b[:, 3] / (400 * 600) for b in (ours, theirs)]
    aspect = [b[:, 3] / b[:, 2] for b in (ours, theirs)]
    assert abs(area[0].mean() - area[1].mean()) < 0.02 and abs(np.median(area[0]) - np.median(area[1])) < 0.03
    assert abs(aspect[0].mean() - aspect[1].mean()) < 0.02
    assert 0.45 < np.mean([transform.crop(400, 600, f"k{i}", 0).flip for i in range(2000)]) < 0.55


def test_random_crops_change_every_epoch_repeat_with_the_seed_and_ignore_threads():
    samples = _samples(8)

    def crops(epoch: int, seed: int = 3, threads: int = 0) -> torch.Tensor:
        dp = IterableWrapper(samples).decode_batches("torchrgb8", batch_size=8, num_threads=threads,
                                                     transform=RandomResizedCrop(96, seed=seed))
        dp.set_epoch(epoch)
        return next(iter(dp))["jpg"]

    assert torch.equal(crops(0), crops(0, threads=2))
    assert not torch.equal(crops(0), crops(1))
    assert not torch.equal(crops(0), crops(0, seed=4))


def test_pngs_and_greyscale_jpegs_take_the_same_path():
    samples = _samples(4, fmt="PNG", suffix="png") + [
        {"__key__": "g", "__url__": "m.tar", "png": _photo(9, 300, 200, "PNG", mode="L"), "cls": b"1"}]
    (batch,) = IterableWrapper(samples).decode_batches("torchrgb8", batch_size=5, transform=CenterCrop(64, 80))
    assert batch["png"].shape == (5, 3, 64, 64)
    reference = T.Compose([T.Resize(80, antialias=True), T.CenterCrop(64)])
    decoded = tensor_decoders()["PNG"](torch.frombuffer(bytearray(samples[0]["png"]), dtype=torch.uint8))
    assert torch.equal(batch["png"][0], reference(decoded))


def test_a_corrupt_image_goes_to_the_handler_and_leaves_its_batch_smaller():
    samples = _samples(6)
    samples[2]["jpg"] = samples[2]["jpg"][:100]
    with pytest.raises(wd.DecodeError, match="'k002'.*'jpg'"):
        list(IterableWrapper(samples).decode_batches("torchrgb8", batch_size=3, transform=CenterCrop(32, 40)))
    batches = list(IterableWrapper(samples).decode_batches("torchrgb8", batch_size=3, num_threads=2,
                                                            transform=CenterCrop(32, 40),
                                                            handler=wd.ignore_and_continue))
    assert [b["__key__"] for b in batches] == [["k000", "k001"], ["k003", "k004", "k005"]]
    assert batches[0]["jpg"].shape == (2, 3, 32, 32)


def test_a_transform_needs_the_torchrgb8_spec():
    with pytest.raises(ValueError, match="torchrgb8"):
        IterableWrapper([]).decode_batches("rgb8", batch_size=2, transform=CenterCrop(32, 40))


def test_without_torchvision_pillow_crops_to_the_same_size(monkeypatch):
    samples = _samples(4)
    reference = T.Compose([T.Resize(80, antialias=True), T.CenterCrop(64)])(_decoded(samples[0]["jpg"]))
    monkeypatch.setattr(vision, "torchvision_parts", lambda: None)
    (batch,) = IterableWrapper(samples).decode_batches("torchrgb8", batch_size=4, transform=CenterCrop(64, 80))
    assert batch["jpg"].shape == (4, 3, 64, 64)
    assert (batch["jpg"][0].float() - reference.float()).abs().mean() < 3  # close, not equal


def test_mixed_sizes_without_a_transform_decode_in_the_threads_like_decode():
    samples = _samples(7)
    expected = list(IterableWrapper(samples).decode("torchrgb8").batch_samples(7))
    got = list(IterableWrapper(samples).decode_batches("torchrgb8", batch_size=7, num_threads=2))
    assert [torch.equal(a, b) for a, b in zip(got[0]["jpg"], expected[0]["jpg"])] == [True] * 7


def test_a_resumed_exact_epoch_crops_exactly_as_the_stopped_one(tmp_path):
    import webdataset as wds

    shards = []
    for s in range(3):
        path = str(tmp_path / f"p-{s}.tar")
        with wds.TarWriter(path) as writer:
            for i in range(10 + 3 * s):
                writer.write({"__key__": f"p{s}-{i:03d}", "jpg": _photo(s * 50 + i, *SIZES[i % len(SIZES)]),
                              "cls": str(i % 10)})
        shards.append(path)
    index = write_index(shards, tmp_path / "index.json")

    def pipeline():
        return (wd.ExactEpochs(index, batch_size=4, seed=2)
                .decode_batches("torchrgb8", batch_size=4, num_threads=2, transform=RandomResizedCrop(48, seed=7)))

    whole = pipeline()
    epochs = [[b["jpg"] for b in whole] for _ in range(2)]
    stopped = pipeline()
    iterator = iter(stopped)
    for _ in range(3):
        next(iterator)
    resumed = pipeline()
    resumed.load_state_dict(stopped.state_dict())
    rest = [b["jpg"] for b in resumed] + [b["jpg"] for b in resumed]
    assert len(rest) == len(epochs[0]) - 3 + len(epochs[1])
    assert all(torch.equal(a, b) for a, b in zip(rest, epochs[0][3:] + epochs[1]))


def test_an_image_over_the_pixel_limit_is_refused_before_it_is_decoded():
    samples = _samples(2)
    dp = IterableWrapper(samples).decode_batches("torchrgb8", batch_size=2, transform=CenterCrop(32, 40),
                                                 limits=wd.Limits(max_image_pixels=300 * 300))
    with pytest.raises(wd.DecodeError, match="pixels"):
        list(dp)


def _on(device: str, samples: list[dict], threads: int = 0, **kwargs) -> list[dict]:
    return list(IterableWrapper(samples).decode_batches("torchrgb8", batch_size=5, num_threads=threads,
                                                        transform=CenterCrop(64, 80), device=device, **kwargs))


@pytest.mark.parametrize("threads", [0, 2])
def test_crops_decoded_in_one_batch_call_on_a_device_equal_the_per_image_path(threads):
    for samples in (_samples(7), _samples(7, fmt="PNG", suffix="png")):  # JPEGs in one call; PNGs one by one
        suffix = "png" if "png" in samples[0] else "jpg"
        plain = list(IterableWrapper(samples).decode_batches("torchrgb8", batch_size=5, transform=CenterCrop(64, 80)))
        batched = _on("cpu", samples, threads)
        assert [b[suffix].shape for b in batched] == [(5, 3, 64, 64), (2, 3, 64, 64)]
        for a, b in zip(plain, batched, strict=True):
            assert torch.equal(a[suffix], b[suffix]) and torch.equal(a["cls"], b["cls"])


def test_a_corrupt_jpeg_in_a_device_batch_is_that_samples_error():
    samples = _samples(6)
    samples[3]["jpg"] = samples[3]["jpg"][:200]
    with pytest.raises(wd.DecodeError, match="'k003'.*'jpg'"):
        _on("cpu", samples)
    kept = _on("cpu", samples, handler=wd.ignore_and_continue)
    assert [len(b["__key__"]) for b in kept] == [4, 1] and "k003" not in kept[0]["__key__"]
    whole = _on("cpu", [s for i, s in enumerate(samples) if i != 3])
    assert torch.equal(torch.cat([b["jpg"] for b in kept]), torch.cat([b["jpg"] for b in whole]))


def test_device_needs_a_transform():
    with pytest.raises(ValueError, match="give transform= too"):
        IterableWrapper(_samples(2)).decode_batches("torchrgb8", batch_size=2, device="cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_crops_decoded_on_the_gpu_are_close_to_the_cpus():
    samples = _samples(10)
    on_gpu, on_cpu = _on("cuda", samples), _on("cpu", samples)
    for gpu, cpu in zip(on_gpu, on_cpu, strict=True):
        assert gpu["jpg"].device.type == "cuda"
        assert (gpu["jpg"].cpu().int() - cpu["jpg"].int()).abs().float().mean() < 2  # nvJPEG's IDCT differs slightly


def _cropped_reference(data: bytes) -> torch.Tensor:
    """Oracle: torchvision's Resize(80) + CenterCrop(64) of Pillow's convert('RGB') of the image."""
    from image_files import reference_rgb

    image = torch.from_numpy(np.array(reference_rgb(data))).permute(2, 0, 1)
    return T.Compose([T.Resize(80, antialias=True), T.CenterCrop(64)])(image)


@pytest.mark.parametrize(("device", "threads"), [(None, 0), (None, 2), ("cpu", 0)])
def test_a_batch_of_images_under_different_suffixes_is_one_tensor_of_crops(device, threads):
    """Oracle: torchvision's transform of Pillow's decoded image, each image alone."""
    photos = [("png", _photo(1, 300, 200, "PNG")), ("jpeg", _photo(2, 240, 320)), ("gif", _photo(3, 200, 260, "GIF")),
              ("jpeg", _photo(4, 333, 333))]
    samples = [{"__key__": f"k{i}", "__url__": "m.tar", suffix: data, "cls": str(i).encode()}
               for i, (suffix, data) in enumerate(photos)]
    (batch,) = IterableWrapper(samples).decode_batches("torchrgb8", batch_size=4, transform=CenterCrop(64, 80),
                                                       num_threads=threads, device=device)
    assert sorted(batch) == ["__key__", "__url__", "cls", "png"]  # under the first sample's suffix
    assert batch["png"].shape == (4, 3, 64, 64) and batch["__key__"] == ["k0", "k1", "k2", "k3"]
    for crop, (_, data) in zip(batch["png"], photos, strict=True):
        assert torch.equal(crop, _cropped_reference(data))
    images, labels = next(iter(IterableWrapper([batch]).to_tuple("jpg;png;jpeg;gif", "cls")))
    assert images.shape == (4, 3, 64, 64) and labels.tolist() == [0, 1, 2, 3]


def test_an_image_or_field_only_some_samples_have_comes_out_as_a_list_with_none():
    """Oracle: torchvision's transform of Pillow's decoded image, each image alone."""
    samples = [{"__key__": f"k{i}", "__url__": "m.tar", "jpg": _photo(i, 200, 240), "cls": str(i).encode()}
               for i in range(3)]
    samples[1]["seg.png"] = _photo(9, 300, 200, "PNG")
    samples[2]["txt"] = b"hello"
    (batch,) = IterableWrapper(samples).decode_batches("torchrgb8", batch_size=3, transform=CenterCrop(64, 80))
    assert batch["jpg"].shape == (3, 3, 64, 64)
    for crop, sample in zip(batch["jpg"], samples, strict=True):
        assert torch.equal(crop, _cropped_reference(sample["jpg"]))
    assert batch["seg.png"][0] is None and batch["seg.png"][2] is None
    assert torch.equal(batch["seg.png"][1], _cropped_reference(samples[1]["seg.png"]))
    assert batch["txt"] == [None, None, "hello"] and batch["cls"].tolist() == [0, 1, 2]


IMPORT_THEN_DECODE_THEN_CROP = """
import io, sys
import numpy as np
from PIL import Image
import wds_datapipes as wd
from torch.utils.data.datapipes.iter import IterableWrapper

heavy = ("torchvision", "torch._dynamo", "sympy")
assert not [m for m in heavy if m in sys.modules], [m for m in heavy if m in sys.modules]
out = io.BytesIO()
Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(out, "JPEG")
samples = [{"__key__": "a", "__url__": "m.tar", "jpg": out.getvalue(), "cls": b"1"}]
(sample,) = IterableWrapper(samples).decode("torchrgb8")
(batch,) = IterableWrapper(samples).decode_batches("torchrgb8", batch_size=1)
assert sample["jpg"].shape == (3, 48, 64) and batch["jpg"].shape == (1, 3, 48, 64)
assert "torchvision" not in sys.modules, "decoding without a crop imported torchvision"
(batch,) = IterableWrapper(samples).decode_batches("torchrgb8", batch_size=1, transform=wd.CenterCrop(32, 40))
assert batch["jpg"].shape == (1, 3, 32, 32)
assert "torchvision" in sys.modules
print("ok")
"""


@pytest.mark.timeout(300)
def test_import_wds_datapipes_leaves_torchvision_until_a_crop_needs_it():
    """torchvision (~2 s with torch._dynamo and sympy, in every worker process) is imported by the first crop."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", IMPORT_THEN_DECODE_THEN_CROP], capture_output=True, text=True,
                          timeout=280, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
