"""What bench_stats times, stats off and on: the raw paths by member places (also counted
under callgrind by ``instruction_counts``), the README's vision recipe, and the switch that
turns stats on around one run."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch.utils.data import DataLoader

import wds_datapipes as wd
from benchmarks.raw_reading import exact_epochs
from benchmarks.vision_loops import count_samples

CASES_BY_PLACES: dict[str, Callable[[str], Iterable]] = {
    "1kb-in-order": lambda index: exact_epochs(index, False, views=True),
    "1kb-shuffled": lambda index: exact_epochs(index, True, views=True),
}


def readme_vision(files: list[str]) -> DataLoader:
    """The README's recipe for photos on 2 cores, with its 224x224 crops for photos."""
    dp = (wd.ShardLister(files, shuffle=True, seed=0).load_tar().group_by_key()
          .shuffle_samples(200)
          .decode_batches("torchrgb8", batch_size=32, transform=wd.RandomResizedCrop(224, seed=0))
          .to_tuple("jpg", "cls"))
    return DataLoader(dp, batch_size=None, num_workers=2, persistent_workers=True,
                      generator=torch.Generator().manual_seed(0))


def switched(on: bool, make: Callable[[], Iterable], watch: bool = False) -> Callable[[], int]:
    """A harness path: stats turned on (or left off), the pipeline built and read whole, stats off again."""

    def run() -> int:
        if on:
            wd.stats.enable()
        try:
            items = make()
            return count_samples(wd.stats.watch(items) if watch and on else items)
        finally:
            wd.stats.disable()

    return run
