"""A seeded shuffle of a whole dataset on one machine (a local dSort), in bounded memory.

Two passes (the classic external shuffle): each sample goes, as it is read, to one of
``buckets`` temporary tar files chosen at random; then each bucket in turn is read back
whole, its samples put in a random order and yielded. Buckets chosen uniformly and each
one shuffled uniformly make every order of the whole dataset equally likely, with at most
one bucket (about ``total bytes / buckets``) in memory. The random choices are pure
functions of the seed (:func:`bucket_numbers`, :func:`bucket_order`): the same input,
seed and bucket count give the same order, so a resumed conversion plans the same shards.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator

import numpy as np

from ..tar import iter_tar_members
from ..tar.build import END, member_bytes

_SOURCE = "__source__"
_DRAW = 4096


def bucket_numbers(seed: int, buckets: int) -> Iterator[int]:
    """The bucket of each sample in input order: uniform over ``range(buckets)``, endless, from ``seed`` alone."""
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, not {buckets}")
    rng = np.random.default_rng([seed, 0])
    while True:
        yield from rng.integers(0, buckets, size=_DRAW).tolist()


def bucket_order(seed: int, bucket: int, count: int) -> list[int]:
    """The order in which bucket ``bucket``'s ``count`` samples (numbered as they came) are yielded."""
    return np.random.default_rng([seed, 1, bucket]).permutation(count).tolist()


def shuffled(samples: Iterable[dict], seed: int, buckets: int, workdir: str | None = None) -> Iterator[dict]:
    """``samples`` (fields as bytes, as :func:`~.sources.shard_samples` gives them) in a seeded random order.

    The buckets are tar files in a fresh folder under ``workdir`` (default: the system's
    temporary folder), removed when this generator ends.
    """
    folder = tempfile.mkdtemp(prefix=".wds-shuffle-", dir=workdir)
    try:
        paths = [os.path.join(folder, f"bucket-{n:06d}.tar") for n in range(buckets)]
        outs = [open(path, "wb") for path in paths]  # noqa: SIM115 - all held for the first pass
        try:
            for sample, bucket in zip(samples, bucket_numbers(seed, buckets)):
                outs[bucket].write(_sample_bytes(sample))
        finally:
            for out in outs:
                out.write(END)
                out.close()
        for bucket, path in enumerate(paths):
            with open(path, "rb") as stream:
                held = list(_read_bucket(stream, path))
            os.remove(path)
            for at in bucket_order(seed, bucket, len(held)):
                yield held[at]
            del held
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _sample_bytes(sample: dict) -> bytes:
    """A sample as members, its ``__source__`` first (which also marks where each sample starts)."""
    key = sample["__key__"]
    parts = [member_bytes(f"{key}.{_SOURCE}", str(sample.get(_SOURCE, key)).encode("utf-8", "surrogateescape"))]
    parts += [member_bytes(f"{key}.{name}", bytes(value)) for name, value in sample.items() if not name.startswith("_")]
    return b"".join(parts)


def _read_bucket(stream, url: str) -> Iterator[dict]:
    sample: dict | None = None
    for name, data in iter_tar_members(stream, url):
        key, _, suffix = name.rpartition(".") if name.endswith("." + _SOURCE) else name.partition(".")
        if suffix == _SOURCE:
            if sample is not None:
                yield sample
            sample = {"__key__": key, _SOURCE: bytes(data).decode("utf-8", "surrogateescape")}
        else:
            sample[name[len(sample["__key__"]) + 1:]] = bytes(data)
    if sample is not None:
        yield sample


__all__ = ["bucket_numbers", "bucket_order", "shuffled"]
