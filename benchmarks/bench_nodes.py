"""The vision recipe under torchdata.nodes (torchdata >= 0.10), beside the 2-core ceiling and DataLoader.

    python -m benchmarks.bench_nodes [--photos 2000] [--rounds 5] [--quick]      (make bench-nodes: the newest stack)

On bench_pipeline's photos (2,000 JPEGs of 300-500 px), each made a 224x224 uint8 crop
(resize the short side to 256, centre crop) in batches of 64, by the wall clock, the rows
timed in turn at least five rounds, the order reversed every other round (the machine's
speed moves within seconds); a row is the median of its rounds, its share of the ceiling
the median of each round's pair:

- the ceiling: the crops' decoder (TorchCodec's here) + torchvision's transform over bytes in memory, in 2 threads;
- ours in one process: ``decode_batches(num_threads=2, transform=...)``;
- torchdata.nodes driving that pipe: ``Loader(IterableWrapper(pipe))``, and with a
  ``Prefetcher`` (a thread of its own, which the pipe's decoding threads do not need);
- torchdata.nodes decoding per sample: ``IterableWrapper(raw samples)`` then
  ``ParallelMapper(decode + crop, 2 threads)``, ``Batcher`` and a stack;
- ``DataLoader(num_workers=2)`` with ``decode_batches`` in the workers (kept across epochs).

``--quick``: 64 photos, one round.
"""

from __future__ import annotations

import os

import torch
from torch.utils.data import DataLoader

import wds_datapipes as wd
from benchmarks.harness import Bench, time_in_turn
from benchmarks.shards import make_photo_shards
from benchmarks.vision_loops import BATCH, EVAL, bare_vision, counted, ours_vision, torchvision_transform
from wds_datapipes.decoding.vision import tensor_decoders

CEILING = "bare loop in 2 threads (the ceiling)"


def nodes_over_our_pipe(files: list[str], prefetch: bool):
    import torchdata.nodes as tn

    node = tn.IterableWrapper(ours_vision(files, EVAL, 2))
    return tn.Loader(tn.Prefetcher(node, prefetch_factor=2) if prefetch else node)


def nodes_per_sample(files: list[str]):
    import torchdata.nodes as tn

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


def main(argv: list[str] | None = None) -> None:
    bench = Bench("bench_nodes", __doc__, peers=("torchcodec",), rounds=5)
    bench.parser.add_argument("--photos", type=int, default=2000)
    args = bench.parse(argv)
    try:
        import torchdata.nodes  # noqa: F401
    except ImportError as exn:
        raise SystemExit(f"torchdata.nodes needs torchdata >= 0.10 (make bench-nodes runs the newest stack): {exn}")
    if args.quick:
        args.photos = min(args.photos, 64)
    rounds = args.rounds if args.quick else max(args.rounds, 5)
    torch.set_num_threads(1)
    photos = make_photo_shards(os.path.join(args.data, "photos"), args.photos)
    jpgs = [s["jpg"] for s in wd.ShardLister(photos).load_tar().group_by_key()]
    with bench.results(args):
        print(f"data: {len(jpgs)} photos in {len(photos)} shards; samples/s by the wall clock, medians of "
              f"{rounds} rounds in turn\n")
        workers = DataLoader(ours_vision(photos, EVAL, 0), batch_size=None, num_workers=2, persistent_workers=True)
        sum(1 for _ in workers)  # its workers start: the rows time later epochs
        loaders = {"nodes over ours": nodes_over_our_pipe(photos, False),
                   "prefetched": nodes_over_our_pipe(photos, True), "nodes per sample": nodes_per_sample(photos)}
        rows = {
            CEILING: bare_vision(jpgs, EVAL, 2),
            "ours, one process, decode_batches(num_threads=2)": lambda: ours_vision(photos, EVAL, 2),
            "torchdata.nodes: Loader(IterableWrapper(ours))": lambda: loaders["nodes over ours"],
            "torchdata.nodes: Loader(Prefetcher(IterableWrapper(ours)))": lambda: loaders["prefetched"],
            "torchdata.nodes: ParallelMapper(decode + crop, 2 threads) + Batcher": lambda: loaders["nodes per sample"],
            "DataLoader(num_workers=2), decode_batches in the workers": lambda: workers,
        }
        timings = time_in_turn({name: counted(make) for name, make in rows.items()}, rounds, expect=len(jpgs))
        for name in rows:
            print(f"  {name:<70} {timings.rate(name):>10,.0f}")
        print("\nratios to the ceiling, the median of the rounds' pairs (range) [goals]")
        for name in rows:
            if name != CEILING:
                goal = ">= 90%" if "Loader(IterableWrapper(ours))" in name else None
                bench.ratio(name, timings.ratio(name, CEILING), goal, percent=True)


if __name__ == "__main__":
    main()
