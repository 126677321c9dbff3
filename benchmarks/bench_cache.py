"""The local shard cache against re-reading a remote dataset every epoch.

    python -m benchmarks.bench_cache [--shards 16] [--shard-mb 4] [--rate-mb 25] [--epochs 3] [--rounds 3] [--quick]

Shards of random bytes are served by a local HTTP server that sends at most ``--rate-mb``
MB/s per connection (a realistic object store or web server seen from one node), and read
with ``load_tar().group_by_key()`` (no decoding): ``--epochs`` epochs without the cache, with
it (limit above the dataset), and with a limit of half the dataset; then, with a
DataLoader of 2 workers, the bytes the server sent per epoch with and without the cache;
then ``ExactEpochs`` (shuffled) over the cached copies, by an index with member places
against one without (read through the tar headers).

Each round starts from empty cache folders and runs every setting's epochs in sequence (an
epoch's number is what it measures: the first downloads, the later ones read the copies),
the settings in turn, the order reversed every other round; a cell is the median of its
epoch's rounds, and "vs no cache, epoch 1" the median of each round's pair. ExactEpochs'
rates are the medians of the epochs after the first. ``--quick``: 4 shards of 0.5 MB at
100 MB/s, 2 epochs, one round.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tarfile
import tempfile
import time

import wds_datapipes as wd
from benchmarks.harness import CLOCK, ROOT, Bench, Ratio, Timings, in_turn, median

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


def epoch(urls: list[str], workers: int = 0) -> int:
    """Reads every sample once; returns how many (with ``workers``, under a DataLoader)."""
    pipe = wd.ShardLister(urls).load_tar().group_by_key()
    if workers:
        from torch.utils.data import DataLoader

        return sum(1 for _ in DataLoader(pipe.map(key), num_workers=workers, batch_size=None))
    return sum(1 for _ in pipe)


def exact_epochs(urls: list[str], work: str, epochs: int) -> None:
    """Samples/s of ExactEpochs' later epochs from the cached copies: by member places, and
    through headers; with each opening checked against the source (a HEAD), and with checks
    at most every 300 s."""
    print(f"\nExactEpochs, shuffled, one process, epochs 2 to {epochs} (every shard cached): samples/s, median")
    print(f"{'':<34}{'revalidate=True':>18}{'revalidate=300':>18}")
    rates: dict[str, list[Ratio]] = {}
    for label, places in (("index with member places", True), ("index without (tar headers)", False)):
        path = os.path.join(work, f"index-{places}.json")
        wd.ShardIndex.from_scans(wd.build_index(urls, places=places)).save(path)
        for revalidate in (True, 300):
            wd.set_cache(os.path.join(work, "cache-exact"), "1TB", revalidate=revalidate)
            pipe = wd.ExactEpochs(path, batch_size=8)
            later = []
            for e in range(epochs):
                pipe.set_epoch(e)
                run = CLOCK.run(lambda pipe=pipe: sum(1 for _ in pipe))
                if e:
                    later.append(run.rate())
                else:  # the first epoch may download (through the headers): the copies are then made
                    time.sleep(1)
            rates.setdefault(label, []).append(Ratio.of(later))
        print(f"{label:<34}" + "".join(f"{r.value:>16,.0f}/s" for r in rates[label]))
    first, second = rates.values()
    print(f"{'places / headers':<34}" + "".join(f"{a.value / b.value:>17.2f}x" for a, b in zip(first, second)))


def main(argv: list[str] | None = None) -> None:
    bench = Bench("bench_cache", __doc__, rounds=3, data=None)
    bench.parser.add_argument("--shards", type=int, default=16)
    bench.parser.add_argument("--shard-mb", type=float, default=4)
    bench.parser.add_argument("--rate-mb", type=float, default=25, help="MB/s per connection (default 25: 200 Mbit/s)")
    bench.parser.add_argument("--epochs", type=int, default=3)
    args = bench.parse(argv)
    if args.quick:
        args.shards, args.shard_mb, args.rate_mb, args.epochs = min(args.shards, 4), min(args.shard_mb, 0.5), 100, 2
    sys.path.insert(0, str(ROOT / "tests" / "shards"))  # the cache tests' server, counting what it sends
    from shard_server import ShardServer

    for name in ("http_proxy", "HTTP_PROXY"):
        os.environ.pop(name, None)
    work = tempfile.mkdtemp(prefix="bench-cache-")
    try:
        remote = os.path.join(work, "remote")
        os.makedirs(remote)
        names = write_shards(remote, args.shards, args.shard_mb)
        total = sum(os.path.getsize(os.path.join(remote, n)) for n in names)
        with bench.results(args), ShardServer(remote, args.rate_mb * MB) as server:
            urls = [server.url(n) for n in names]
            print(f"{args.shards} shards, {total / MB:.0f} MB, served at {args.rate_mb:g} MB/s per connection; "
                  f"load_tar().group_by_key(), no decoding; medians of {args.rounds} round(s)\n")
            epochs_in_turn(bench, args, urls, work, total)
            sent_per_epoch(args, urls, work, server)
            exact_epochs(urls, work, args.epochs)
    finally:
        wd.set_cache(None)
        shutil.rmtree(work, ignore_errors=True)


def epochs_in_turn(bench: Bench, args, urls: list[str], work: str, total: int) -> None:
    settings = {"no cache": None, "cache, limit 2x the dataset": 2 * total, "cache, limit half the dataset": total // 2}
    timings, hits = Timings(), {}
    for _, label in in_turn(args.rounds, list(settings)):
        limit = settings[label]
        folder = os.path.join(work, f"cache-{list(settings).index(label)}")
        shutil.rmtree(folder, ignore_errors=True)
        wd.set_cache(None if limit is None else folder, limit or 0)
        for e in range(args.epochs):
            before = wd.cache_stats()
            timings.add(f"{label}, epoch {e + 1}", CLOCK.run(lambda: epoch(urls)))
            hits[label, e] = wd.cache_stats().hits - before.hits
    wd.set_cache(None)
    print(f"{'setting':<34}" + "".join(f"{'epoch ' + str(e + 1):>16}" for e in range(args.epochs))
          + f"{'epoch 1 vs no cache, epoch 1':>30}")
    for label, limit in settings.items():
        cells = [f"{total / MB / timings.seconds(f'{label}, epoch {e + 1}'):7.0f} MB/s"
                 + (f" {hits[label, e]:>2}h" if limit else "") for e in range(args.epochs)]
        versus = timings.ratio(f"{label}, epoch 1", "no cache, epoch 1")
        print(f"{label:<34}" + "".join(f"{c:>16}" for c in cells) + f"{versus!s:>30}")
    print("\n(h: shards read from the cache in that epoch, the last round)")
    print("\nepoch 2 over epoch 1, each round's pair (range)")
    for label in settings:
        if args.epochs > 1:
            bench.ratio(f"{label}: epoch 2 / epoch 1", timings.ratio(f"{label}, epoch 2", f"{label}, epoch 1"))


def sent_per_epoch(args, urls: list[str], work: str, server) -> None:
    print("\nDataLoader, 2 workers: MB the server sent per epoch (the last round), seconds (median)")
    settings = {"no cache": None, "cache, limit 2x the dataset": "1TB"}
    seconds: dict[tuple[str, int], list[float]] = {}
    sent: dict[tuple[str, int], float] = {}
    for _, label in in_turn(args.rounds, list(settings)):
        folder = os.path.join(work, "cache-workers")
        shutil.rmtree(folder, ignore_errors=True)
        wd.set_cache(None if settings[label] is None else folder, settings[label] or 0)
        for e in range(args.epochs):
            before = server.sent
            seconds.setdefault((label, e), []).append(CLOCK.run(lambda: epoch(urls, workers=2)).wall)
            sent[label, e] = (server.sent - before) / MB
    wd.set_cache(None)
    for label in settings:
        print(f"{label:<34}" + "".join(f"{sent[label, e]:6.1f} MB {median(seconds[label, e]):5.2f} s"
                                       .rjust(20) for e in range(args.epochs)))


if __name__ == "__main__":
    main()
