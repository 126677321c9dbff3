"""The ``shuffle_samples`` pipe: a seeded buffer shuffle that changes each epoch."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import TypeVar

from ..pipe_base import Pipe
from ..topology import EpochSeed, worker_and_rank
from ..torch_datapipes import IterDataPipe, functional_datapipe

T = TypeVar("T")


@functional_datapipe("shuffle_samples")
class Shuffler(Pipe[T]):
    """Yields its source's items in a shuffled order, from a buffer (functional name: ``shuffle_samples``).

    The order changes every epoch, differs between workers and ranks, and repeats from
    run to run when seeded (``seed=`` here, and the loader's seed: ``DataLoader2.seed(n)``
    or ``DataLoader(generator=...)``, which it receives through ``set_seed``).

    Args:
        source_datapipe: the items to shuffle.
        bufsize: how many items are held and drawn from at random.
        initial: how many items to hold before the first one is yielded (at most
            ``bufsize``); smaller starts faster but shuffles the first items less.
        seed: the user's seed. With neither it nor a loader's seed, each run differs.

    Example:
        >>> samples.shuffle_samples(bufsize=1000, seed=0)
    """

    orders_name = "shuffle_samples"  # how a checkpoint's refusal names it
    draws_orders = True

    def __init__(self, source_datapipe: IterDataPipe[T], bufsize: int = 1000, initial: int = 100,
                 seed: int | None = None):
        if bufsize < 1:
            raise ValueError(f"bufsize must be at least 1, got {bufsize}")
        self.source_datapipe = source_datapipe
        self.bufsize = bufsize
        self.initial = max(1, min(initial, bufsize))
        self.seeds = EpochSeed(seed)

    def set_seed(self, seed: int) -> Shuffler[T]:
        """Seeds the shuffle (the loaders call it with their seed); returns the pipe."""
        self.seeds.set_seed(seed)
        return self

    def set_epoch(self, epoch: int) -> None:
        """The next epoch (its order is drawn from the seeds and the epoch)."""
        self.seeds.epoch = epoch

    def __iter__(self) -> Iterator[T]:
        rng = self.seeds.next_rng(*worker_and_rank())
        buf: list[T] = []
        source = iter(self.source_datapipe)
        for item in source:
            buf.append(item)
            if len(buf) < self.bufsize:  # grow towards bufsize: take a second item per draw
                extra = next(source, _END)
                if extra is not _END:
                    buf.append(extra)  # type: ignore[arg-type]  # not _END: an item of the source
            if len(buf) >= self.initial:
                yield _draw(buf, rng)
        while buf:
            yield _draw(buf, rng)


_END = object()


def _draw(buf: list, rng: random.Random):
    i = rng.randrange(len(buf))
    buf[i], buf[-1] = buf[-1], buf[i]
    return buf.pop()
