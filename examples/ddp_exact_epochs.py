"""DDP over exact epochs: equal batches on every rank, and checkpoints that resume exactly.

    torchrun --nproc_per_node=2 examples/ddp_exact_epochs.py [--data DIR] [--epochs 3] [--workers 2]
        [--checkpoint data/ddp-ckpt.pt] [--checkpoint-every 10] [--stop-after STEPS]

Runs on CPU (gloo). Each rank:

1. (rank 0 first) writes scikit-learn's digits into shards of uneven sizes and indexes them,
   as ``python -m wds_datapipes index --places data/ddp/digits-*.tar -o data/ddp/index.json`` does;
2. reads ``ExactEpochs(index, batch_size=32)`` -> decode -> to_tuple -> batches under a
   ``StatefulDataLoader`` with 2 workers: every rank gets the same number of batches, so
   DDP's all-reduce in every step never waits on a rank that ran out;
3. every ``--checkpoint-every`` steps saves the model, the optimizer, and each rank's
   loader state (gathered on rank 0). Stopped (``--stop-after``, or a crash) and started
   again with the same ``--checkpoint``, it goes on with exactly the batches the stopped
   run would have read next.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import warnings

import numpy as np
import torch
import torch.distributed as dist
import webdataset as wds
from PIL import Image
from sklearn.datasets import load_digits
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader

import wds_datapipes as wd

BATCH = 32
warnings.filterwarnings("ignore", message="'set_vital' is deprecated")  # StatefulDataLoader on torch >= 2.13


def write_shards(folder: str) -> str:
    """Digits into 7 shards of uneven sizes, and their index; returns the index's path."""
    index = os.path.join(folder, "index.json")
    if os.path.exists(index):
        return index
    os.makedirs(folder, exist_ok=True)
    digits = load_digits()
    images = (digits.images * (255 / 16)).astype(np.uint8)
    bounds = np.cumsum([0, 400, 120, 290, 30, 360, 190, 407])  # 1,797 samples
    shards = []
    for s in range(len(bounds) - 1):
        path = os.path.join(folder, f"digits-{s:02d}.tar")
        with wds.TarWriter(path) as writer:
            for i in range(bounds[s], bounds[s + 1]):
                png = io.BytesIO()
                Image.fromarray(images[i]).save(png, format="PNG")
                writer.write({"__key__": f"digit{i:05d}", "png": png.getvalue(), "cls": int(digits.target[i])})
        shards.append(path)
    wd.ShardIndex.from_scans(wd.build_index(shards, places=True), relative_to=index).save(index)
    return index


def make_loader(index: str, workers: int) -> StatefulDataLoader:
    dp = (wd.ExactEpochs(index, batch_size=BATCH, seed=0)  # rank and world from torch.distributed
          .decode("torchl").to_tuple("png", "cls", "__key__").batch_samples(BATCH))
    return StatefulDataLoader(dp, batch_size=None, num_workers=workers, persistent_workers=workers > 0)


def main() -> None:
    parser = argparse.ArgumentParser(description="DDP over exact epochs, with exact resumption.")
    parser.add_argument("--data", default=os.path.join("data", "ddp"))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--checkpoint", default=os.path.join("data", "ddp-checkpoint.pt"))
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--stop-after", type=int, default=-1, help="stop after this many steps (a crash)")
    parser.add_argument("--log-keys", help="write the keys each step trained on here (rank 0)")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0:
        write_shards(args.data)
    dist.barrier()
    index = os.path.join(args.data, "index.json")

    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loader = make_loader(index, args.workers)
    epoch, step = 0, 0
    if os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint, weights_only=False)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loaders"][rank])  # the rest of the saved epoch comes first
        epoch, step = saved["epoch"], saved["step"]
        if rank == 0:
            print(f"resumed at epoch {epoch}, step {step}")
    log = train(args, model, optimizer, loader, epoch, step)
    _write_log(args.log_keys, rank, log)
    # Let DDP and the loader's workers go while the process group still exists, then leave
    # it together: in another order a rank can hang on its way out.
    del model, optimizer, loader
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def train(args, model, optimizer, loader: StatefulDataLoader, epoch: int, step: int) -> list:
    """Epochs ``epoch``.. of training from step ``step``; returns the keys of every step's batch."""
    rank, world = dist.get_rank(), dist.get_world_size()
    log = []
    while epoch < args.epochs:
        seen = torch.zeros(1)
        for images, labels, keys in loader:
            loss = nn.functional.cross_entropy(model(images.float()), labels)
            optimizer.zero_grad()
            loss.backward()  # DDP all-reduces the gradients: every rank takes part in every step
            optimizer.step()
            step += 1
            seen += len(labels)
            log.append(list(keys))
            if step % args.checkpoint_every == 0 or step == args.stop_after:
                states = [None] * world
                dist.all_gather_object(states, loader.state_dict())
                if rank == 0:
                    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                                "loaders": states, "epoch": epoch, "step": step}, args.checkpoint)
            if step == args.stop_after:
                if rank == 0:
                    print(f"stopped after step {step} (epoch {epoch})")
                return log
        dist.all_reduce(seen)
        if rank == 0:
            print(f"epoch {epoch}: {step} steps so far, {int(seen.item())} samples on {world} ranks, "
                  f"loss {loss.item():.3f}")
        epoch += 1
    return log


def _write_log(path: str | None, rank: int, log: list) -> None:
    if path and rank == 0:
        with open(path, "w") as out:
            json.dump(log, out)


if __name__ == "__main__":
    main()
