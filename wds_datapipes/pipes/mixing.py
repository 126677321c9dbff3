"""``RandomMix``: items drawn at random, by weight, from several pipes; for pipelines without an index.

Not exact: each item's source is a weighted draw, so an epoch's shares are right only on
average and ranks may end with different numbers of batches. For exact shares, equal
batches on every rank and resumable epochs, index the datasets and use
:class:`~wds_datapipes.MixedEpochs`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import TypeVar

from ..pipe_base import Pipe
from ..stats.probe import probe as stats_probe
from ..stats.settings import current_settings
from ..topology import EpochSeed, worker_and_rank
from ..torch_datapipes import IterDataPipe

T = TypeVar("T")
STOPS = ("first_exhausted", "all_exhausted")


class RandomMix(Pipe[T]):
    """Yields items of several pipes, each drawn from a pipe chosen at random by weight.

    webdataset's ``RandomMix``, with draws that repeat with a seed, change every epoch and
    differ between workers and ranks (as ``shuffle_samples``' do: ``seed=``, the loader's
    seed, the epoch, the worker and the rank). Dict items get ``__source__``, the pipe's
    name. Not exact (see the module): :class:`~wds_datapipes.MixedEpochs` is.

    Args:
        datapipes: ``{name: pipe}``, or a list of pipes (named ``"0"``, ``"1"``, ...).
        weights: one per pipe (a mapping by name, or a list), >= 0; default: equal.
        stop: ``"first_exhausted"``: the epoch ends when any pipe runs out (webdataset's
            default); ``"all_exhausted"``: a pipe that runs out is left out and the rest go on.
        seed: the user's seed (see ``shuffle_samples``).

    Example:
        >>> web = wd.ShardLister("web/train-{000..099}.tar", shuffle=True).load_tar().group_by_key()
        >>> books = wd.ShardLister("books/train-{000..009}.tar", shuffle=True).load_tar().group_by_key()
        >>> dp = wd.RandomMix({"web": web, "books": books}, weights={"web": 0.8, "books": 0.2}, seed=0)
    """

    def __init__(self, datapipes: Mapping[str, IterDataPipe[T]] | Sequence[IterDataPipe[T]],
                 weights: Mapping[str, float] | Sequence[float] | None = None, stop: str = "first_exhausted",
                 seed: int | None = None):
        if isinstance(datapipes, Mapping):
            self.names, self.datapipes = list(datapipes), list(datapipes.values())
        else:
            self.datapipes = list(datapipes)
            self.names = [str(i) for i in range(len(self.datapipes))]
        if not self.datapipes:
            raise ValueError("RandomMix needs at least one pipe")
        if weights is None:
            weights = [1.0] * len(self.datapipes)
        elif isinstance(weights, Mapping):
            unknown = sorted(set(weights) - set(self.names))
            if unknown:
                raise ValueError(f"weights name pipes that are not in the mix: {unknown}; its pipes: {self.names}")
            weights = [weights.get(name, 0.0) for name in self.names]
        self.weights = [float(w) for w in weights]
        if len(self.weights) != len(self.datapipes):
            raise ValueError(f"{len(self.weights)} weights for {len(self.datapipes)} pipes")
        if any(not (math.isfinite(w) and w >= 0) for w in self.weights) or not any(self.weights):
            raise ValueError(f"weights must be finite, >= 0, and not all 0: {self.weights}")
        if stop not in STOPS:
            raise ValueError(f"stop must be one of {STOPS}, not {stop!r}")
        self.stop = stop
        self.seeds = EpochSeed(seed)
        self._stats = current_settings()  # stats on or off travel with the pipe

    _stats = None  # a pipe pickled before stats existed measures nothing

    def set_seed(self, seed: int) -> RandomMix[T]:
        """Seeds the draws (the loaders call it with their seed); returns the pipe."""
        self.seeds.set_seed(seed)
        return self

    def set_epoch(self, epoch: int) -> None:
        """The next epoch (its draws come from the seeds and the epoch)."""
        self.seeds.epoch = epoch

    def __len__(self) -> int:
        raise TypeError("RandomMix has no length: how many items it yields depends on its draws")

    def __iter__(self) -> Iterator[T]:
        rng = self.seeds.next_rng(*worker_and_rank())
        probe = stats_probe(self._stats)
        # stats: the draws per source against the weights, and each source's I/O under its name
        mix = probe.mixture("RandomMix", self.seeds.epoch - 1, self.names, self.weights) if probe else None
        live = [(name, iter(pipe), weight, i) for i, (name, pipe, weight)
                in enumerate(zip(self.names, self.datapipes, self.weights)) if weight > 0]
        while live:
            name, source, _, i = rng.choices(live, weights=[entry[2] for entry in live])[0]
            if probe is None:
                item = next(source, _END)
            else:
                probe.source = name
                item = next(source, _END)
                probe.source = None
            if item is _END:
                if self.stop == "first_exhausted":
                    return
                live = [entry for entry in live if entry[0] != name]
                continue
            if isinstance(item, dict):
                item["__source__"] = name
            if mix is not None:
                mix.counts[i] += 1
            yield item


_END = object()
