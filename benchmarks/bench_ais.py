"""Reading the same shards from AIStore and from local disk, side by side, 2 workers each.

    python benchmarks/bench_ais.py [--shards 8] [--per-shard 1000] [--repeats 3] [--epochs 3]

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
reading, parsing and grouping, not inter-process transfer. All loaders are started and
warmed up first (page cache on both sides: the cluster's nodes run on this machine, so
AIS rows measure the protocol and client path, and share its cores with the readers);
then --repeats passes each time every row for --epochs epochs in turn, so that a burst of
other load hits all rows alike; rows report their best and median pass. Each row also
reports the CPU time per epoch of its workers, the main process and, for a local
cluster, the cluster's nodes: where the cores are the limit, that bounds the ratios.
Prints a markdown table, then the ratios the README states (ais:// vs urllib, ais:// vs
local disk) against their targets (0.9, 0.8).

Last, whether the SDK's GetBatch (many objects or byte ranges in one request) beats one
GET per object for many small shards and for mid-shard starts (``--no-getbatch`` skips it).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tarfile
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore", message=r"(?s).*'datapipes', 'dataloader2' modules are deprecated")

import braceexpand
import webdataset as wds
from aistore.sdk import Client
from shards import make_jpeg_shards
from torch.utils.data import DataLoader, IterableDataset

try:  # the aistore SDK's "pytorch" extra (alive-progress) is not a dependency of ours
    from aistore.pytorch import AISIterDataset, AISMapDataset, AISShardReader
    from aistore.pytorch.batch_iter_dataset import AISBatchIterDataset
except ImportError as e:
    AISPYTORCH_MISSING = f"{e} (pip install 'aistore[pytorch]')"
else:
    AISPYTORCH_MISSING = ""

try:
    from torchdata.dataloader2 import DataLoader2
except ImportError:  # torchdata >= 0.10: the datapipe rows run under DataLoader
    DataLoader2 = None

import wds_datapipes as wd
from aisio import AISSourceLister, get_client, open_ais_url, upload_file
from aisio.client import endpoint
from aisio.cluster import LocalCluster, cluster_endpoint
from wds_datapipes import ShardLister, register_opener
from wds_datapipes.torch_datapipes import IterDataPipe

BUCKET = "bench-ais"
OBJECTS_BUCKET = "bench-ais-objs"  # the same samples, one object per file
WORKERS = 2
PER_MESSAGE = 500
GETBATCH_SIZE = 128  # AISBatchIterDataset's max_batch_size, as in the SDK's README


def _tally(sample: dict) -> tuple[int, int]:
    return 1, sum(len(v) for k, v in sample.items() if not k.startswith("__"))


def _add(tallies: list[tuple[int, int]]) -> tuple[int, int]:
    return sum(n for n, _ in tallies), sum(b for _, b in tallies)


def _tally_named(item: tuple) -> tuple[int, int]:
    """An aistore.pytorch item, ``(name, content)``: a sample's dict (AISShardReader) or one
    object's bytes (AISIterDataset, AISMapDataset, AISBatchIterDataset)."""
    content = item[1]
    return _tally(content) if isinstance(content, dict) else (1, len(content))


def _collate_tallies(tally: Callable[[object], tuple[int, int]], batch: list) -> tuple[int, int]:
    return _add([tally(item) for item in batch])


class _Tallied(IterableDataset):
    """Runs in each worker over a torch IterableDataset: one (count, bytes) per PER_MESSAGE items."""

    def __init__(self, dataset: IterableDataset, tally: Callable[[object], tuple[int, int]]):
        self.dataset, self.tally = dataset, tally

    def __iter__(self):
        return _tallies(self.dataset, self.tally)


class _TalliedPipe(IterDataPipe):
    """The same one-generator tally over a datapipe, kept a datapipe so that the reading
    service's sharding still reaches the pipe below it."""

    def __init__(self, source_datapipe, tally: Callable[[object], tuple[int, int]]):
        self.source_datapipe, self.tally = source_datapipe, tally

    def __iter__(self):
        return _tallies(self.source_datapipe, self.tally)


def _tallies(items: Iterable, tally: Callable[[object], tuple[int, int]]):
    pending = []
    for item in items:
        pending.append(tally(item))
        if len(pending) == PER_MESSAGE:
            yield _add(pending)
            pending = []
    if pending:
        yield _add(pending)


def _sdk_reader(url: str):
    """The ``aissdk://bucket/object`` opener: the aistore SDK's object reader, raw."""
    bucket, _, name = url[len("aissdk://"):].partition("/")
    return get_client().bucket(bucket).object(name).get_reader().raw()


register_opener("aissdk", _sdk_reader)  # forked workers inherit it


class Loader:
    """A 2-worker loader over a pipe of (count, bytes) tallies, kept up between measurements.

    ``kind``: "datapipes", "webdataset", or a torch dataset of ``(name, content)`` items,
    "torch-iterable" or "torch-map" (aistore.pytorch); ``per_sample``: items per sample.
    ``generator_tally``: datapipes and webdataset tally in one plain generator, at the same
    cost a sample on both sides, instead of each library's own map and batch stages (torch's
    datapipe stages cost a hook a sample that webdataset's do not)."""

    def __init__(self, kind: str, make: Callable[[], object], per_sample: int = 1, generator_tally: bool = False):
        self.kind, self.make, self.loader, self.per_sample = kind, make, None, per_sample
        self.generator_tally = generator_tally

    def _tallied_pipe(self):
        if self.generator_tally:
            return _TalliedPipe(self.make(), _tally)
        return self.make().map(_tally).batch(PER_MESSAGE).map(_add)

    def start(self) -> None:
        if self.kind == "datapipes" and DataLoader2 is not None:
            self.loader = DataLoader2(self._tallied_pipe(),
                                      reading_service=wd.MultiProcessingReadingService(num_workers=WORKERS))
        elif self.kind == "datapipes":
            self.loader = DataLoader(self._tallied_pipe(), batch_size=None, num_workers=WORKERS,
                                     persistent_workers=True)
        elif self.kind == "torch-iterable":  # each worker tallies its share of the items
            self.loader = DataLoader(_Tallied(self.make(), _tally_named), batch_size=None,
                                     num_workers=WORKERS, persistent_workers=True)
        elif self.kind == "torch-map":  # collate_fn runs in the workers: one tally per batch
            self.loader = DataLoader(self.make(), batch_size=PER_MESSAGE, num_workers=WORKERS,
                                     collate_fn=functools.partial(_collate_tallies, _tally_named),
                                     persistent_workers=True)
        else:  # webdataset
            ds = _Tallied(self.make(), _tally) if self.generator_tally else \
                self.make().map(_tally).batched(PER_MESSAGE, collation_fn=_add)
            self.loader = DataLoader(ds, batch_size=None, num_workers=WORKERS, persistent_workers=True)

    def epoch(self) -> tuple[int, int]:
        count, nbytes = _add(list(self.loader))
        return count // self.per_sample, nbytes

    def stop(self) -> None:
        if DataLoader2 is not None and isinstance(self.loader, DataLoader2):
            self.loader.shutdown()
        self.loader = None


def _children_ticks() -> int:
    """CPU ticks (user + system) of this process's children: the loaders' workers."""
    me, total = str(os.getpid()), 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me:
                total += int(fields[11]) + int(fields[12])
    return total


def _ticks_of(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total


class Row:
    """One reader's loader and its measurements: wall time per pass, CPU per epoch."""

    def __init__(self, name: str, loader: Loader):
        self.name, self.loader = name, loader
        self.seconds: list[float] = []
        self.cpu_ms = {"workers": 0.0, "main": 0.0, "cluster": 0.0}
        self.epochs = 0
        self.samples = self.nbytes = 0

    def measure(self, epochs: int, node_pids: list[int]) -> None:
        tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
        workers, main, nodes = _children_ticks(), time.process_time(), _ticks_of(node_pids)
        started = time.perf_counter()
        for _ in range(epochs):
            self.samples, self.nbytes = self.loader.epoch()
        self.seconds.append(time.perf_counter() - started)
        self.cpu_ms["workers"] += (_children_ticks() - workers) * tick_ms
        self.cpu_ms["main"] += (time.process_time() - main) * 1000
        self.cpu_ms["cluster"] += (_ticks_of(node_pids) - nodes) * tick_ms
        self.epochs += epochs

    def rate(self, best: bool = True) -> float:
        ordered = sorted(self.seconds)
        seconds = ordered[0] if best else ordered[len(ordered) // 2]
        return self.samples * self.epochs_per_pass / seconds

    @property
    def epochs_per_pass(self) -> int:
        return self.epochs // len(self.seconds)

    def cpu_per_epoch(self) -> float:
        return sum(self.cpu_ms.values()) / self.epochs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--per-shard", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "wds-bench"))
    parser.add_argument("--no-getbatch", dest="getbatch", action="store_false",
                        help="skip the GetBatch comparison")
    parser.add_argument("--no-aistore-pytorch", dest="aistore_pytorch", action="store_false",
                        help="skip the rows of the aistore SDK's PyTorch datasets")
    args = parser.parse_args()
    if args.aistore_pytorch and AISPYTORCH_MISSING:
        print(f"skipping the aistore.pytorch rows: {AISPYTORCH_MISSING}", file=sys.stderr)
        args.aistore_pytorch = False
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
    if args.aistore_pytorch:
        t = time.perf_counter()
        per_sample, count = upload_members(files, OBJECTS_BUCKET)
        print(f"uploaded the same samples' {count} files as objects of ais://{OBJECTS_BUCKET} "
              f"in {time.perf_counter() - t:.1f} s")
    names = [os.path.basename(p) for p in files]
    http = [f"{endpoint()}/v1/objects/{BUCKET}/{n}?provider=ais" for n in names]
    ais = [f"ais://{BUCKET}/{n}" for n in names]
    sdk = [f"aissdk://{BUCKET}/{n}" for n in names]

    def webdataset(urls: list[str]) -> Callable[[], Iterable]:
        return lambda: wds.WebDataset(urls, shardshuffle=False, empty_check=False)

    rows = [
        Row("ours, local disk", Loader("datapipes", lambda: ShardLister(files).load_tar().group_by_key())),
        Row("ours, ais://", Loader("datapipes", lambda: ShardLister(ais).load_tar().group_by_key())),
        Row("ours, ais://, listed each epoch", Loader(
            "datapipes", lambda: AISSourceLister(f"ais://{BUCKET}/").load_tar().group_by_key())),
        Row("ours, plain urllib (same objects)", Loader("datapipes", lambda: ShardLister(http).load_tar().group_by_key())),
        Row("ours, SDK object reader", Loader("datapipes", lambda: ShardLister(sdk).load_tar().group_by_key())),
        Row("webdataset, local disk", Loader("webdataset", webdataset(files))),
        Row("webdataset, ais:// (aisio opener)", Loader("webdataset", webdataset(ais))),
        Row("webdataset, HTTP (curl)", Loader("webdataset", webdataset(http))),
    ]
    if args.aistore_pytorch:
        sdk_client = Client(endpoint())  # as the datasets' docs make one: the SDK's defaults
        shards, objects = sdk_client.bucket(BUCKET), sdk_client.bucket(OBJECTS_BUCKET)
        rows += [
            Row(f"{PYTORCH}AISShardReader (shards)", Loader("torch-iterable", lambda: AISShardReader(shards))),
            Row(f"{PYTORCH}AISIterDataset (file objects)", Loader(
                "torch-iterable", lambda: AISIterDataset(objects), per_sample)),
            Row(f"{PYTORCH}AISMapDataset (file objects)", Loader(
                "torch-map", lambda: AISMapDataset(objects), per_sample)),
            Row(f"{PYTORCH}AISBatchIterDataset, GetBatch of {GETBATCH_SIZE} (file objects)", Loader(
                "torch-iterable", lambda: AISBatchIterDataset(objects, sdk_client, max_batch_size=GETBATCH_SIZE),
                per_sample)),
        ]
    cluster = LocalCluster.running()
    node_pids = [n.pid for n in cluster.nodes] if cluster is not None and cluster.endpoint == endpoint() else []
    for row in rows:  # all loaders up (idle ones cost nothing), each warmed once
        row.loader.start()
        row.loader.epoch()
    try:
        for repeat in range(args.repeats):
            for row in rows:  # interleaved: a burst of other load hits every row alike
                row.measure(args.epochs, node_pids)
            print(f"  pass {repeat + 1} of {args.repeats} done", file=sys.stderr)
    finally:
        for row in rows:
            row.loader.stop()
    _report(rows, node_pids)
    client.bucket(BUCKET).delete(missing_ok=True)
    client.bucket(OBJECTS_BUCKET).delete(missing_ok=True)
    if args.getbatch:
        getbatch_report(args.repeats)


PYTORCH = "aistore.pytorch "


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


def _report(rows: list[Row], node_pids: list[int]) -> None:
    by_name = {row.name: row for row in rows}
    base = by_name["ours, local disk"].rate()
    where = "this machine's cluster nodes included" if node_pids else "cluster nodes not measured (remote cluster)"
    print(f"\nCPU: ms per epoch, workers + main process + cluster nodes ({where})")
    print(f"\n| reader ({WORKERS} workers, raw) | samples/s (best) | median | MB/s | vs ours, local disk "
          "| CPU per epoch | = workers + main + cluster |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for row in rows:
        best = row.rate()
        mbps = row.nbytes * row.epochs_per_pass / min(row.seconds) / 1e6
        parts = " + ".join(f"{row.cpu_ms[k] / row.epochs:,.0f}" for k in ("workers", "main", "cluster"))
        print(f"| {row.name} | {best:,.0f} | {row.rate(best=False):,.0f} | {mbps:,.0f} | {best / base:.2f} "
              f"| {row.cpu_per_epoch():,.0f} ms | {parts} |")
    ais, local = by_name["ours, ais://"], by_name["ours, local disk"]
    urllib, sdk = by_name["ours, plain urllib (same objects)"], by_name["ours, SDK object reader"]
    print("\nratio of ais:// to                    wall (best)  CPU per epoch (the other's / ours)")
    for label, other, target in (("plain urllib, same objects", urllib, 0.9), ("local disk", local, 0.8),
                                 ("the SDK's object reader", sdk, None),
                                 ("webdataset over HTTP (curl)", by_name["webdataset, HTTP (curl)"], None)):
        wall, cpu = ais.rate() / other.rate(), other.cpu_per_epoch() / ais.cpu_per_epoch()
        verdict = ""
        if target is not None:
            verdict = f"  target >= {target}: wall {'met' if wall >= target else 'NOT met'}, " \
                      f"CPU {'met' if cpu >= target else 'NOT met'}"
        print(f"  {label:34} {wall:5.2f}        {cpu:5.2f}{verdict}")
    peers = [row for row in rows if row.name.startswith(PYTORCH)]
    if peers:
        listed = by_name["ours, ais://, listed each epoch"]
        print(f"\nratio of ours, ais:// to{'':30} wall (best)  CPU per epoch (the other's / ours)  "
              "wall, ours listed each epoch")
        for other in peers:
            wall, cpu = ais.rate() / other.rate(), other.cpu_per_epoch() / ais.cpu_per_epoch()
            print(f"  {other.name[len(PYTORCH):]:52} {wall:5.2f}        {cpu:5.2f}"
                  f"{'':36}{listed.rate() / other.rate():5.2f}")
    for row in rows:  # every row must have read the same samples and bytes
        if (row.samples, row.nbytes) != (local.samples, local.nbytes):
            print(f"WARNING: {row.name} read {row.samples} samples, {row.nbytes} bytes; "
                  f"local disk: {local.samples}, {local.nbytes}")
    if node_pids:
        print(f"The cluster's nodes spend {ais.cpu_ms['cluster'] / ais.epochs:,.0f} of the {ais.cpu_per_epoch():,.0f} ms "
              f"an ais:// epoch costs ({local.cpu_per_epoch():,.0f} ms from local disk): on this machine, where they "
              f"share the cores with the readers, that caps ais:// at "
              f"{local.cpu_per_epoch() / ais.cpu_per_epoch():.2f}x local disk whenever the cores are the limit.")
    print("Wall times swing with other load on a shared machine; CPU per epoch does not.")


def _best_seconds(fn: Callable[[], int], repeats: int) -> tuple[float, int]:
    fn()  # warm-up
    best, total = float("inf"), 0
    for _ in range(repeats):
        started = time.perf_counter()
        total = fn()
        best = min(best, time.perf_counter() - started)
    return best, total


def getbatch_report(repeats: int, small: int = 256, small_size: int = 16_384, mid: int = 8) -> None:
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

    def one_get_each(objects: list[str], offset: int = 0) -> int:
        total = 0
        for name in objects:
            with open_ais_url(f"ais://{bucket.name}/{name}", start=offset) as stream:
                total += len(stream.read())
        return total

    def get_batch(objects: list[str], size: int, offset: int = 0) -> int:
        total = 0
        for i in range(0, len(objects), size):
            batch = client.batch(bucket=bucket)
            for name in objects[i:i + size]:
                batch.add(name, start=offset, length=-1) if offset else batch.add(name)
            total += sum(len(data) for _, data in batch.get())
        return total

    cases = [
        (f"{small} shards of {small_size // 1024} KiB", names, 0,
         [("one GET each (ais://)", lambda: one_get_each(names))]
         + [(f"GetBatch, {n} per request", lambda n=n: get_batch(names, n)) for n in (16, 64, small)]),
        (f"{mid} mid-shard starts (last 3 MiB of 8 MiB)", big, start,
         [("Range GET each (ais://, start=)", lambda: one_get_each(big, start)),
          (f"GetBatch byte ranges, {mid} per request", lambda: get_batch(big, mid, start))]),
    ]
    print("\n| GetBatch vs one GET per object | case | objects/s (best) | MB/s |")
    print("|---|---|---:|---:|")
    for case, objects, _, variants in cases:
        for label, fn in variants:
            seconds, nbytes = _best_seconds(fn, repeats)
            print(f"| {label} | {case} | {len(objects) / seconds:,.0f} | {nbytes / seconds / 1e6:,.0f} |")
    bucket.delete(missing_ok=True)


if __name__ == "__main__":
    main()
