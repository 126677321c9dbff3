"""What bench_stats times, stats off and on: the raw paths by member places and the README's
vision recipe (each also counted under callgrind by ``instruction_counts``: the recipe's pipe
in one process), and the switch that turns stats on around one run."""

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


def vision_pipe(files: list[str]):
    """The pipe of the README's recipe for photos, with its 224x224 crops: what each loader worker runs."""
    return (wd.ShardLister(files, shuffle=True, seed=0).load_tar().group_by_key()
            .shuffle_samples(200)
            .decode_batches("torchrgb8", batch_size=32, transform=wd.RandomResizedCrop(224, seed=0))
            .to_tuple("jpg", "cls"))


def readme_vision(files: list[str]) -> DataLoader:
    """The README's recipe for photos on 2 cores: its pipe under DataLoader with 2 workers."""
    return DataLoader(vision_pipe(files), batch_size=None, num_workers=2, persistent_workers=True,
                      generator=torch.Generator().manual_seed(0))


# What instruction_counts counts, by case: (the data it reads: "index" or "photos", the pipe, read
# through wd.stats.watch when stats are on). The vision recipe runs its pipe in the one process
# callgrind follows: every stage of a worker's, the loop's watch; not the hand-over between processes.
COUNTED: dict[str, tuple[str, Callable[[object], Iterable], bool]] = {
    "1kb-in-order": ("index", CASES_BY_PLACES["1kb-in-order"], False),
    "1kb-shuffled": ("index", CASES_BY_PLACES["1kb-shuffled"], False),
    "vision-pipe": ("photos", vision_pipe, True),
}


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
