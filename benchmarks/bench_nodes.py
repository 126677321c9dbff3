"""The vision recipe under torchdata.nodes (torchdata >= 0.10), beside the 2-core ceiling and DataLoader.

    python benchmarks/bench_nodes.py [--photos 2000] [--repeats 5]      (make bench-nodes: the newest stack)

On bench_pipeline.py's photos (2,000 JPEGs of 300-500 px), each made a 224x224 uint8 crop
(resize the short side to 256, centre crop) in batches of 64, by the wall clock, the rows
timed in turn at least five times (the machine's speed moves within seconds):

- the ceiling: the crops' decoder (TorchCodec's here) + torchvision's transform over bytes in memory, in 2 threads;
- ours in one process: ``decode_batches(num_threads=2, transform=...)``;
- torchdata.nodes driving that pipe: ``Loader(IterableWrapper(pipe))``, and with a
  ``Prefetcher`` (a thread of its own, which the pipe's decoding threads do not need);
- torchdata.nodes decoding per sample: ``IterableWrapper(raw samples)`` then
  ``ParallelMapper(decode + crop, 2 threads)``, ``Batcher`` and a stack;
- ``DataLoader(num_workers=2)`` with ``decode_batches`` in the workers (kept across epochs).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
import torchvision
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torchdata.nodes as tn
from bench_pipeline import BATCH, EVAL, Table, bare_vision, ours_vision, torchvision_transform
from shards import make_photo_shards

import wds_datapipes as wd
from wds_datapipes.decoding.vision import tensor_decoders


def nodes_over_our_pipe(files: list[str], prefetch: bool):
    node = tn.IterableWrapper(ours_vision(files, EVAL, 2))
    return tn.Loader(tn.Prefetcher(node, prefetch_factor=2) if prefetch else node)


def nodes_per_sample(files: list[str]):
    crop = torchvision_transform(EVAL)
    decode_jpeg = tensor_decoders()["JPEG"]  # TorchCodec's on this stack, as in our crops and the ceiling

    def decode(sample: dict) -> tuple[torch.Tensor, int]:
        return crop(decode_jpeg(torch.frombuffer(bytearray(sample["jpg"]), dtype=torch.uint8))), int(sample["cls"])

    def stack(batch: list) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.stack([image for image, _ in batch]), torch.tensor([label for _, label in batch])

    raw = tn.IterableWrapper(wd.ShardLister(files).load_tar().group_by_key())
    node = tn.ParallelMapper(raw, map_fn=decode, num_workers=2, method="thread", in_order=True)
    node = tn.Mapper(tn.Batcher(node, batch_size=BATCH, drop_last=False), map_fn=stack)
    return tn.Loader(tn.Prefetcher(node, prefetch_factor=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "wds-datapipes-bench"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    import torchdata

    print(f"machine: {os.cpu_count()} cores, torch {torch.__version__}, torchdata {torchdata.__version__}, "
          f"torchvision {torchvision.__version__}")
    photos = make_photo_shards(os.path.join(args.data, "photos"), args.photos)
    jpgs = [s["jpg"] for s in wd.ShardLister(photos).load_tar().group_by_key()]
    print(f"data: {len(jpgs)} photos in {len(photos)} shards; samples/s by the wall clock, best of "
          f"{max(args.repeats, 5)} turns\n")
    table = Table(args.repeats)
    table.cpu = False
    workers = DataLoader(ours_vision(photos, EVAL, 0), batch_size=None, num_workers=2, persistent_workers=True)
    sum(1 for _ in workers)  # its workers start: the rows time later epochs
    loaders = {"nodes over ours": nodes_over_our_pipe(photos, False), "prefetched": nodes_over_our_pipe(photos, True),
               "nodes per sample": nodes_per_sample(photos)}
    rows = {
        "bare loop in 2 threads (the ceiling)": bare_vision(jpgs, EVAL, 2),
        "ours, one process, decode_batches(num_threads=2)": lambda: ours_vision(photos, EVAL, 2),
        "torchdata.nodes: Loader(IterableWrapper(ours))": lambda: loaders["nodes over ours"],
        "torchdata.nodes: Loader(Prefetcher(IterableWrapper(ours)))": lambda: loaders["prefetched"],
        "torchdata.nodes: ParallelMapper(decode + crop, 2 threads) + Batcher": lambda: loaders["nodes per sample"],
        "DataLoader(num_workers=2), decode_batches in the workers": lambda: workers,
    }
    rates = table.interleaved(rows, expect=len(jpgs), repeats=max(args.repeats, 5))
    ceiling = rates["bare loop in 2 threads (the ceiling)"]
    print("\nratios [targets]")
    for name, rate in rates.items():
        if "ceiling" not in name:
            target = " [>= 90%]" if "Loader(IterableWrapper(ours))" in name else ""
            print(f"  {name:<70} {rate / ceiling:5.0%} of the ceiling{target}")


if __name__ == "__main__":
    main()
