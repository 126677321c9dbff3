"""Benchmark data: shards of random-texture JPEGs with a class label, written by webdataset."""

from __future__ import annotations

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
