"""Reading the same shards from AIStore and from local disk, side by side, 2 workers each.

    python -m benchmarks.bench_ais [--shards 8] [--per-shard 1000] [--rounds 5] [--epochs 2] [--quick]

Uses ``$AIS_ENDPOINT``, else the cluster of ``python -m aisio.cluster start``, else starts
one for the run (and stops it after). Writes the JPEG shards of bench_pipeline.py
(256x256 JPEG + class label), uploads them to a bucket, then times reading all grouped
samples raw (no decoding) with 2 worker processes:

- ours, local disk:           ShardLister(files).load_tar().group_by_key(), DataLoader2
- ours, ais://:               ShardLister(the objects' ais:// URLs)... (aisio's reader)
- ours, ais://, listed:       AISSourceLister("ais://bench-ais/")...: the same, and each
                              worker lists the bucket each epoch
- ours, plain urllib:         ShardLister(http://<cluster>/v1/objects/...) (the core's
                              urllib opener over the cluster's REST API, same objects)
- ours, SDK object reader:    the same pipeline opening each object with the aistore SDK's
                              ``get_reader().raw()`` (what aisio used before its own reader)
- webdataset, local disk / ais:// (aisio's opener, registered in webdataset) / HTTP (curl):
                              WebDataset(urls) under DataLoader(num_workers=2)
- aistore.pytorch (the aistore SDK's own datasets, under DataLoader(num_workers=2) as their
  docs show; ``--no-aistore-pytorch`` skips them):
  AISShardReader:             the same shard bucket; yields (basename, {ext: bytes}) per sample
  AISIterDataset, AISMapDataset, AISBatchIterDataset (GetBatch, 128 objects a request):
                              these read whole objects, not tar members, so they read a second
                              bucket holding the same samples' files (``<key>.jpg``,
                              ``<key>.cls``) as one object each; their samples/s count one
                              sample per two objects (every file of every sample read), and
                              their bytes are the same payload bytes

Workers count samples and bytes and send one total per 500 samples, so the rows compare
reading, parsing and grouping, not inter-process transfer (benchmarks/worker_loaders.py).
All loaders are started and warmed up first (page cache on both sides: the cluster's
nodes run on this machine, so AIS rows measure the protocol and client path, and share
its cores with the readers); then --rounds rounds each time every row for --epochs epochs
in turn, the order reversed every other round, so that a burst of other load hits all
rows alike; rows report their median round, ratios the median of each round's pair. Each row also
reports the CPU time per epoch of its workers, the main process and, for a local
cluster, the cluster's nodes: where the cores are the limit, that bounds the ratios.
Prints a markdown table, then the ratios the README states (ais:// vs urllib, ais:// vs
local disk) against their targets (0.9, 0.8).

Last, whether the SDK's GetBatch (many objects or byte ranges in one request) beats one
GET per object for many small shards and for mid-shard starts (``--no-getbatch`` skips it),
the variants of a case in turn. ``--quick``: 2 shards of 50 samples, one round of one epoch,
a GetBatch of 16 small shards.
"""

from __future__ import annotations

import os
import sys
import tarfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import braceexpand
import webdataset as wds
from aistore.sdk import Client

try:  # the aistore SDK's "pytorch" extra (alive-progress) is not a dependency of ours
    from aistore.pytorch import AISIterDataset, AISMapDataset, AISShardReader
    from aistore.pytorch.batch_iter_dataset import AISBatchIterDataset
except ImportError as e:
    AISPYTORCH_MISSING = f"{e} (pip install 'aistore[pytorch]')"
else:
    AISPYTORCH_MISSING = ""

from aisio import AISSourceLister, get_client, open_ais_url, upload_file
from aisio.client import endpoint
from aisio.cluster import LocalCluster, cluster_endpoint
from benchmarks.harness import Bench, Timings, median, time_in_turn
from benchmarks.shards import make_jpeg_shards
from benchmarks.worker_loaders import WORKERS, Loader, started, stopped, worker_clock
from wds_datapipes import ShardLister, register_opener

BUCKET = "bench-ais"
OBJECTS_BUCKET = "bench-ais-objs"  # the same samples, one object per file
GETBATCH_SIZE = 128  # AISBatchIterDataset's max_batch_size, as in the SDK's README
PYTORCH = "aistore.pytorch "


def _sdk_reader(url: str):
    """The ``aissdk://bucket/object`` opener: the aistore SDK's object reader, raw."""
    bucket, _, name = url[len("aissdk://"):].partition("/")
    return get_client().bucket(bucket).object(name).get_reader().raw()


register_opener("aissdk", _sdk_reader)  # forked workers inherit it


def main(argv: list[str] | None = None) -> None:
    bench = Bench("bench_ais", __doc__, peers=("webdataset", "aistore"), rounds=5, data="wds-bench")
    bench.parser.add_argument("--shards", type=int, default=8)
    bench.parser.add_argument("--per-shard", type=int, default=1000)
    bench.parser.add_argument("--epochs", type=int, default=2)
    bench.parser.add_argument("--no-getbatch", dest="getbatch", action="store_false",
                              help="skip the GetBatch comparison")
    bench.parser.add_argument("--no-aistore-pytorch", dest="aistore_pytorch", action="store_false",
                              help="skip the rows of the aistore SDK's PyTorch datasets")
    args = bench.parse(argv)
    if args.quick:
        args.shards, args.per_shard, args.epochs = min(args.shards, 2), min(args.per_shard, 50), 1
    if args.aistore_pytorch and AISPYTORCH_MISSING:
        print(f"skipping the aistore.pytorch rows: {AISPYTORCH_MISSING}", file=sys.stderr)
        args.aistore_pytorch = False
    with cluster_endpoint(), bench.results(args):
        run(bench, args)


def run(bench: Bench, args) -> None:
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
    per_sample = 1
    if args.aistore_pytorch:
        t = time.perf_counter()
        per_sample, count = upload_members(files, OBJECTS_BUCKET)
        print(f"uploaded the same samples' {count} files as objects of ais://{OBJECTS_BUCKET} "
              f"in {time.perf_counter() - t:.1f} s")
    loaders = readers(files, args.aistore_pytorch, per_sample)
    cluster = LocalCluster.running()
    node_pids = [n.pid for n in cluster.nodes] if cluster is not None and cluster.endpoint == endpoint() else []
    started(loaders)
    try:
        paths = {name: (lambda loader=loader: loader.epochs(args.epochs)) for name, loader in loaders.items()}
        timings = time_in_turn(paths, args.rounds, clock=worker_clock(node_pids),
                               after_each=lambda _: print(".", end="", file=sys.stderr, flush=True))
    finally:
        stopped(loaders)
    report(bench, timings, loaders, node_pids, args.epochs)
    client.bucket(BUCKET).delete(missing_ok=True)
    client.bucket(OBJECTS_BUCKET).delete(missing_ok=True)
    if args.getbatch:
        getbatch_report(args.rounds, small=16 if args.quick else 256, mid=2 if args.quick else 8)


def readers(files: list[str], aistore_pytorch: bool, per_sample: int) -> dict[str, Loader]:
    """Each row's loader: ours from local disk, ais:// (given and listed), urllib and the SDK's
    reader; webdataset from local disk, ais:// and curl; aistore.pytorch's datasets."""
    names = [os.path.basename(p) for p in files]
    http = [f"{endpoint()}/v1/objects/{BUCKET}/{n}?provider=ais" for n in names]
    ais = [f"ais://{BUCKET}/{n}" for n in names]
    sdk = [f"aissdk://{BUCKET}/{n}" for n in names]

    def webdataset(urls: list[str]) -> Callable[[], Iterable]:
        return lambda: wds.WebDataset(urls, shardshuffle=False, empty_check=False)

    loaders = {
        "ours, local disk": Loader("datapipes", lambda: ShardLister(files).load_tar().group_by_key()),
        "ours, ais://": Loader("datapipes", lambda: ShardLister(ais).load_tar().group_by_key()),
        "ours, ais://, listed each epoch": Loader(
            "datapipes", lambda: AISSourceLister(f"ais://{BUCKET}/").load_tar().group_by_key()),
        "ours, plain urllib (same objects)": Loader("datapipes", lambda: ShardLister(http).load_tar().group_by_key()),
        "ours, SDK object reader": Loader("datapipes", lambda: ShardLister(sdk).load_tar().group_by_key()),
        "webdataset, local disk": Loader("webdataset", webdataset(files)),
        "webdataset, ais:// (aisio opener)": Loader("webdataset", webdataset(ais)),
        "webdataset, HTTP (curl)": Loader("webdataset", webdataset(http)),
    }
    if aistore_pytorch:
        sdk_client = Client(endpoint())  # as the datasets' docs make one: the SDK's defaults
        shards, objects = sdk_client.bucket(BUCKET), sdk_client.bucket(OBJECTS_BUCKET)
        loaders.update({
            f"{PYTORCH}AISShardReader (shards)": Loader("torch-iterable", lambda: AISShardReader(shards)),
            f"{PYTORCH}AISIterDataset (file objects)": Loader(
                "torch-iterable", lambda: AISIterDataset(objects), per_sample),
            f"{PYTORCH}AISMapDataset (file objects)": Loader("torch-map", lambda: AISMapDataset(objects), per_sample),
            f"{PYTORCH}AISBatchIterDataset, GetBatch of {GETBATCH_SIZE} (file objects)": Loader(
                "torch-iterable", lambda: AISBatchIterDataset(objects, sdk_client, max_batch_size=GETBATCH_SIZE),
                per_sample),
        })
    return loaders


def upload_members(files: list[str], bucket_name: str) -> tuple[int, int]:
    """Puts every file of the shards ``files`` as its own object (named as in the tar) in a
    fresh bucket; returns the files per sample and the count of objects."""
    bucket = get_client().bucket(bucket_name)
    bucket.delete(missing_ok=True)
    bucket.create()
    members: list[tuple[str, bytes]] = []
    for path in files:
        with tarfile.open(path) as tar:
            members += [(m.name, tar.extractfile(m).read()) for m in tar if m.isfile()]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda m: bucket.object(m[0]).get_writer().put_content(m[1]), members))
    keys = {name.split(".", 1)[0] for name, _ in members}
    return len(members) // len(keys), len(members)


def report(bench: Bench, timings: Timings, loaders: dict[str, Loader], node_pids: list[int], epochs: int) -> None:
    def cpu_ms(name: str, part: str | None = None) -> float:  # CPU ms per epoch, the median round
        return median((run.cpu if part is None else run.parts[part]) for run in timings.rounds(name)) / epochs * 1000

    where = "this machine's cluster nodes included" if node_pids else "cluster nodes not measured (remote cluster)"
    print(f"\nCPU: ms per epoch, workers + main process + cluster nodes ({where})")
    print(f"\n| reader ({WORKERS} workers, raw) | samples/s (median) | MB/s | vs ours, local disk "
          "| CPU per epoch | = workers + main + cluster |")
    print("|---|---:|---:|---:|---:|---|")
    for name in loaders:
        parts = " + ".join(f"{cpu_ms(name, k):,.0f}" for k in ("workers", "main", "cluster"))
        print(f"| {name} | {timings.rate(name):,.0f} | {timings.rate(name, unit='nbytes') / 1e6:,.0f} "
              f"| {timings.ratio(name, 'ours, local disk')} | {cpu_ms(name):,.0f} ms | {parts} |")
    print("\nratios of ours, ais:// to the others, the median of the rounds' pairs (range) [goals]")
    for label, other, goal in (("plain urllib, same objects", "ours, plain urllib (same objects)", ">= 0.9"),
                               ("local disk", "ours, local disk", ">= 0.8"),
                               ("the SDK's object reader", "ours, SDK object reader", None),
                               ("webdataset over HTTP (curl)", "webdataset, HTTP (curl)", None)):
        bench.ratio(f"ais:// / {label}, wall", timings.ratio("ours, ais://", other), goal)
        bench.ratio(f"ais:// / {label}, CPU per epoch (the other's / ours)", timings.ratio("ours, ais://", other, of="cpu"),
                    goal)
    for other in (name for name in loaders if name.startswith(PYTORCH)):
        short = other[len(PYTORCH):]
        bench.ratio(f"ais:// / {short}, wall", timings.ratio("ours, ais://", other))
        bench.ratio(f"ais:// / {short}, CPU per epoch", timings.ratio("ours, ais://", other, of="cpu"))
        bench.ratio(f"ais://, listed each epoch / {short}, wall",
                    timings.ratio("ours, ais://, listed each epoch", other))
    local = loaders["ours, local disk"].last
    for name, loader in loaders.items():  # every row must have read the same samples and bytes
        if loader.last != local:
            print(f"WARNING: {name} read {loader.last[0]} samples, {loader.last[1]} bytes an epoch; local disk: "
                  f"{local[0]}, {local[1]}")
    if node_pids:
        ais, disk = cpu_ms("ours, ais://"), cpu_ms("ours, local disk")
        print(f"The cluster's nodes spend {cpu_ms('ours, ais://', 'cluster'):,.0f} of the {ais:,.0f} ms an ais:// "
              f"epoch costs ({disk:,.0f} ms from local disk): on this machine, where they share the cores with the "
              f"readers, that caps ais:// at {disk / ais:.2f}x local disk whenever the cores are the limit.")
    print("Wall times swing with other load on a shared machine; CPU per epoch does not.")


def getbatch_report(rounds: int, small: int = 256, small_size: int = 16_384, mid: int = 8) -> None:
    """Does the SDK's GetBatch (one request for many objects or byte ranges; aisnode v1.5.0
    serves it) beat one GET per object for many small shards, or for mid-shard starts?"""
    client = get_client()
    bucket = client.bucket(f"{BUCKET}-gb")
    bucket.delete(missing_ok=True)
    bucket.create()
    names = [f"small-{i:05d}.tar" for i in range(small)]
    payload = os.urandom(small_size)
    for name in names:
        bucket.object(name).get_writer().put_content(payload)
    big = [f"big-{i}.tar" for i in range(mid)]
    blob = os.urandom(8 << 20)
    for name in big:
        bucket.object(name).get_writer().put_content(blob)
    start = 5 << 20  # a mid-shard start: the last 3 MiB of each 8 MiB shard

    def one_get_each(objects: list[str], offset: int = 0) -> tuple[int, int]:
        total = 0
        for name in objects:
            with open_ais_url(f"ais://{bucket.name}/{name}", start=offset) as stream:
                total += len(stream.read())
        return len(objects), total

    def get_batch(objects: list[str], size: int, offset: int = 0) -> tuple[int, int]:
        total = 0
        for i in range(0, len(objects), size):
            batch = client.batch(bucket=bucket)
            for name in objects[i:i + size]:
                batch.add(name, start=offset, length=-1) if offset else batch.add(name)
            total += sum(len(data) for _, data in batch.get())
        return len(objects), total

    cases = {
        f"{small} shards of {small_size // 1024} KiB": {
            "one GET each (ais://)": lambda: one_get_each(names),
            **{f"GetBatch, {n} per request": (lambda n=n: get_batch(names, n)) for n in sorted({16, 64, small})}},
        f"{mid} mid-shard starts (last 3 MiB of 8 MiB)": {
            "Range GET each (ais://, start=)": lambda: one_get_each(big, start),
            f"GetBatch byte ranges, {mid} per request": lambda: get_batch(big, mid, start)},
    }
    print("\n| GetBatch vs one GET per object | case | objects/s (median) | MB/s |")
    print("|---|---|---:|---:|")
    for case, variants in cases.items():
        timings = time_in_turn(variants, rounds, warm=True)
        for label in variants:
            print(f"| {label} | {case} | {timings.rate(label):,.0f} | {timings.rate(label, unit='nbytes') / 1e6:,.0f} |")
    bucket.delete(missing_ok=True)


if __name__ == "__main__":
    main()
