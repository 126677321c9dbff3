"""Streaming the same shards from AIStore and from local disk, ours against webdataset, in one run.

    python benchmarks/bench_ais.py [--shards 8] [--per-shard 1000] [--repeats 3]

Uses ``$AIS_ENDPOINT``, else the cluster of ``python -m aisio.cluster start``, else starts
one for the run (and stops it after). Writes the JPEG shards of bench_pipeline.py
(256x256 JPEG + class label), uploads them to a bucket, then times reading all grouped
samples (no decoding), one process:

- ours, local disk:         ShardLister(files).load_tar().group_by_key()
- ours, AIS (ais://):       AISSourceLister("ais://bucket/").load_tar().group_by_key()
- ours, AIS over HTTP:      ShardLister(http://.../v1/objects/...) (plain urllib opener)
- webdataset, local disk:   webdataset.WebDataset(files)
- webdataset, AIS over HTTP: webdataset.WebDataset(http URLs) (it streams through curl)

Each row is the best of --repeats passes after a warm-up pass (page cache on both
sides: the cluster's targets run on this machine, so "AIS" measures the protocol and
client path, not a network). Prints samples/s, MB/s and each row's ratio to ours-local.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore", message=r"(?s).*'datapipes', 'dataloader2' modules are deprecated")

import braceexpand
import webdataset as wds
from shards import make_jpeg_shards

from aisio import AISSourceLister, get_client, upload_file
from aisio.client import endpoint
from aisio.cluster import cluster_endpoint
from wds_datapipes import ShardLister

BUCKET = "bench-ais"


def _count(samples: Iterable[dict]) -> tuple[int, int]:
    n = nbytes = 0
    for sample in samples:
        n += 1
        nbytes += sum(len(v) for k, v in sample.items() if not k.startswith("__"))
    return n, nbytes


def _best(make: Callable[[], Iterable[dict]], repeats: int) -> tuple[float, int, int]:
    _count(make())  # warm-up: page cache, connections, imports
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        n, nbytes = _count(make())
        best = min(best, time.perf_counter() - started)
    return best, n, nbytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--per-shard", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "wds-bench"))
    args = parser.parse_args()

    with cluster_endpoint():
        run(args)


def run(args: argparse.Namespace) -> None:
    """Writes the shards, uploads them, and times each reader."""
    spec = make_jpeg_shards(args.data, shards=args.shards, per_shard=args.per_shard)
    files = list(braceexpand.braceexpand(spec))
    client = get_client()
    client.bucket(BUCKET).delete(missing_ok=True)
    client.bucket(BUCKET).create(exist_ok=True)
    t = time.perf_counter()
    for path in files:
        upload_file(path, f"ais://{BUCKET}/{os.path.basename(path)}")
    total_mb = sum(os.path.getsize(p) for p in files) / 1e6
    print(f"uploaded {len(files)} shards ({total_mb:.0f} MB) to ais://{BUCKET} on {endpoint()} "
          f"in {time.perf_counter() - t:.1f} s")
    http = [f"{endpoint()}/v1/objects/{BUCKET}/{os.path.basename(p)}?provider=ais" for p in files]

    def webdataset_reader(urls):
        return lambda: wds.WebDataset(urls, shardshuffle=False, empty_check=False)

    rows = [
        ("ours, local disk", lambda: ShardLister(files).load_tar().group_by_key()),
        ("ours, AIS (ais://)", lambda: AISSourceLister(f"ais://{BUCKET}/").load_tar().group_by_key()),
        ("ours, AIS over HTTP (urllib)", lambda: ShardLister(http).load_tar().group_by_key()),
        ("webdataset, local disk", webdataset_reader(files)),
        ("webdataset, AIS over HTTP (curl)", webdataset_reader(http)),
    ]
    results = []
    for name, make in rows:
        seconds, n, nbytes = _best(make, args.repeats)
        results.append((name, n / seconds, nbytes / seconds / 1e6))
    base = results[0][1]
    print(f"\n{'reader':34} {'samples/s':>10} {'MB/s':>8} {'vs ours-local':>14}")
    for name, rate, mbps in results:
        print(f"{name:34} {rate:10.0f} {mbps:8.1f} {rate / base:13.2f}x")
    rate = {name: r for name, r, _ in results}
    print(f"\nAIS / local disk (ours): {rate['ours, AIS (ais://)'] / rate['ours, local disk']:.2f}; "
          f"ours (ais://) / webdataset (HTTP) from AIS: "
          f"{rate['ours, AIS (ais://)'] / rate['webdataset, AIS over HTTP (curl)']:.2f}")
    client.bucket(BUCKET).delete(missing_ok=True)


if __name__ == "__main__":
    main()
