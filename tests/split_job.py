"""One rank of the rank x worker x loader matrix, run as its own process by tests/loaders/test_rank_splits.py.

    python tests/split_job.py --rank R --world W --port P --out OUT [--exact INDEX]

It lists the same shards under every loader it can (direct iteration, DataLoader and
StatefulDataLoader with 0 and 2 workers, DataLoader2 where torchdata has it, with and
without a DistributedReadingService where a process group exists), in four settings one
after the other: ``neither`` (no RANK/WORLD_SIZE, no process group), ``env`` (RANK and
WORLD_SIZE only, as torchrun sets them), ``both`` (those and a gloo process group from
env://) and ``group`` (a gloo process group from tcp://, with no RANK/WORLD_SIZE). It
writes, for each setting and loader, the shard URLs this rank read in each of 2 epochs
(and with ``--exact``, in the ``env`` setting, the sample keys an ExactEpochs pipeline
over the index read).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import warnings

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

import wds_datapipes as wd

SHARDS = [f"mem://split/shard-{i:02d}.tar" for i in range(8)]
EPOCHS = 2

try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchdata.dataloader2 import DataLoader2, DistributedReadingService, SequentialReadingService
except ImportError:
    DataLoader2 = None


def _lister():
    return wd.ShardLister(SHARDS, shuffle=True, seed=5)


def _items(batch) -> list[str]:
    return list(batch["__key__"]) if isinstance(batch, dict) else [batch]


def _epochs(loader, dp) -> list[list[str]]:
    epochs = []
    for epoch in range(EPOCHS):
        dp.set_epoch(epoch)  # as with a DistributedSampler: DataLoader's workers are new copies each epoch
        epochs.append([item for batch in loader for item in _items(batch)])
    return epochs


def _dataloader2(dp, workers: int, distributed: bool) -> list[list[str]]:
    service = wd.MultiProcessingReadingService(num_workers=workers) if workers else None
    if distributed:
        service = DistributedReadingService() if service is None else SequentialReadingService(
            DistributedReadingService(), service)
    loader = DataLoader2(dp, reading_service=service)
    loader.seed(3)
    try:
        return _epochs(loader, dp)
    finally:
        loader.shutdown()


def run_loaders(make, grouped: bool) -> dict[str, list[list[str]]]:
    """What this rank read of ``make()``'s pipeline under each loader."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    out = {}
    dp = make()
    out["direct"] = _epochs(dp, dp)
    # the same pipe, iterated directly, then handed to a loader with workers
    out["direct-then-DataLoader-2"] = _epochs(DataLoader(dp, batch_size=None, num_workers=2), dp)
    for workers in (0, 2):
        dp = make()
        out[f"DataLoader-{workers}"] = _epochs(DataLoader(dp, batch_size=None, num_workers=workers), dp)
        dp = make()
        out[f"StatefulDataLoader-{workers}"] = _epochs(StatefulDataLoader(dp, batch_size=None, num_workers=workers), dp)
        if DataLoader2 is not None:
            out[f"DataLoader2-{workers}"] = _dataloader2(make(), workers, distributed=False)
            if grouped:
                out[f"DataLoader2+Distributed-{workers}"] = _dataloader2(make(), workers, distributed=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--exact", help="a shard index: also read ExactEpochs over it")
    args = parser.parse_args()
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)
    pipelines = {"lister": _lister}
    if args.exact:
        pipelines["exact"] = lambda: wd.ExactEpochs(args.exact, batch_size=4, seed=1).batch_samples(4)
    result = {}

    def record(setting: str) -> None:
        grouped = dist.is_initialized()
        for name, make in pipelines.items():
            if name == "lister" or setting == "env":  # ExactEpochs' other settings: tests/epochs/test_distributed.py
                result[f"{setting}/{name}"] = run_loaders(make, grouped)

    record("neither")
    os.environ.update(RANK=str(args.rank), WORLD_SIZE=str(args.world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(args.port))
    record("env")
    dist.init_process_group("gloo", init_method="env://")
    record("both")
    dist.destroy_process_group()
    # The garbage the torn-down group's setting left must not be collected first in a forked
    # DataLoader worker: there the collection segfaults (torch 2.13 + gloo, reproducible where the
    # parent's allocation count makes the worker's fork start a collection; the second group only
    # a test makes). Collected here, in the parent, nothing is left for the workers to collect.
    gc.collect()
    for name in ("RANK", "WORLD_SIZE"):
        del os.environ[name]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port + 1}", rank=args.rank,
                           world_size=args.world)
    record("group")
    dist.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
