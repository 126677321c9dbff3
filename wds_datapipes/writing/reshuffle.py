"""A seeded shuffle of a whole dataset on one machine (a local dSort), in bounded memory.

Two passes (the classic external shuffle): each sample goes, as it is read, to one of
``buckets`` temporary tar files chosen at random; then each bucket in turn is read back
whole, its samples put in a random order and yielded. Buckets chosen uniformly and each
one shuffled uniformly make every order of the whole dataset equally likely, with at most
one bucket (about ``total bytes / buckets``) in memory. The random choices are pure
functions of the seed (:func:`bucket_numbers`, :func:`bucket_order`): the same input,
seed and bucket count give the same order, so a resumed conversion plans the same shards.

A bucket holds the sample dicts as they came, pickled (their fields as they are: bytes,
text, numbers, a :class:`~.shard_file.FileBytes` still only a file's name; their key,
``__source__`` and the reader's ``__problems__`` too, so a bad input stays one after the
shuffle). The buckets are this process's own files, in a folder it made (``mkdtemp``: only
its user can write there), written and read back by it alone; no pickle from elsewhere is
ever loaded.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
from collections.abc import Iterable, Iterator

import numpy as np

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
    """``samples`` (sample dicts of any input: shards, folders, manifests, Parquet) in a seeded random order.

    The buckets are files in a fresh folder under ``workdir`` (default: the system's
    temporary folder), removed when this generator ends.
    """
    folder = tempfile.mkdtemp(prefix=".wds-shuffle-", dir=workdir)
    try:
        paths = [os.path.join(folder, f"bucket-{n:06d}.pickle") for n in range(buckets)]
        outs = [open(path, "wb") for path in paths]  # noqa: SIM115 - all held for the first pass
        try:
            for sample, bucket in zip(samples, bucket_numbers(seed, buckets)):
                pickle.dump(sample, outs[bucket], protocol=pickle.HIGHEST_PROTOCOL)
        finally:
            for out in outs:
                out.close()
        for bucket, path in enumerate(paths):
            with open(path, "rb") as stream:
                held = list(_read_bucket(stream))
            os.remove(path)
            for at in bucket_order(seed, bucket, len(held)):
                yield held[at]
            del held
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _read_bucket(stream) -> Iterator[dict]:
    """The samples of a bucket this process wrote (see the module's note on pickles), in order."""
    while True:
        try:
            yield pickle.load(stream)  # our own file: written by this process, in its own folder
        except EOFError:
            return


__all__ = ["bucket_numbers", "bucket_order", "shuffled"]
