"""Limits: one place, sane defaults, taken by pipes when built; decoders refuse what claims too much."""

from __future__ import annotations

import gzip
import io
import pickle
import struct
import zipfile
import zlib

import numpy as np
import PIL
import PIL.Image
import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

import wds_datapipes as wd
from wds_datapipes import DecodeError, Limits, get_limits, set_limits
from wds_datapipes.decoding.images import check_image_pixels, decode_image
from wds_datapipes.decoding.vision import CenterCrop


@pytest.fixture
def restore_limits():
    previous = get_limits()
    yield
    set_limits(previous)


def _decode(sample: dict, *specs, **options) -> dict:
    return next(iter(IterableWrapper([{"__key__": "k", "__url__": "u.tar", **sample}]).decode(*specs, **options)))


# ---------------------------------------------------------------- one place


def test_defaults_bound_what_one_member_field_or_image_may_cost():
    limits = Limits()
    assert limits.max_member_bytes == limits.max_gz_bytes == limits.max_array_bytes == 128 << 20
    assert limits.max_image_pixels == 4096 * 4096
    assert limits.http_timeout == 30 and limits.http_retries == 5 and limits.pipe_grace == 10
    with pytest.raises(ValueError, match="max_member_bytes"):
        Limits(max_member_bytes=-1)
    with pytest.raises(TypeError):
        limits.replace(no_such_limit=1)


def test_set_limits_applies_to_pipes_built_afterwards_and_travels_with_them(restore_limits, make_shards):
    (shard,) = make_shards(1, 2)
    before = wd.ShardLister([shard]).load_tar()
    previous = set_limits(max_member_bytes=10)
    assert previous == Limits() and get_limits().max_member_bytes == 10
    after = pickle.loads(pickle.dumps(wd.ShardLister([shard]).load_tar().group_by_key().decode()))
    set_limits(previous)
    assert len(list(before)) == 4  # built before the change: the defaults
    with pytest.raises(wd.ShardFormatError, match="max_member_bytes"):
        list(after)  # built after it: the limit came along through pickling


# ---------------------------------------------------------------- images


def _png_header(width: int, height: int) -> bytes:
    """A PNG that claims ``width`` x ``height`` pixels and holds none."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + chunk(
        b"IEND", b"")


def _jpeg(width: int, height: int) -> bytes:
    out = io.BytesIO()
    PIL.Image.new("RGB", (width, height), (10, 20, 30)).save(out, "JPEG")
    return out.getvalue()


@pytest.mark.parametrize("spec", ["pil", "rgb8", "torchrgb"])
def test_an_image_claiming_more_pixels_than_the_limit_is_refused_before_decoding(spec):
    with pytest.raises(DecodeError, match=r"5000x5000.*max_image_pixels") as caught:
        _decode({"png": _png_header(5000, 5000)}, spec)  # under Pillow's own guard, over ours
    assert (caught.value.url, caught.value.key, caught.value.field) == ("u.tar", "k", "png")
    with pytest.raises(DecodeError, match="DecompressionBomb"):  # Pillow's guard, still our error
        _decode({"png": _png_header(100_000, 100_000)}, spec)


def test_the_image_limit_is_the_same_on_the_jpeg_fast_paths():
    jpeg = _jpeg(64, 48)
    assert decode_image(jpeg, "rgb8", ("JPEG",), max_pixels=64 * 48).shape == (48, 64, 3)
    with pytest.raises(ValueError, match="max_image_pixels"):
        decode_image(jpeg, "rgb8", ("JPEG",), max_pixels=64 * 48 - 1)
    samples = IterableWrapper([{"__key__": f"k{i}", "__url__": "u.tar", "jpg": jpeg} for i in range(3)])
    small = Limits(max_image_pixels=1000)
    with pytest.raises(DecodeError, match="max_image_pixels"):
        list(samples.decode_batches("torchrgb8", batch_size=3, limits=small))
    (batch,) = samples.decode_batches("torchrgb8", batch_size=3)
    assert batch["jpg"].shape == (3, 3, 48, 64)
    # The vision stage reads a JPEG's size from its header alone (simplejpeg, else Pillow).
    check_image_pixels(jpeg, ("JPEG",), 64 * 48)
    with pytest.raises(ValueError, match=r"64x48, 3072 pixels.*max_image_pixels"):
        check_image_pixels(jpeg, ("JPEG",), 64 * 48 - 1)
    with pytest.raises(PIL.UnidentifiedImageError):  # no header simplejpeg can read: Pillow decides
        check_image_pixels(b"\xff\xd8\xff" + bytes(40), ("JPEG",), 10**6)
    (batch,) = samples.decode_batches("torchrgb8", batch_size=3, transform=CenterCrop(16, 20),
                                      limits=Limits(max_image_pixels=64 * 48))
    assert batch["jpg"].shape == (3, 3, 16, 16)
    with pytest.raises(DecodeError, match="64x48.*max_image_pixels"):
        list(samples.decode_batches("torchrgb8", batch_size=3, transform=CenterCrop(16, 20),
                                    limits=Limits(max_image_pixels=64 * 48 - 1)))


# ---------------------------------------------------------------- .gz fields, npy and npz


def test_a_gz_field_that_inflates_past_the_limit_is_refused():
    bomb = gzip.compress(bytes(5 << 20), compresslevel=1)
    assert len(bomb) < 50_000
    with pytest.raises(DecodeError, match="max_gz_bytes"):
        _decode({"bin.gz": bomb}, limits=Limits(max_gz_bytes=4 << 20))
    assert _decode({"bin.gz": bomb}, limits=Limits(max_gz_bytes=5 << 20))["bin.gz"] == bytes(5 << 20)


def test_gz_fields_of_several_members_are_joined_and_checked():
    data = gzip.compress(b"[1, ") + gzip.compress(b"2]")
    assert _decode({"json.gz": data})["json.gz"] == [1, 2]
    corrupt = bytearray(data)
    corrupt[-8] ^= 1  # the second member's CRC
    with pytest.raises(DecodeError, match="json.gz"):
        _decode({"json.gz": bytes(corrupt)})
    with pytest.raises(DecodeError, match="truncated"):
        _decode({"json.gz": data[:-3]})


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def _claiming(shape: tuple[int, ...]) -> bytes:
    """An npy whose header claims ``shape`` of float64 and holds 80 bytes of data."""
    header = np.lib.format.header_data_from_array_1_0(np.zeros(1))
    header["shape"] = shape
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, header)
    return out.getvalue() + bytes(80)


def test_an_npy_header_claiming_more_than_its_bytes_or_the_limit_is_refused():
    assert _decode({"npy": _npy(np.arange(10.0))})["npy"].tolist() == list(np.arange(10.0))
    with pytest.raises(DecodeError, match="claims"):
        _decode({"npy": _claiming((1000,))})
    with pytest.raises(DecodeError, match="max_array_bytes"):
        _decode({"npy": _claiming((10**12,))})
    with pytest.raises(DecodeError, match="max_array_bytes"):
        _decode({"npy": _npy(np.zeros(1000))}, limits=Limits(max_array_bytes=7999))


def _npz(**members: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return out.getvalue()


def test_an_npz_that_unpacks_past_the_limit_or_lies_about_an_array_is_refused():
    good = _npz(**{"a.npy": _npy(np.arange(3)), "b.npy": _npy(np.ones((2, 2)))})
    decoded = _decode({"npz": good})["npz"]
    assert decoded["a"].tolist() == [0, 1, 2] and decoded["b"].shape == (2, 2)
    bomb = _npz(**{"zeros.npy": _npy(np.zeros(1 << 20))})  # 8 MiB of zeros in a few KB
    assert len(bomb) < 100_000
    with pytest.raises(DecodeError, match="max_array_bytes"):
        _decode({"npz": bomb}, limits=Limits(max_array_bytes=1 << 20))
    with pytest.raises(DecodeError, match="claims"):
        _decode({"npz": _npz(**{"liar.npy": _claiming((1000,))})})
