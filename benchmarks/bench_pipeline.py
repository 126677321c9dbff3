"""Throughput of wds_datapipes against its peers on the same shards, in one run.

    python benchmarks/bench_pipeline.py [--shards 8] [--per-shard 1000] [--repeats 2]

Generates shards of 256x256 JPEG + class label (reused between runs), then times:

1. raw: grouped samples, no decoding: ours, ours without the load_tar/group_by_key
   fusion, webdataset.WebDataset, torchdata's load_from_tar().webdataset(), and the
   member-level readers (ours vs stdlib tarfile);
2. decoded, one process: JPEG -> uint8 CHW tensor + int label, batches of 64: ours
   (decode_batches, and decode().to_tuple().batch_samples()), webdataset's
   .decode("torchrgb8").to_tuple().batched(64), and the bare decoder (decode_image in a
   loop over the same images, already in memory);
3. two cores: the README's recommended configuration (and alternatives) against
   webdataset's recipe under DataLoader(num_workers=2).

Each row is the best of --repeats runs after a warm-up read (page cache), so ratios
compare like with like. One-process rows count this process's CPU time (steadier than
wall time where other work shares the machine); two-core rows count wall time. Prints
samples/s and the ratios the README quotes.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tarfile
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import braceexpand
import torch
from torch.utils.data import DataLoader, IterDataPipe

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore", message=r"(?s).*'datapipes', 'dataloader2' modules are deprecated")

import webdataset as wds
from shards import make_jpeg_shards
from torchdata.dataloader2 import DataLoader2, MultiProcessingReadingService
from torchdata.datapipes.iter import FileOpener, IterableWrapper

import wds_datapipes as wd
from wds_datapipes.decoding import decode_image
from wds_datapipes.tar_reader import iter_tar_members

BATCH = 64


class _PassThrough(IterDataPipe):
    """Hides TarLoader's type from group_by_key, to time the unfused path."""

    def __init__(self, source: IterDataPipe):
        self.source = source

    def __iter__(self):
        yield from self.source


def count_samples(items: Iterable) -> int:
    """Samples in an iterable of samples or of (images, labels) batches."""
    n = 0
    for item in items:
        n += len(item[1]) if isinstance(item, (tuple, list)) else 1
    return n


def timed(make: Callable[[], Iterable], repeats: int, clock: Callable[[], float]) -> tuple[float, int]:
    """(best samples/s, samples) over ``repeats`` fresh iterations of ``make()``."""
    best, count = 0.0, 0
    for _ in range(repeats):
        start = clock()
        count = count_samples(make())
        best = max(best, count / (clock() - start))
    return best, count


def tarfile_members(files: list[str]):
    for path in files:
        with tarfile.open(path, mode="r|") as archive:
            for info in archive:
                if info.isreg():
                    archive.extractfile(info).read()
                    yield info.name


def our_members(files: list[str]):
    for path in files:
        with open(path, "rb", buffering=0) as stream:
            for name, _ in iter_tar_members(stream, path):
                yield name


def bare_decoder(files: list[str]):
    """The decoder alone, one thread, over images already read: what decoding costs."""
    pairs = [(s["jpg"], s["cls"]) for s in wd.ShardLister(files).load_tar().group_by_key()]

    def run():
        for jpg, cls in pairs:
            decode_image(jpg, "torchrgb8")
            int(cls)
            yield jpg

    return run


def bare_decoder_threads(files: list[str], threads: int):
    """The decoder alone in a pool of ``threads``: what decoding can reach on these cores."""
    jpgs = [s["jpg"] for s in wd.ShardLister(files).load_tar().group_by_key()]

    def decode(jpg: bytes) -> bytes:
        decode_image(jpg, "torchrgb8")
        return jpg

    def run():
        with ThreadPoolExecutor(threads) as pool:
            yield from pool.map(decode, jpgs, chunksize=16)

    return run


def _decode_all(jpgs: list[bytes]) -> int:
    for jpg in jpgs:
        decode_image(jpg, "torchrgb8")
    return len(jpgs)


def bare_decoder_processes(files: list[str], processes: int):
    """The decoder alone in ``processes`` forked processes (no GIL shared): the cores' own limit."""
    jpgs = [s["jpg"] for s in wd.ShardLister(files).load_tar().group_by_key()]
    parts = [jpgs[i::processes] for i in range(processes)]

    def run():
        with multiprocessing.get_context("fork").Pool(processes) as pool:
            done = sum(pool.map(_decode_all, parts))
        yield from range(done)

    return run


def ours_decoded(url: str, threads: int = 0) -> IterDataPipe:
    return (
        wd.ShardLister(url).load_tar().group_by_key()
        .decode("torchrgb8", num_threads=threads).to_tuple("jpg", "cls").batch_samples(BATCH)
    )


def ours_decoded_into_batches(url: str, threads: int = 0) -> IterDataPipe:
    return (
        wd.ShardLister(url).load_tar().group_by_key()
        .decode_batches("torchrgb8", batch_size=BATCH, num_threads=threads).to_tuple("jpg", "cls")
    )


def webdataset_decoded(url: str):
    return wds.WebDataset(url, shardshuffle=False).decode("torchrgb8").to_tuple("jpg", "cls").batched(BATCH)


def through_dataloader2(dp: IterDataPipe, workers: int):
    loader = DataLoader2(dp, reading_service=MultiProcessingReadingService(num_workers=workers))
    try:
        yield from loader
    finally:
        loader.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--per-shard", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "wds-datapipes-bench"))
    args = parser.parse_args()
    torch.set_num_threads(1)  # the loaders' own threads and processes are what is measured

    url = make_jpeg_shards(args.data, shards=args.shards, per_shard=args.per_shard)
    files = list(braceexpand.braceexpand(url))
    total = args.shards * args.per_shard
    print(f"{args.shards} shards x {args.per_shard} samples (256x256 JPEG + cls), {os.cpu_count()} cores, "
          f"best of {args.repeats}; samples/s\n")
    count_samples(wd.ShardLister(url).load_tar())  # warm the page cache

    rows: dict[str, float] = {}

    # One-process rows: samples per CPU-second of this process, steadier than wall time
    # on a shared machine. Two-core rows: wall time, since the cores' work is the point.
    clock = time.process_time

    def row(name: str, make: Callable[[], Iterable], expect: int = total) -> float:
        rate, count = timed(make, args.repeats, clock)
        if count != expect:
            raise SystemExit(f"{name}: got {count} samples, expected {expect}")
        rows[name] = rate
        print(f"  {name:<58} {rate:>10,.0f}")
        return rate

    print("1. raw: grouped samples, no decoding (CPU time of this process)")
    ours = row("ours: list_shards().load_tar().group_by_key()", lambda: wd.ShardLister(url).load_tar().group_by_key())
    row("ours, unfused (group_by_key over a pass-through pipe)",
        lambda: wd.WebDatasetGrouper(_PassThrough(wd.ShardLister(url).load_tar())))
    webdataset = row("webdataset.WebDataset(shardshuffle=False)", lambda: wds.WebDataset(url, shardshuffle=False))
    torchdata = row("torchdata FileOpener.load_from_tar().webdataset()",
                    lambda: FileOpener(IterableWrapper(files), mode="b").load_from_tar().webdataset())
    members = row("members: our tar reader", lambda: our_members(files), 2 * total)
    stdlib = row("members: stdlib tarfile", lambda: tarfile_members(files), 2 * total)

    print("\n2. decoded, one process: uint8 CHW tensor + int label, batches of 64 (CPU time)")
    bare = row("bare decoder: decode_image(jpg, 'torchrgb8') in a loop", bare_decoder(files))
    ours_fused = row("ours: ...group_by_key().decode_batches('torchrgb8', batch_size=64)",
                     lambda: ours_decoded_into_batches(url))
    ours_dec = row("ours: ...group_by_key().decode('torchrgb8').to_tuple().batch_samples(64)",
                   lambda: ours_decoded(url))
    wds_dec = row("webdataset: .decode('torchrgb8').to_tuple().batched(64)", lambda: webdataset_decoded(url))

    print("\n3. two cores (wall time)")
    clock = time.perf_counter
    ceiling = row("bare decoder in 2 threads (the decoding ceiling)", bare_decoder_threads(files, 2))
    row("bare decoder in 2 processes (no shared GIL)", bare_decoder_processes(files, 2))
    recommended = row("ours, recommended: one process, decode_batches(num_threads=2)",
                      lambda: ours_decoded_into_batches(url, threads=2))
    row("ours: one process, decode(num_threads=2).batch_samples(64)", lambda: ours_decoded(url, threads=2))
    row("ours: DataLoader2, 2 worker processes, decode_batches",
        lambda: through_dataloader2(ours_decoded_into_batches(url), 2))
    row("ours: DataLoader(num_workers=2), decode_batches",
        lambda: DataLoader(ours_decoded_into_batches(url), batch_size=None, num_workers=2))
    wds_dl = row("webdataset recipe: DataLoader(num_workers=2)",
                 lambda: DataLoader(webdataset_decoded(url), batch_size=None, num_workers=2))

    print("\nratios (targets in brackets)")
    print(f"  raw, ours / webdataset:                      {ours / webdataset:6.1f}x  [>= 10x]")
    print(f"  raw, ours / torchdata:                       {ours / torchdata:6.1f}x")
    print(f"  raw, fused / unfused:                        {ours / rows[next(k for k in rows if 'unfused' in k)]:6.2f}x")
    print(f"  members, our reader / tarfile:               {members / stdlib:6.1f}x")
    print(f"  decoded, decode_batches / bare decoder:      {ours_fused / bare:6.0%}  [>= 85%]")
    print(f"  decoded, decode().batch_samples() / bare:    {ours_dec / bare:6.0%}")
    print(f"  decoded, decode_batches / webdataset:        {ours_fused / wds_dec:6.1f}x")
    print(f"  2 cores, recommended / webdataset recipe:    {recommended / wds_dl:6.1f}x  [>= 6x]")
    one_core = rows["bare decoder: decode_image(jpg, 'torchrgb8') in a loop"]
    print(f"  2 cores, decoding: 2 threads / 1 core:       {ceiling / one_core:6.2f}x, "
          f"2 processes / 1 core: {rows['bare decoder in 2 processes (no shared GIL)'] / one_core:.2f}x")
    print(f"  2 cores, recommended / decoding ceiling:     {recommended / ceiling:6.0%}"
          f"  (6x webdataset would need {6 * wds_dl:,.0f}/s, {6 * wds_dl / ceiling:.1f}x the ceiling)")


if __name__ == "__main__":
    main()
