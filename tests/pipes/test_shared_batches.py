"""A loader worker's shared-memory batches: written again only once no other process holds them."""

from __future__ import annotations

import multiprocessing
import sys

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from wds_datapipes.pipes import shared_batches
from wds_datapipes.pipes.batching import new_batch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="leases on /dev/shm: Linux")

SHAPE = (8, 3, 64, 64)


class Filled(IterableDataset):
    """Batches from new_batch, each filled with its number; with the worker's count of buffers."""

    def __init__(self, count: int, kept_in_worker: int = 0):
        self.count, self.kept_in_worker = count, kept_in_worker

    def __iter__(self):
        kept = []
        for i in range(self.count):
            batch = new_batch(SHAPE)
            batch.fill_(i % 251)
            if self.kept_in_worker:
                kept = [*kept, batch][-self.kept_in_worker:]  # the worker holds these too
                assert all(int(b.min()) == int(b.max()) == n % 251 for n, b in zip(range(i - len(kept) + 1, i + 1), kept))
            yield batch, len(shared_batches._buffers)


def _drain(dataset: IterableDataset, held: int) -> tuple[list[int], int]:
    """Reads the batches in a 1-worker DataLoader, holding the last ``held`` and checking them all
    against their numbers at every step; returns the numbers held at the end and the buffer count."""
    loader = DataLoader(dataset, batch_size=None, num_workers=1, timeout=60,
                        multiprocessing_context=multiprocessing.get_context("fork"))
    kept: list[tuple[int, torch.Tensor]] = []
    buffers = 0
    for i, (batch, buffers) in enumerate(loader):
        kept = [*kept, (i, batch)][-held:]
        for n, b in kept:  # oracle: each batch still holds the number it was filled with
            assert int(b.min()) == int(b.max()) == n % 251, f"batch {n} was written over while held"
    return [n for n, _ in kept], buffers


@pytest.mark.timeout(120)
def test_batches_the_main_process_holds_are_never_written_again_and_the_others_are_reused():
    numbers, buffers = _drain(Filled(60), held=4)
    assert numbers == [56, 57, 58, 59]
    assert 4 < buffers <= shared_batches.MAX_BUFFERS  # 60 batches in a handful of buffers


@pytest.mark.timeout(120)
def test_batches_the_worker_itself_still_holds_are_not_reused():
    numbers, buffers = _drain(Filled(40, kept_in_worker=3), held=2)
    assert numbers == [38, 39] and buffers <= shared_batches.MAX_BUFFERS


@pytest.mark.timeout(120)
def test_when_every_buffer_is_held_batches_are_made_fresh_and_stay_intact():
    numbers, buffers = _drain(Filled(30), held=shared_batches.MAX_BUFFERS + 6)
    assert numbers == list(range(30 - shared_batches.MAX_BUFFERS - 6, 30))
    assert buffers == shared_batches.MAX_BUFFERS


def test_in_the_main_process_batches_are_private_memory():
    assert not new_batch(SHAPE).is_shared() and shared_batches._buffers == []
