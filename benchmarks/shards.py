"""The benchmarks' data, written once and reused between runs: shards of photo-like JPEGs,
of uniform small JPEGs and of random payloads, each sample with a class label, written by
webdataset's ShardWriter (the peer every benchmark reads beside ours)."""

from __future__ import annotations

import glob
import io
import os

import numpy as np
import webdataset as wds
from PIL import Image


def make_jpeg_shards(folder: str, shards: int = 8, per_shard: int = 1000, size: int = 256,
                     quality: int = 90, seed: int = 0) -> str:
    """Write ``shards`` tar files of ``per_shard`` samples (``jpg`` + ``cls``); returns the brace URL.

    Existing shards of the same shape are reused. Images are smooth noise, so they
    compress like photos rather than like flat colour.
    """
    os.makedirs(folder, exist_ok=True)
    pattern = os.path.join(folder, f"bench-{size}px-%06d.tar")
    url = os.path.join(folder, f"bench-{size}px-{{{0:06d}..{shards - 1:06d}}}.tar")
    stamp = os.path.join(folder, f".done-{size}-{shards}-{per_shard}-{quality}")
    if os.path.exists(stamp):
        return url
    rng = np.random.default_rng(seed)
    palette = [_jpeg(rng, size, quality) for _ in range(64)]
    with wds.ShardWriter(pattern, maxcount=per_shard, verbose=0) as sink:
        for i in range(shards * per_shard):
            sink.write({"__key__": f"sample{i:08d}", "jpg": palette[i % len(palette)], "cls": str(i % 10)})
    open(stamp, "w").close()
    return url


def _jpeg(rng: np.random.Generator, size: int, quality: int) -> bytes:
    small = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
    image = Image.fromarray(small).resize((size, size), Image.BICUBIC)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def make_photo_shards(folder: str, count: int = 2000, per_shard: int | None = None, seed: int = 0) -> list[str]:
    """Photo-like JPEGs of 300-500 px per side (quality 90, ~50 KB each) with a class label,
    written by webdataset's ShardWriter, ``per_shard`` a shard (by default 250, and at least 4
    shards: 2 loader workers get 2 each); returns the shard paths (reused between runs)."""
    per_shard = per_shard or min(250, max(1, count // 4))
    os.makedirs(folder, exist_ok=True)
    shards = (count + per_shard - 1) // per_shard
    pattern = os.path.join(folder, "photos-%06d.tar")
    paths = [pattern % i for i in range(shards)]
    stamp = os.path.join(folder, f".done-photos-{count}-{per_shard}-{seed}")
    if os.path.exists(stamp):
        return paths
    rng = np.random.default_rng(seed)
    with wds.ShardWriter(pattern, maxcount=per_shard, verbose=0) as sink:
        for i in range(count):
            width, height = (int(x) for x in rng.integers(300, 501, 2))
            sink.write({"__key__": f"photo{i:08d}", "jpg": _photo(rng, width, height), "cls": str(i % 1000)})
    open(stamp, "w").close()
    return paths


def _photo(rng: np.random.Generator, width: int, height: int) -> bytes:
    """Large smooth shapes, mid-scale texture and fine grain: compresses like a photo."""
    base = rng.integers(0, 256, (height // 32 + 2, width // 32 + 2, 3), dtype=np.uint8)
    image = np.asarray(Image.fromarray(base).resize((width, height), Image.BICUBIC), dtype=np.float32)
    texture = rng.integers(0, 256, (height // 4 + 1, width // 4 + 1, 3), dtype=np.uint8)
    image += 0.25 * (np.asarray(Image.fromarray(texture).resize((width, height), Image.BILINEAR)) - 128.0)
    image += rng.normal(0.0, 4.5, image.shape)
    out = io.BytesIO()
    Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(out, format="JPEG", quality=90)
    return out.getvalue()


def make_payload_shards(folder: str, kilobytes: int, count: int = 4000, per_shard: int = 500) -> list[str]:
    """Samples of ``kilobytes`` KB of random bytes plus a label (incompressible, like media)."""
    os.makedirs(folder, exist_ok=True)
    pattern = os.path.join(folder, f"payload-{kilobytes}k-%06d.tar")
    paths = [pattern % i for i in range((count + per_shard - 1) // per_shard)]
    stamp = os.path.join(folder, f".done-{kilobytes}-{count}-{per_shard}")
    layouts = glob.glob(os.path.join(folder, f".done-{kilobytes}-*"))  # another count rewrites the same files
    if os.path.exists(stamp) and max(layouts, key=os.path.getmtime) == stamp:
        return paths
    data = os.urandom(kilobytes * 1024 + 4096)
    with wds.ShardWriter(pattern, maxcount=per_shard, verbose=0) as sink:
        for i in range(count):
            start = i % 4096
            sink.write({"__key__": f"sample{i:08d}", "bin": data[start : start + kilobytes * 1024], "cls": str(i % 10)})
    open(stamp, "w").close()
    return paths
