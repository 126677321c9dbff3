"""Seeds for the random pipes: the user's, the loader's, the epoch and the worker, mixed."""

from __future__ import annotations

import random

import torch


def worker_and_rank() -> tuple[int, int]:
    """(DataLoader worker id, distributed rank); 0 where there is none."""
    info = torch.utils.data.get_worker_info()
    worker = info.id if info is not None else 0
    dist = torch.distributed
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    return worker, rank


def epoch_rng(*parts: object) -> random.Random:
    """A generator seeded from ``parts``; string seeds hash the same in every process."""
    return random.Random("/".join(map(str, parts)))
