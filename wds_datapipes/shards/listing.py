"""Listing shard URLs, shuffling them per epoch, and splitting them between workers and ranks."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ..errors import NoShardsError
from ..pipe_base import Pipe
from ..stats.probe import current as current_probe
from ..storage.cloud_settings import PipelineStores, StoreArg, with_stores
from ..topology import EpochSeed, ShardingRecord
from ..torch_datapipes import (
    SHARDING_PRIORITIES,
    IterDataPipe,
    ShardingFilterIterDataPipe,
    functional_datapipe,
)
from .openers import SHARD_SUFFIXES, LocalPath, list_urls, local_path, resolve_local, url_scheme  # noqa: F401 - names kept
from .url_specs import expand_url_spec


class _ExpandedUrls(Pipe[str]):
    """Yields the shard URLs that strings (or a pipe of strings) expand to, each object-store
    URL carrying ``stores`` (the lister's own settings) where given."""

    def __init__(self, specs: str | Iterable[str] | IterDataPipe, stores: PipelineStores | None = None):
        self.specs = [specs] if isinstance(specs, str) else specs
        self.stores = stores

    def __iter__(self) -> Iterator[str]:
        for spec in self.specs:
            if not isinstance(spec, str):
                raise TypeError(f"shard specs must be strings, got {type(spec).__name__}: {spec!r}")
            for url in expand_url_spec(spec):
                yield from list_urls(with_stores(url, self.stores))  # lazily: a long listing's first URL before its end


class _SeededOrder(Pipe[str]):
    """Yields all its source's URLs, in a new seeded order each epoch when ``shuffle``.

    It sits before the ShardingFilter, so DataLoader2 gives it the seed it shares with
    every worker and rank, and the split stays a partition.
    """

    orders_name = "the shard lister (shuffle=True)"  # how a checkpoint's refusal names it

    def __init__(self, source_datapipe: IterDataPipe[str], shuffle: bool, seed: int | None):
        self.source_datapipe = source_datapipe
        self.shuffle_order = shuffle  # not ``shuffle``: that name is torch's .shuffle() pipe
        self.seeds = EpochSeed(seed)
        self.user_seed_only = False  # set when ranks split without a loader that shares seeds

    def set_seed(self, seed: int) -> _SeededOrder:
        self.seeds.set_seed(seed)
        return self

    def set_epoch(self, epoch: int) -> None:
        self.seeds.epoch = epoch

    @property
    def draws_orders(self) -> bool:
        """Whether its order comes from its seeds (a lister that does not shuffle draws nothing)."""
        return self.shuffle_order

    def __iter__(self) -> Iterator[str]:
        rng = self.seeds.next_rng(user_seed_only=self.user_seed_only)
        if not self.shuffle_order:  # in listing order, as it comes: the first shard opens before a long listing ends
            yield from self.source_datapipe
            return
        urls = list(self.source_datapipe)
        rng.shuffle(urls)
        yield from urls


class ShardListBase(Pipe[str]):
    """Shared machinery of the shard listers: order, shuffle and split of shard URLs.

    Every reader (rank x worker) keeps its own round-robin share of the list, split once
    by rank and once by worker under every loader. Where no loader splits by rank
    (DataLoader2 without a DistributedReadingService, a DataLoader without a process
    group, or no loader at all), the lister does it from ``torch.distributed`` or
    ``RANK``/``WORLD_SIZE``.
    """

    def __init__(self, urls: IterDataPipe[str], *, shuffle: bool, seed: int | None, allow_empty: bool):
        self.shuffle_shards = shuffle  # not ``shuffle``: that name is torch's .shuffle() pipe
        self.allow_empty = allow_empty
        self._order = _SeededOrder(urls, shuffle, seed)
        # torch's own ShardingFilter takes the loaders' apply_sharding calls (worker and
        # rank groups), and marks the point before which DataLoader2 shares seeds. It is
        # read, never iterated nor given splits of ours: the lister keeps its share itself
        # (a split of ours in it would stop a later loader's: "cannot mix DEFAULT and non DEFAULT groups").
        self.sharded = ShardingFilterIterDataPipe(self._order)
        self._ranks = ShardingRecord()  # captures the process group's rank when pickled
        self._share = (1, 0)  # (readers, this reader) of the last iteration, for messages

    def __iter__(self) -> Iterator[str]:
        readers, reader = self._share = self._reader_share()
        count = 0
        for i, url in enumerate(self._order):
            if i % readers == reader:
                count += 1
                yield url
        if count == 0 and not self.allow_empty:
            raise NoShardsError(self._empty_message())

    def _reader_share(self) -> tuple[int, int]:
        """(readers, reader): this reader keeps every ``readers``-th URL from the ``reader``-th."""
        groups = self.sharded.groups
        self._ranks.take_groups(groups)
        where = self._ranks.resolve()
        split_here = where.world > 1 and not self._ranks.loader_splits_ranks()
        if split_here and self.shuffle_shards and self._order.seeds.seed is None:
            raise ValueError(
                f"{type(self).__name__}: {where.world} ranks read with no loader that shares seeds between them "
                "(DataLoader2 without DistributedReadingService, DataLoader without a process group, or no "
                "loader), so they cannot agree on a shuffled shard order: pass seed= to the lister, or use "
                "SequentialReadingService(DistributedReadingService(), MultiProcessingReadingService(n))"
            )
        self._order.user_seed_only = split_here
        probe = current_probe()
        if probe is not None:  # stats: where this process reads (DataLoader2's workers say it no other way)
            probe.place(where.rank, where.world, where.worker, where.workers)
        readers = where.world * where.workers
        if SHARDING_PRIORITIES.DEFAULT in groups:  # DataLoader's numbering of its readers
            return readers, where.worker * where.world + where.rank
        return readers, where.rank * where.workers + where.worker  # the ShardingFilter's, ranks outermost

    def _empty_message(self) -> str:
        readers, reader = self._share
        if readers > 1:
            return (
                f"{type(self).__name__}: this worker/rank (part {reader} of "
                f"{readers}) got no shard: use at least as many shards as workers x ranks, "
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
            braces (``train-{000000..000099}.tar``), ``::`` to join several specs,
            ``${NAME}`` for the environment variable ``WDS_NAME`` (as in webdataset), local
            globs, a directory (its .tar, .tar.gz/.tgz, .tar.bz2, .tar.xz, .tar.zst files),
            ``file://``, ``http(s)://``, ``pipe:CMD`` or any scheme a plugin registers
            (``ais://`` with aisio).
        shuffle: shuffle the shard order; it changes each epoch and is the same in
            every worker and rank, so the split stays a partition.
        seed: makes the order repeat across runs (it is mixed with the loader's seed
            where a loader gives one: seed that too, e.g. ``DataLoader2.seed(n)``).
        allow_empty: let a worker or rank with no shard yield nothing instead of raising
            :class:`NoShardsError`.
        store: this pipeline's own object-store settings, ahead of the process's
            (:func:`~wds_datapipes.storage.cloud_settings.set_store_settings`): a
            :class:`~wds_datapipes.storage.cloud_settings.StoreSettings` for every ``s3://``,
            ``gs://`` and ``az://`` URL it lists, or ``{prefix: StoreSettings}``. Its URLs
            carry them to ``load_tar`` and into DataLoader workers; they hold no secret.

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
        store: StoreArg = None,
    ):
        self.specs = urls
        self.store = PipelineStores.of(store)
        super().__init__(_ExpandedUrls(urls, self.store), shuffle=shuffle, seed=seed, allow_empty=allow_empty)

    def _describe_source(self) -> str:
        return repr(self.specs) if not isinstance(self.specs, IterDataPipe) else "the source pipe"
