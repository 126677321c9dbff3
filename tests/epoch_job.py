"""A training loop over exact epochs, run as its own process by the tests.

    python tests/epoch_job.py --index I --loader direct|dataloader|dataloader2|stateful --out OUT [...]

It reads ``--epochs`` epochs of ``ExactEpochs(...).batch_samples(B)`` (no model), or with
``--mix SPEC`` (a JSON file of MixedEpochs' arguments: sources, weights, batching, ...) of
``MixedEpochs(...)``, and writes every batch's keys, pad flags (and sources) to OUT as JSON. With ``--stop-after K`` it stops after K
batches and writes a checkpoint (``--state-out``); with ``--save-at K1,K2`` it writes one after each of
those batches and goes on; ``--state-in`` resumes from one. With
``--dist`` it joins a gloo process group from torch's env:// variables and all-reduces after
every batch, as DDP does, so ranks with unequal batch counts would hang.
"""

from __future__ import annotations

import argparse
import json
import warnings

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

import wds_datapipes as wd


def build(args) -> tuple[wd.ExactEpochs | wd.MixedEpochs | None, object]:
    if args.mix:
        with open(args.mix) as f:
            spec = json.load(f)
        source = wd.MixedEpochs(spec.pop("sources"), batch_size=args.batch, mode=args.mode, shuffle=bool(args.shuffle),
                                seed=7, lanes=args.lanes, block=args.block, **spec)
        return source, source.batch_samples(args.batch)
    if args.pipeline == "lister":  # shards listed and split by rank, without an index
        dp = wd.ShardLister(args.index, shuffle=True, seed=7, allow_empty=True).load_tar().group_by_key()
        return None, dp.map(_with_pad_flag).batch_samples(args.batch)
    source = wd.ExactEpochs(args.index, batch_size=args.batch, mode=args.mode, shuffle=bool(args.shuffle),
                            seed=7, lanes=args.lanes, block=args.block,
                            samples_per_epoch=args.samples_per_epoch or None)
    return source, source.batch_samples(args.batch)


def _with_pad_flag(sample: dict) -> dict:
    return {**sample, "__pad__": False}


def make_loader(args, dp):
    if args.loader == "direct":
        return dp
    if args.loader == "dataloader":
        return DataLoader(dp, batch_size=None, num_workers=args.workers,
                          persistent_workers=bool(args.persistent and args.workers))
    if args.loader == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(dp, batch_size=None, num_workers=args.workers,
                                  persistent_workers=bool(args.persistent and args.workers))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchdata.dataloader2 import DataLoader2, DistributedReadingService, SequentialReadingService
    service = wd.MultiProcessingReadingService(num_workers=args.workers)
    if args.reading == "distributed":
        service = SequentialReadingService(DistributedReadingService(), service)
    return DataLoader2(dp, reading_service=service)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--index", help="the index (or a shard glob with --pipeline lister)")
    parser.add_argument("--mix", help="a JSON file of MixedEpochs' arguments, instead of --index")
    parser.add_argument("--loader", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--persistent", type=int, default=0)
    parser.add_argument("--reading", default="multiprocessing")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--mode", default="drop")
    parser.add_argument("--shuffle", type=int, default=1)
    parser.add_argument("--lanes", type=int, default=4)
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--samples-per-epoch", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--stop-after", type=int, default=-1)
    parser.add_argument("--state-in")
    parser.add_argument("--state-out")
    parser.add_argument("--save-at", default="", help="K1,K2,...: write a checkpoint after each of these batches "
                        "to --state-out with {stop} replaced by K, and go on to the end")
    parser.add_argument("--dist", action="store_true")
    parser.add_argument("--pipeline", default="exact", help="exact (an index), or lister (INDEX is a shard glob)")
    args = parser.parse_args()

    if args.dist:
        dist.init_process_group("gloo")
    source, dp = build(args)
    save_at = {int(k) for k in args.save_at.split(",") if k}
    first_epoch, done = 0, 0
    saved = None
    if args.state_in:
        with open(args.state_in) as f:
            saved = json.load(f)
        # StatefulDataLoader resumes its iterator: the next pass is the rest of the saved
        # epoch, even if that is nothing. From a step count, a finished epoch is not resumed.
        first_epoch = saved["epoch"] + (args.loader != "stateful" and saved["batches"] == source.batches_per_epoch)
        if args.loader != "stateful":
            dp.load_state_dict(saved.get("mix") or  # a mixture's step count is saved with its mix
                               wd.EpochState(epoch=saved["epoch"], batches=saved["batches"],
                                             world=saved.get("world"), workers=saved.get("workers")))
    loader = make_loader(args, dp)
    if saved is not None and args.loader == "stateful":
        loader.load_state_dict(saved["loader"])
    epochs = []
    try:
        for epoch in range(first_epoch, args.epochs):
            if args.loader in ("dataloader", "stateful", "direct") and source is not None:
                getattr(loader, "dataset", loader).set_epoch(epoch)
            batches = []
            in_epoch = saved["batches"] if saved and epoch == saved["epoch"] else 0
            for batch in loader:
                if args.dist and source is not None:
                    step = torch.ones(1)
                    dist.all_reduce(step)  # every rank must take part in every step
                record = [list(batch["__key__"]), batch["__pad__"].tolist()]
                if "__source__" in batch:
                    record.append(list(batch["__source__"]))
                batches.append(record)
                in_epoch += 1
                done += 1
                if done == args.stop_after or done in save_at:
                    state = {"epoch": epoch, "batches": in_epoch, "world": dist.get_world_size() if args.dist else 1,
                             "workers": args.workers or 1}
                    if args.loader == "stateful":
                        state["loader"] = loader.state_dict()
                    elif isinstance(source, wd.MixedEpochs):
                        state["mix"] = source.step_state(epoch, in_epoch, state["world"], state["workers"]).to_dict()
                    with open(args.state_out.replace("{stop}", str(done)), "w") as f:
                        json.dump(state, f)
                if done == args.stop_after:
                    epochs.append(batches)
                    return
            epochs.append(batches)
    finally:
        with open(args.out, "w") as f:
            json.dump({"epochs": epochs, "first_epoch": first_epoch,
                       "batches_per_epoch": source.batches_per_epoch if source else None}, f)
        if args.loader == "dataloader2":
            loader.shutdown()
        if args.dist:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
