"""Writing shards from an ImageFolder tree: ours against webdataset's ShardWriter and ``cp -r``.

    python benchmarks/bench_write.py [--files 4000] [--rounds 5]

The input: ``--files`` files of 50-150 KB of random bytes in 40 class folders, read once
so they sit in the page cache. A copy-only conversion to shards of 1000 samples (each
sample its file and its class), timed per round, the median reported:

- ``cp -r``: the same bytes copied file by file (the disk's limit for this work);
- webdataset 1.0.2's ``ShardWriter`` loop (read each file, ``write({"jpg": ..., "cls": ...})``);
- ours, ``write_shards(imagefolder_samples(...))``, 1 and 2 processes, files copied by the
  OS (``os.copy_file_range``) into the shards, the index (offsets and member places)
  taken in the same pass; and ours with the index switched off, for the index's cost.

No run fsyncs (``cp`` does not). Timings on a shared machine move with its load: compare
ratios from one run. The CPU time per file (user + system, workers and ``cp`` included)
moves less with the load than the wall time does.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import tempfile
import time

from wds_datapipes.epochs.places import ShardPlaces
from wds_datapipes.writing import shard_file, writer
from wds_datapipes.writing.sources import imagefolder_samples
from wds_datapipes.writing.writer import write_shards


def make_tree(root: str, files: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    total = 0
    for i in range(files):
        folder = os.path.join(root, f"class{i % 40:02d}")
        os.makedirs(folder, exist_ok=True)
        data = rng.randbytes(rng.randrange(50_000, 150_000))
        total += len(data)
        with open(os.path.join(folder, f"img{i:06d}.jpg"), "wb") as out:
            out.write(data)
    for folder, _, names in os.walk(root):  # into the page cache
        for name in names:
            with open(os.path.join(folder, name), "rb") as stream:
                stream.read()
    return total


def run_cp(src: str, dst: str) -> None:
    subprocess.run(["cp", "-r", src, dst], check=True)


def run_webdataset(src: str, dst: str) -> None:
    import webdataset as wds

    os.makedirs(dst)
    classes = sorted(os.listdir(src))
    with wds.ShardWriter(os.path.join(dst, "wds-%06d.tar"), maxcount=1000, verbose=0) as sink:
        for number, name in enumerate(classes):
            folder = os.path.join(src, name)
            for file in sorted(os.listdir(folder)):
                with open(os.path.join(folder, file), "rb") as stream:
                    sink.write({"__key__": f"{name}/{file[:-4]}", "jpg": stream.read(), "cls": number})


def run_ours(src: str, dst: str, workers: int) -> None:
    write_shards(imagefolder_samples(src), os.path.join(dst, "ours-%06d.tar"), maxcount=1000, workers=workers,
                 fsync=False)


def run_ours_no_index(src: str, dst: str) -> None:
    """Ours with member places and the index file switched off (the progress record stays)."""
    places, join = shard_file.places_of_members, writer.join_index
    shard_file.places_of_members = lambda url, members, stamp: ShardPlaces(None)
    writer.join_index = lambda index, world: None
    try:
        run_ours(src, dst, 1)
    finally:
        shard_file.places_of_members, writer.join_index = places, join


def _cpu_seconds() -> float:
    """User + system CPU time of this process and of its finished children (cp, the workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-write-")
    try:
        src = os.path.join(work, "src")
        total = make_tree(src, args.files)
        print(f"{args.files} files, {total / 1e6:.0f} MB in the page cache; {args.rounds} rounds, median; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        runs = {
            "cp -r": run_cp,
            "webdataset ShardWriter": run_webdataset,
            "ours, 1 process": lambda s, d: run_ours(s, d, 1),
            "ours, 2 processes": lambda s, d: run_ours(s, d, 2),
            "ours, 1 process, no index": run_ours_no_index,
        }
        times: dict[str, list[float]] = {name: [] for name in runs}
        cpu: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, run in runs.items():  # interleaved: a change in the machine's load hits every row
                dst = os.path.join(work, "dst")
                used = _cpu_seconds()
                started = time.perf_counter()
                run(src, dst)
                times[name].append(time.perf_counter() - started)
                cpu[name].append(_cpu_seconds() - used)
                shutil.rmtree(dst)
        median = {name: statistics.median(t) for name, t in times.items()}
        for name, seconds in median.items():
            print(f"{name:28s} {args.files / seconds:8.0f} files/s {total / seconds / 1e6:7.0f} MB/s "
                  f"(min {args.files / max(times[name]):.0f}, max {args.files / min(times[name]):.0f}); "
                  f"CPU {statistics.median(cpu[name]) * 1e6 / args.files:.0f} us/file")
        ours = median["ours, 1 process"]
        print(f"ours 1 process / webdataset: {median['webdataset ShardWriter'] / ours:.2f}x (goal >= 3x)")
        print(f"ours 2 processes / webdataset: {median['webdataset ShardWriter'] / median['ours, 2 processes']:.2f}x")
        print(f"ours 1 process / cp -r: {median['cp -r'] / ours:.0%} of cp's rate (goal >= 80%)")
        print(f"index in the same pass: {ours / median['ours, 1 process, no index'] - 1:+.1%} time (goal <= +5%)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
