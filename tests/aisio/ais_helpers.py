"""Shards and samples for the AIStore tests."""

from __future__ import annotations

import random
from pathlib import Path

import webdataset as wds


def make_samples(n: int, seed: int = 0) -> list[dict]:
    """Samples of three files each; some images are larger than a read chunk."""
    rng = random.Random(seed)
    samples = []
    for i in range(n):
        size = rng.choice([300, 5_000, 70_000, 200_000])
        samples.append({
            "__key__": f"sample{seed:02d}{i:05d}",
            "jpg": rng.randbytes(size),
            "cls": str(i % 7).encode(),
            "json": f'{{"i": {i}, "seed": {seed}}}'.encode(),
        })
    return samples


def write_shards(directory: Path, samples: list[dict], per_shard: int, post=None) -> list[str]:
    """Write ``samples`` as train-000000.tar, ... in ``directory``; returns the local paths."""
    directory.mkdir(parents=True, exist_ok=True)
    written: list[str] = []

    def record(path: str) -> None:
        written.append(path)
        if post is not None:
            post(path)

    with wds.ShardWriter(str(directory / "train-%06d.tar"), maxcount=per_shard, post=record, verbose=0) as sink:
        for sample in samples:
            sink.write(sample)
    return written


def reference_samples(paths: list[str]) -> list[dict]:
    """The samples webdataset itself reads from local shards, without its ``__`` bookkeeping keys."""
    dataset = wds.WebDataset(paths, shardshuffle=False, empty_check=False)
    return [{k: v for k, v in s.items() if k == "__key__" or not k.startswith("__")} for s in dataset]


def strip_url(samples) -> list[dict]:
    return [{k: v for k, v in s.items() if k != "__url__"} for s in samples]


