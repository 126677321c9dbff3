"""Listing shard URLs, shuffling them per epoch, and splitting them between workers and ranks."""

from __future__ import annotations

import glob
import os
import random
from collections.abc import Iterable, Iterator

from braceexpand import braceexpand
from torch.utils.data import IterDataPipe, functional_datapipe
from torch.utils.data.datapipes.iter.sharding import ShardingFilterIterDataPipe

from .errors import NoShardsError
from .openers import local_path, url_scheme
from .pipe_base import Pipe
from .seeding import epoch_rng

SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")
_GLOB_CHARS = frozenset("*?[")


def expand_url_spec(spec: str) -> list[str]:
    """Expand one URL spec into shard URLs, without touching the filesystem.

    ``::`` joins several specs (as in webdataset); each is brace-expanded
    (``train-{000..009}.tar``). Globs and directories are expanded later, by
    :func:`resolve_local`, because that needs I/O.
    """
    urls: list[str] = []
    for part in spec.split("::"):
        part = part.strip()
        if part:
            urls.extend(braceexpand(part))
    return urls


def resolve_local(url: str) -> list[str]:
    """A local glob becomes its sorted matches, a directory its sorted shard files."""
    if url_scheme(url) != "file":
        return [url]
    path = local_path(url)
    prefix = url[: len(url) - len(path)]  # "file://" stays on what it expands to
    if _GLOB_CHARS.intersection(path):
        return [prefix + match for match in sorted(glob.glob(path))]
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if n.endswith(SHARD_SUFFIXES))
        return [prefix + os.path.join(path, n) for n in names]
    return [url]


class _ExpandedUrls(Pipe[str]):
    """Yields the shard URLs that strings (or a pipe of strings) expand to."""

    def __init__(self, specs: str | Iterable[str] | IterDataPipe):
        self.specs = [specs] if isinstance(specs, str) else specs

    def __iter__(self) -> Iterator[str]:
        for spec in self.specs:
            if not isinstance(spec, str):
                raise TypeError(f"shard specs must be strings, got {type(spec).__name__}: {spec!r}")
            for url in expand_url_spec(spec):
                yield from resolve_local(url)


class _SeededOrder(Pipe[str]):
    """Yields all its source's URLs, in a new seeded order each epoch when ``shuffle``.

    It sits before the ShardingFilter, so DataLoader2 gives it the seed it shares with
    every worker and rank, and the split stays a partition.
    """

    def __init__(self, source: IterDataPipe[str], shuffle: bool, seed: int | None):
        self.source = source
        self.shuffle = shuffle
        self.seed = seed
        self.loader_seed: int | None = None
        # Drawn once here, then copied into each worker: the fallback shared by all.
        self._fallback_seed = random.getrandbits(64)
        self.epoch = 0

    def set_seed(self, seed: int) -> _SeededOrder:
        self.loader_seed = seed
        return self

    def __iter__(self) -> Iterator[str]:
        urls = list(self.source)
        if self.shuffle:
            base = self._fallback_seed if self.seed is None and self.loader_seed is None else None
            epoch_rng(self.seed, self.loader_seed, base, self.epoch).shuffle(urls)
        self.epoch += 1
        yield from urls


class ShardListBase(Pipe[str]):
    """Shared machinery of the shard listers: order, shuffle and split of shard URLs."""

    def __init__(self, urls: IterDataPipe[str], *, shuffle: bool, seed: int | None, allow_empty: bool):
        self.shuffle = shuffle
        self.allow_empty = allow_empty
        # torch's own ShardingFilter takes the loaders' apply_sharding calls (worker and
        # rank groups), and marks the point before which DataLoader2 shares seeds.
        self.sharded = ShardingFilterIterDataPipe(_SeededOrder(urls, shuffle, seed))

    def __iter__(self) -> Iterator[str]:
        count = 0
        for url in self.sharded:
            count += 1
            yield url
        if count == 0 and not self.allow_empty:
            raise NoShardsError(self._empty_message())

    def _empty_message(self) -> str:
        parts = self.sharded.num_of_instances
        if parts > 1:
            return (
                f"{type(self).__name__}: this worker/rank (part {self.sharded.instance_id} of "
                f"{parts}) got no shard: use at least as many shards as workers x ranks, "
                "or pass allow_empty=True"
            )
        return f"{type(self).__name__}: no shard URL matched {self._describe_source()}"

    def _describe_source(self) -> str:
        return "the given specs"

    def __len__(self) -> int:
        raise TypeError(f"{type(self).__name__} has no length until it is listed")


@functional_datapipe("list_shards")
class ShardLister(ShardListBase):
    """Yields shard URLs: expanded, optionally shuffled per epoch, this worker's share (functional name: ``list_shards``).

    Args:
        urls: a URL spec, a list of them, or a DataPipe yielding them. A spec may use
            braces (``train-{000000..000099}.tar``), ``::`` to join several specs, local
            globs, a directory (its .tar/.tar.gz/.tgz files), ``file://``, ``http(s)://``,
            ``pipe:CMD`` or any scheme a plugin registers (``ais://`` with aisio).
        shuffle: shuffle the shard order; it changes each epoch and is the same in
            every worker and rank, so the split stays a partition.
        seed: makes the order repeat across runs (it is mixed with the loader's seed
            where a loader gives one: seed that too, e.g. ``DataLoader2.seed(n)``).
        allow_empty: let a worker or rank with no shard yield nothing instead of raising
            :class:`NoShardsError`.

    Under ``DataLoader2`` / ``DataLoader`` each worker and rank reads whole, distinct
    shards (round-robin over the, possibly shuffled, list).

    Example:
        >>> dp = ShardLister("data/train-{000..009}.tar", shuffle=True, seed=0)
    """

    def __init__(
        self,
        urls: str | Iterable[str] | IterDataPipe,
        *,
        shuffle: bool = False,
        seed: int | None = None,
        allow_empty: bool = False,
    ):
        self.specs = urls
        super().__init__(_ExpandedUrls(urls), shuffle=shuffle, seed=seed, allow_empty=allow_empty)

    def _describe_source(self) -> str:
        return repr(self.specs) if not isinstance(self.specs, IterDataPipe) else "the source pipe"
