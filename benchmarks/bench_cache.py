"""The local shard cache against re-reading a remote dataset every epoch.

    python benchmarks/bench_cache.py [--shards 16] [--shard-mb 4] [--rate-mb 25]

Shards of random bytes are served by a local HTTP server that sends at most ``--rate-mb``
MB/s per connection (a realistic object store or web server seen from one node), and read
with ``load_tar().group_by_key()`` (no decoding): epochs 1 and 2 without the cache, with
it (limit above the dataset), and with a limit of half the dataset; then, with a
DataLoader of 2 workers, the bytes the server sent per epoch with and without the cache;
then ``ExactEpochs`` (shuffled) over the cached copies, by an index with member places
against one without (read through the tar headers).
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "shards"))

from shard_server import ShardServer

import wds_datapipes as wd

MB = 10**6


def write_shards(folder: str, shards: int, shard_mb: float, sample_kb: int = 100) -> list[str]:
    names, per_shard = [], max(1, int(shard_mb * MB // (sample_kb * 1000)))
    for s in range(shards):
        name = f"shard-{s:04d}.tar"
        with tarfile.open(os.path.join(folder, name), "w") as tar:
            for i in range(per_shard):
                data = os.urandom(sample_kb * 1000)
                info = tarfile.TarInfo(f"s{s:04d}-{i:05d}.bin")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        names.append(name)
    return names


def key(sample: dict) -> str:
    return sample["__key__"]


def epoch(urls: list[str], workers: int = 0) -> tuple[float, int]:
    pipe = wd.ShardLister(urls).load_tar().group_by_key()
    began = time.perf_counter()
    if workers:
        from torch.utils.data import DataLoader

        count = sum(1 for _ in DataLoader(pipe.map(key), num_workers=workers, batch_size=None))
    else:
        count = sum(1 for _ in pipe)
    return time.perf_counter() - began, count


def exact_epochs(urls: list[str], work: str, epochs: int) -> None:
    """Samples/s of ExactEpochs' later epochs from the cached copies: by member places, and
    through headers; with each opening checked against the source (a HEAD), and with checks
    at most every 300 s."""
    print("\nExactEpochs, shuffled, one process, epochs 2 on (every shard cached): samples/s")
    print(f"{'':<34}{'revalidate=True':>18}{'revalidate=300':>18}")
    rates: dict[str, list[float]] = {}
    for label, places in (("index with member places", True), ("index without (tar headers)", False)):
        path = os.path.join(work, f"index-{places}.json")
        wd.ShardIndex.from_scans(wd.build_index(urls, places=places)).save(path)
        for revalidate in (True, 300):
            wd.set_cache(os.path.join(work, "cache-exact"), "1TB", revalidate=revalidate)
            pipe = wd.ExactEpochs(path, batch_size=8)
            best = 0.0
            for e in range(epochs + 1):
                pipe.set_epoch(e)
                began = time.perf_counter()
                count = sum(1 for _ in pipe)
                if e:
                    best = max(best, count / (time.perf_counter() - began))
                else:  # the first epoch may download (through the headers): the copies are then made
                    time.sleep(1)
            rates.setdefault(label, []).append(best)
        print(f"{label:<34}" + "".join(f"{r:>16,.0f}/s" for r in rates[label]))
    first, second = rates.values()
    print(f"{'places / headers':<34}" + "".join(f"{a / b:>17.2f}x" for a, b in zip(first, second)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--shard-mb", type=float, default=4)
    parser.add_argument("--rate-mb", type=float, default=25, help="MB/s per connection (default 25: 200 Mbit/s)")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    for name in ("http_proxy", "HTTP_PROXY"):
        os.environ.pop(name, None)
    work = tempfile.mkdtemp(prefix="bench-cache-")
    try:
        remote = os.path.join(work, "remote")
        os.makedirs(remote)
        names = write_shards(remote, args.shards, args.shard_mb)
        total = sum(os.path.getsize(os.path.join(remote, n)) for n in names)
        with ShardServer(remote, args.rate_mb * MB) as server:
            urls = [server.url(n) for n in names]
            print(f"{args.shards} shards, {total / MB:.0f} MB, served at {args.rate_mb:g} MB/s per connection; "
                  "load_tar().group_by_key(), no decoding\n")
            print(f"{'setting':<34}" + "".join(f"{'epoch ' + str(e + 1):>16}" for e in range(args.epochs))
                  + f"{'vs no cache, epoch 1':>24}")
            rows = [("no cache", None), ("cache, limit 2x the dataset", 2 * total),
                    ("cache, limit half the dataset", total // 2)]
            base = None
            for row, (label, limit) in enumerate(rows):
                wd.set_cache(None if limit is None else os.path.join(work, f"cache-{row}"), limit or 0)
                cells, first = [], None
                for _ in range(args.epochs):
                    before = wd.cache_stats()
                    seconds, _ = epoch(urls)
                    after = wd.cache_stats()
                    first = first or seconds
                    hits = f" {after.hits - before.hits:>2}h" if limit else ""
                    cells.append(f"{total / MB / seconds:7.0f} MB/s{hits}")
                base = base or first
                print(f"{label:<34}" + "".join(f"{c:>16}" for c in cells) + f"{base / first:>23.2f}x")
            print("\n(h: shards read from the cache in that epoch)\n")
            print("DataLoader, 2 workers: MB the server sent per epoch")
            for label, limit in (("no cache", None), ("cache, limit 2x the dataset", 2 * total)):
                wd.set_cache(None if limit is None else os.path.join(work, "cache-workers"), limit or 0)
                cells = []
                for _ in range(args.epochs):
                    sent = server.sent
                    seconds, _ = epoch(urls, workers=2)
                    cells.append(f"{(server.sent - sent) / MB:6.1f} MB {seconds:5.2f} s")
                print(f"{label:<34}" + "".join(f"{c:>20}" for c in cells))
            exact_epochs(urls, work, args.epochs)
    finally:
        wd.set_cache(None)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
