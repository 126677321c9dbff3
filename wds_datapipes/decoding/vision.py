"""Image bytes to fixed-size uint8 tensors: the crops vision models train and evaluate on.

Two transforms, with torchvision's parameters and semantics:

- :class:`CenterCrop` (evaluation): resize the short side to ``resize`` with antialiasing,
  then cut the central ``size`` x ``size``; ``Compose([Resize(resize), CenterCrop(size)])``.
- :class:`RandomResizedCrop` (training): a crop of random area (``scale``) and aspect
  (``ratio``), resized to ``size`` x ``size``, flipped left-right with probability
  ``flip``; ``Compose([RandomResizedCrop(size, scale, ratio), RandomHorizontalFlip(flip)])``.
  Its draws come from the transform's ``seed``, the epoch and the sample's key: they
  change every epoch, repeat with the seed, and do not depend on the order, the worker or
  the thread that decodes the sample, so a resumed run crops exactly as the stopped one.

:func:`decode_transform_into` decodes one image and writes the transformed pixels into a
row of a batch; ``decode_batches(..., transform=...)`` runs it in its thread pool, on images
of any mix of sizes. With torchvision (its uint8 antialiased resize) the result equals
torchvision's own transform of the same decoded image; without it, Pillow decodes and
resizes (bilinear with its own antialiasing: close, not equal). JPEG and PNG are decoded
by ``torchvision.io`` up to torchvision 0.28, and by TorchCodec's image decoders where
torchvision deprecates its own (0.29 on) and TorchCodec is installed: the same pixels at
the same speed (``tests/decoding/test_vision.py``, ``make bench``); YCbCr and greyscale
JPEGs by simplejpeg where installed: their exact pixels, faster (``test_crop_fast_path.py``).
A 16-bit PNG becomes 8-bit by each value's high byte, as on every image path
(docs/reading.md). torchvision is imported by the first crop (:func:`torchvision_parts`),
not with this module.
"""

from __future__ import annotations

import functools
import math
import random
import types
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import PIL.Image
import torch

from .images import check_image_pixels, exact_jpeg_pixels, open_image

__all__ = ["CenterCrop", "Crop", "RandomResizedCrop", "decode_crops_on", "decode_transform_into", "tensor_decoders"]

TORCHVISION_DEPRECATES_DECODING = (0, 29)  # torchvision.io's decoders warn from this release on


@functools.cache
def torchvision_parts() -> types.SimpleNamespace | None:
    """torchvision's ``io`` and ``transforms.v2.functional`` (as ``.io``, ``.functional``,
    ``.version``), imported when a crop first needs them; None without torchvision (Pillow
    decodes and resizes then). Not at ``import wds_datapipes``: torchvision takes ~2 s to
    import (its models, torch._dynamo), which pipelines that never crop should not pay in
    every worker process."""
    try:
        import torchvision
        import torchvision.io
        from torchvision.transforms.v2 import functional
    except ImportError:
        return None
    version = tuple(int(part) for part in torchvision.__version__.split("+")[0].split(".")[:2])
    return types.SimpleNamespace(io=torchvision.io, functional=functional, version=version)


def tensor_decoders() -> dict[str, object] | None:
    """``{"JPEG": fn, "PNG": fn}``, each ``fn(uint8 tensor of the encoded bytes) -> 3xHxW``
    (RGB; uint8 up to 8 bits): TorchCodec's where torchvision deprecates its own and
    TorchCodec imports, else torchvision's; None without torchvision (Pillow decodes then)."""
    return None if torchvision_parts() is None else _tensor_decoders()


@functools.cache
def _tensor_decoders() -> dict[str, object]:
    parts = torchvision_parts()
    if parts.version >= TORCHVISION_DEPRECATES_DECODING:
        try:
            from torchcodec.decoders import decode_jpeg, decode_png
        except (ImportError, OSError, RuntimeError):  # not installed, or its libraries do not load
            pass
        else:
            return {"JPEG": functools.partial(decode_jpeg, mode="RGB"), "PNG": functools.partial(decode_png, mode="RGB")}
    rgb = parts.io.ImageReadMode.RGB
    return {"JPEG": functools.partial(parts.io.decode_jpeg, mode=rgb),
            "PNG": functools.partial(parts.io.decode_png, mode=rgb)}


@dataclass(frozen=True)
class Crop:
    """What to cut from an image of ``height`` x ``width``: resize the whole image to
    ``resized`` (height, width) first if given, then take ``box`` (top, left, height, width),
    resize it to ``out`` (height, width), and mirror it if ``flip``."""

    resized: tuple[int, int] | None
    box: tuple[int, int, int, int]
    out: tuple[int, int]
    flip: bool = False


@dataclass(frozen=True)
class CenterCrop:
    """Resize the short side to ``resize`` (antialiased), keep the central ``size`` x ``size``."""

    size: int = 224
    resize: int = 256
    random = False

    def __post_init__(self):
        if not 0 < self.size <= self.resize:
            raise ValueError(f"need 0 < size <= resize, got size={self.size}, resize={self.resize}")

    def crop(self, height: int, width: int, key: str = "", epoch: int = 0) -> Crop:
        """The crop of an image of ``height`` x ``width`` (the same for every key and epoch)."""
        short, long = (width, height) if width <= height else (height, width)
        new_long = int(self.resize * long / short)  # torchvision's Resize(int) rule
        new_h, new_w = (new_long, self.resize) if width <= height else (self.resize, new_long)
        top = round((new_h - self.size) / 2.0)  # torchvision's center_crop
        left = round((new_w - self.size) / 2.0)
        return Crop((new_h, new_w), (top, left, self.size, self.size), (self.size, self.size))


@dataclass(frozen=True)
class RandomResizedCrop:
    """A random crop of ``scale`` of the area and ``ratio`` of aspect, resized to ``size``
    x ``size`` (antialiased), mirrored with probability ``flip``; torchvision's algorithm,
    drawn from (``seed``, epoch, sample key)."""

    size: int = 224
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: float = 0.5
    seed: int = 0
    random = True

    def __post_init__(self):
        if self.size <= 0 or not 0 < self.scale[0] <= self.scale[1] or not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"bad RandomResizedCrop settings: {self}")
        if not 0 <= self.flip <= 1:
            raise ValueError(f"flip is a probability, got {self.flip}")

    def crop(self, height: int, width: int, key: str = "", epoch: int = 0) -> Crop:
        """The crop of an image of ``height`` x ``width``: drawn from (``seed``, ``epoch``, ``key``),
        so a sample gets the same crop in every run and a new one each epoch."""
        rng = random.Random(f"{self.seed}/{epoch}/{key}")
        area = height * width
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):  # torchvision's RandomResizedCrop.get_params
            target = area * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(*log_ratio))
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                top, left = rng.randint(0, height - h), rng.randint(0, width - w)
                break
        else:  # fallback to a central crop
            in_ratio = width / height
            if in_ratio < self.ratio[0]:
                w, h = width, round(width / self.ratio[0])
            elif in_ratio > self.ratio[1]:
                h, w = height, round(height * self.ratio[1])
            else:
                w, h = width, height
            top, left = (height - h) // 2, (width - w) // 2
        return Crop(None, (top, left, h, w), (self.size, self.size), rng.random() < self.flip)


def apply_crop(image: torch.Tensor, crop: Crop) -> torch.Tensor:
    """``crop`` applied to a uint8 CxHxW tensor with torchvision's functions (antialiased resize)."""
    tvf = torchvision_parts().functional
    if crop.resized is not None:
        image = tvf.resize(image, list(crop.resized), antialias=True)
    top, left, h, w = crop.box
    image = image[:, top : top + h, left : left + w]
    if (h, w) != crop.out:
        image = tvf.resize(image, list(crop.out), antialias=True)
    return tvf.horizontal_flip(image) if crop.flip else image


def _tensor_decodable(data: bytes, formats: tuple[str, ...]) -> bool:
    """Whether the tensor decoders read ``data`` to the reference pixels (Pillow's, 16 bits
    reduced to their high byte): JPEGs, and PNGs of up to 8 bits. A 16-bit PNG goes to
    Pillow: torchvision's decoder gives uint16 and TorchCodec's rounds ``v * 255 / 65535``."""
    if formats == ("PNG",):
        return not (data[12:16] == b"IHDR" and data[24] == 16)  # the IHDR's bit depth
    return formats == ("JPEG",)


def decode_transform_into(data: bytes, formats: tuple[str, ...], transform, key: str, epoch: int,
                          row: torch.Tensor, max_pixels: int) -> None:
    """Decodes image bytes (as one of ``formats``), transforms them, writes them into ``row``
    (3xSxS uint8); an image of more than ``max_pixels`` is refused from its header."""
    decoders = tensor_decoders()
    if decoders is not None and formats == ("JPEG",):
        # simplejpeg gives the library decoders' exact pixels for YCbCr and greyscale JPEGs
        # at ~0.85x their CPU time (no CHW copy, no bytearray copy; bench_pipeline.py --cpu):
        # its HxWxC array is cropped as a CHW view. Any other JPEG takes the path below.
        pixels = exact_jpeg_pixels(data, "RGB", max_pixels)
        if pixels is not None:
            image = torch.from_numpy(pixels).permute(2, 0, 1)
            row.copy_(apply_crop(image, transform.crop(image.shape[1], image.shape[2], key, epoch)))
            return
    check_image_pixels(data, formats, max_pixels)
    if decoders is not None and _tensor_decodable(data, formats):
        writable = isinstance(data, bytearray) or (isinstance(data, memoryview) and not data.readonly)
        encoded = torch.frombuffer(data if writable else bytearray(data), dtype=torch.uint8)  # torch warns on read-only
        image = decoders[formats[0]](encoded)
        row.copy_(apply_crop(image, transform.crop(image.shape[1], image.shape[2], key, epoch)))
        return
    picture = open_image(data, formats, max_pixels).convert("RGB")
    crop = transform.crop(picture.height, picture.width, key, epoch)
    if torchvision_parts() is not None:
        image = torch.from_numpy(np.array(picture)).permute(2, 0, 1)  # a writable copy, as torch wants
        row.copy_(apply_crop(image, crop))
        return
    row.copy_(torch.from_numpy(np.array(_pillow_crop(picture, crop))).permute(2, 0, 1))


def decode_crops_on(device: torch.device, images: list[tuple[int, bytes, tuple[str, ...], str]], transform,
                    epoch: int, rows: torch.Tensor, max_pixels: int, done: list[Future]) -> None:
    """Decodes each of ``images`` ((row, bytes, formats, sample key)) on ``device``, the JPEGs
    in one call of the library's batch decoder (nvJPEG on CUDA), and crops it there into its
    row of ``rows``; settles ``done[j]`` for ``images[j]``: True, or the error it raised."""
    try:
        decoders = tensor_decoders()
        jpegs = []
        for j, (row, data, formats, key) in enumerate(images):
            try:
                if decoders is not None and formats == ("JPEG",):
                    check_image_pixels(data, formats, max_pixels)
                    jpegs.append(j)
                    continue
                crop = torch.empty(rows.shape[1:], dtype=torch.uint8)  # decoded and cropped on the CPU, moved
                decode_transform_into(data, formats, transform, key, epoch, crop, max_pixels)
                rows[row].copy_(crop)
                done[j].set_result(True)
            except Exception as exn:  # noqa: BLE001 - too large or unreadable: that sample's error
                done[j].set_exception(exn)
        decoded = _decode_jpegs_on(device, [images[j][1] for j in jpegs], decoders["JPEG"] if jpegs else None)
        for j, image in zip(jpegs, decoded, strict=True):
            if isinstance(image, Exception):
                done[j].set_exception(image)
                continue
            row, _, _, key = images[j]
            rows[row].copy_(apply_crop(image, transform.crop(image.shape[1], image.shape[2], key, epoch)))
            done[j].set_result(True)
    except BaseException as exn:  # never leave a sample's future unsettled: its batch would wait for ever
        for future in done:
            if not future.done():
                future.set_exception(exn)
        if not isinstance(exn, Exception):
            raise


def _decode_jpegs_on(device: torch.device, datas: list, decode) -> list:
    """The decoded images (uint8 3xHxW on ``device``), one call for all; where that call fails,
    each image alone, so that the bad one gets its own error in its place."""
    if not datas:
        return []
    encoded = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data in datas]
    try:
        return list(decode(encoded, device=device))
    except Exception:  # noqa: BLE001 - which image failed? each alone says
        return [_decoded_alone(decode, tensor, device) for tensor in encoded]


def _decoded_alone(decode, tensor: torch.Tensor, device: torch.device) -> torch.Tensor | Exception:
    try:
        return decode([tensor], device=device)[0]
    except Exception as exn:  # noqa: BLE001 - this image's error, reported for its sample
        return exn


def _pillow_crop(picture: PIL.Image.Image, crop: Crop) -> PIL.Image.Image:
    if crop.resized is not None:
        picture = picture.resize((crop.resized[1], crop.resized[0]), PIL.Image.BILINEAR)
    top, left, h, w = crop.box
    picture = picture.resize((crop.out[1], crop.out[0]), PIL.Image.BILINEAR, box=(left, top, left + w, top + h))
    return picture.transpose(PIL.Image.FLIP_LEFT_RIGHT) if crop.flip else picture
