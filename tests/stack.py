"""What the installed stack offers: DataLoader2 exists in torchdata <= 0.9 only."""

from __future__ import annotations

import contextlib
import warnings

import pytest

try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchdata.dataloader2 import DataLoader2
except ImportError:
    DataLoader2 = None

needs_dataloader2 = pytest.mark.skipif(
    DataLoader2 is None, reason="torchdata >= 0.10 has no DataLoader2 (its last release with it is 0.9)"
)


@contextlib.contextmanager
def two_worker_loader(dp, seed: int = 0):
    """``dp`` read by 2 worker processes: DataLoader2 with wds_datapipes' reading service where
    torchdata has it, else torch's DataLoader. Iterate it once per epoch."""
    import torch
    from torch.utils.data import DataLoader

    import wds_datapipes as wd

    if DataLoader2 is None:
        yield DataLoader(dp, batch_size=None, num_workers=2, generator=torch.Generator().manual_seed(seed))
        return
    loader = DataLoader2(dp, reading_service=wd.MultiProcessingReadingService(num_workers=2))
    loader.seed(seed)
    try:
        yield loader
    finally:
        loader.shutdown()
