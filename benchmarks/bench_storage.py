"""Object stores: ours over s3://, http:// and ais:// against each other and webdataset, on the
same objects of one AIStore cluster, in one run (``make bench-storage``).

    python benchmarks/bench_storage.py [--rounds 5] [--small 24] [--big 4] [--no-clients]
                                       [--no-pipelines] [--no-listing] [--s3fs-python PATH]
                                       [--only-forked] [--only-in-process] [--only-bulk-reads]

Uses ``$AIS_ENDPOINT``, else the cluster of ``python -m aisio.cluster start``, else starts
one for the run. Turns the cluster's S3-Reverse-Proxy feature on (``features=8192``), so
that every S3 client reads ``ENDPOINT/s3/BUCKET/KEY`` path style without 307 redirects;
every byte of an S3 read is then relayed by the proxy node, while ``ais://`` is redirected
to the target that holds the object. Writes tar shards of random bytes (``.bin`` members of
16-48 kB + ``.cls``): ``--small`` shards of 2-4 MB and ``--big`` of 64 MB, into one bucket.

1. Clients (``--no-clients`` skips): each S3 client library in its own process
   (benchmarks/storage_clients.py) reads every object whole, one after another: MB/s on
   the small and on the big objects, and ms per request on 1 KiB objects. s3fs cannot share
   a venv with boto3 1.44 (aiobotocore pins an older botocore): give ``--s3fs-python`` a
   venv's python that has it, else its row says it is missing.
2. Pipelines (``--no-pipelines`` skips): ``load_tar().group_by_key()`` with 2 DataLoader
   workers over s3:// (when a back end for it is registered), http:// (the same /s3 URLs)
   and ais://; webdataset 1.0.2 through ``pipe:curl -s URL`` and ``pipe:aws s3 cp URL -``
   (when ``aws`` is on PATH), 3 epochs a round (an epoch of the 64 MB set is 0.4 s for
   ours; ``pipe:aws`` 1), each side's workers tallying samples and bytes in one plain
   generator (not torch's map and batch stages, which cost a hook a sample that
   webdataset's do not); then ``ExactEpochs`` by an index with member places (one
   process, shuffled: spans start mid-shard), and the time to the first batch of a state
   resumed mid-epoch; then the cache over s3:// (epoch 2 from the local copies).
3. Listing (``--no-listing`` skips): time to the first sample of a 10,000-object bucket
   listed by glob.

Every measurement runs ``--rounds`` times, the rows alternating within a round (the order
reversed every other round) so that a burst of other load hits all alike; tables give the
MEDIAN round, and the ratios the issue states.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import warnings

warnings.filterwarnings("ignore", message=r"(?s).*'datapipes', 'dataloader2' modules are deprecated")

import storage_clients

from aisio import get_client
from aisio.cluster import cluster_endpoint

BUCKET = "bench-storage"
TINY_BUCKET = "bench-storage-tiny"
MB = 1e6
HERE = os.path.dirname(os.path.abspath(__file__))


def reverse_proxy_on(endpoint: str) -> None:
    """Turns on the cluster's S3-Reverse-Proxy feature (bit 13): S3 clients then get the
    object from the proxy instead of a 307 to the target."""
    request = urllib.request.Request(f"{endpoint}/v1/cluster/set-config?features=8192", method="PUT")
    with urllib.request.urlopen(request, timeout=30) as resp:
        resp.read()


def write_shard(path: str, rng: random.Random, target: int) -> None:
    """A tar of samples (``.bin`` of 16-48 kB random bytes + ``.cls``) of about ``target`` bytes."""
    with tarfile.open(path, "w") as tar:
        i, size = 0, 0
        while size < target:
            for ext, data in (("bin", rng.randbytes(rng.randint(16_000, 48_000))), ("cls", str(i % 10).encode())):
                info = tarfile.TarInfo(f"s{i:07d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                size += 512 + (len(data) + 511) // 512 * 512
            i += 1


def make_objects(folder: str, small: int, big: int) -> dict[str, list[str]]:
    """Writes the shards (reused between runs) and puts them in BUCKET; returns the keys by set."""
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(0)
    sets: dict[str, list[str]] = {"2-4 MB": [], "64 MB": []}
    for label, count, size in (("2-4 MB", small, None), ("64 MB", big, 64 << 20)):
        for i in range(count):
            name = f"{'small' if size is None else 'big'}-{i:04d}.tar"
            path = os.path.join(folder, name)
            target = size or rng.randint(2_000_000, 4_000_000)
            if not os.path.exists(path):
                write_shard(path + ".part", rng, target)
                os.replace(path + ".part", path)
            sets[label].append(name)
    client = get_client()
    bucket = client.bucket(BUCKET)
    bucket.create(exist_ok=True)
    names = [n for keys in sets.values() for n in keys]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda n: bucket.object(n).get_writer().put_file(os.path.join(folder, n)), names))
    tiny = client.bucket(TINY_BUCKET)
    tiny.create(exist_ok=True)
    sets["1 KiB"] = [f"tiny-{i:04d}" for i in range(100)]
    payload = os.urandom(1024)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda n: tiny.object(n).get_writer().put_content(payload), sets["1 KiB"]))
    return sets


def alternating(rounds: int, rows: list) -> list[tuple[int, object]]:
    """(round, row) in the order they run: every row once a round, the order reversed every other round."""
    return [(r, row) for r in range(rounds) for row in (rows if r % 2 == 0 else rows[::-1])]


# 1. Client libraries ----------------------------------------------------------------------

class ClientProcess:
    """One storage_clients.py worker: ``run(bucket, keys)`` -> (seconds, bytes)."""

    def __init__(self, name: str, python: str, endpoint: str):
        self.name = name
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen([python, os.path.join(HERE, "storage_clients.py"), name, endpoint],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        answer = self._answer()
        self.error = answer.get("error", "")

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        return json.loads(line) if line else {"error": "the worker exited"}

    def run(self, bucket: str, keys: list[str]) -> tuple[float, int]:
        self.proc.stdin.write(json.dumps({"bucket": bucket, "keys": keys}) + "\n")
        self.proc.stdin.flush()
        answer = self._answer()
        if "error" in answer:
            raise RuntimeError(f"{self.name}: {answer['error']}")
        return answer["seconds"], answer["bytes"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def bench_clients(endpoint: str, sets: dict[str, list[str]], rounds: int, s3fs_python: str | None) -> None:
    pythons = {name: sys.executable for name in storage_clients.CLIENTS}
    pythons["s3fs"] = s3fs_python or sys.executable
    procs = [ClientProcess(name, pythons[name], endpoint) for name in storage_clients.CLIENTS]
    missing = {p.name: p.error for p in procs if p.error}
    live = [p for p in procs if not p.error]
    cases = [("2-4 MB", BUCKET, sets["2-4 MB"]), ("64 MB", BUCKET, sets["64 MB"]), ("1 KiB", TINY_BUCKET, sets["1 KiB"])]
    times: dict[tuple[str, str], list[float]] = {}
    sizes: dict[tuple[str, str], int] = {}
    for proc in live:  # warm: connections, the cluster's page cache
        for _, bucket, keys in cases:
            proc.run(bucket, keys[:2])
    for _, proc in alternating(rounds, live):
        for case, bucket, keys in cases:
            seconds, nbytes = proc.run(bucket, keys)
            times.setdefault((proc.name, case), []).append(seconds)
            sizes[proc.name, case] = nbytes
    for proc in procs:
        proc.close()
    counts = {case: len(keys) for case, _, keys in cases}
    print(f"\n1. Client libraries, one process each, objects read whole one after another "
          f"(median of {rounds} rounds, alternating)\n")
    print("| client | MB/s, 2-4 MB objects | MB/s, 64 MB objects | ms per request, 1 KiB objects "
          "| vs http.client, 2-4 MB | vs http.client, 64 MB |")
    print("|---|---:|---:|---:|---:|---:|")
    rate = {key: sizes[key] / statistics.median(t) / MB for key, t in times.items()}
    base = "http.client"
    for proc in procs:
        if proc.name in missing:
            print(f"| {proc.name} | not measured: {missing[proc.name][:120]} | | | | |")
            continue
        ms = statistics.median(times[proc.name, "1 KiB"]) / counts["1 KiB"] * 1000
        print(f"| {proc.name} | {rate[proc.name, '2-4 MB']:,.0f} | {rate[proc.name, '64 MB']:,.0f} | {ms:.2f} "
              f"| {rate[proc.name, '2-4 MB'] / rate[base, '2-4 MB']:.2f} "
              f"| {rate[proc.name, '64 MB'] / rate[base, '64 MB']:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--small", type=int, default=24, help="shards of 2-4 MB")
    parser.add_argument("--big", type=int, default=4, help="shards of 64 MB (a multiple of the 2 workers)")
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "wds-bench-storage"))
    parser.add_argument("--bucket", default="bench-storage", help="the bucket to put the shards in (deleted at the end)")
    parser.add_argument("--s3fs-python", help="a python that can import s3fs (its own venv)")
    parser.add_argument("--no-clients", dest="clients", action="store_false")
    parser.add_argument("--no-pipelines", dest="pipelines", action="store_false")
    parser.add_argument("--no-listing", dest="listing", action="store_false")
    parser.add_argument("--only-forked", action="store_true", help="only the rows of workers forked after obstore")
    parser.add_argument("--only-in-process", action="store_true",
                        help="only s3:// bodies in-process, obstore's GET vs presigned, against http:// "
                             "(raw reads and ExactEpochs by places)")
    parser.add_argument("--only-bulk-reads", action="store_true",
                        help="only s3:// bodies read in bulk against a recv() at a time, http:// and pipe:curl")
    args = parser.parse_args()
    global BUCKET, TINY_BUCKET
    BUCKET, TINY_BUCKET = args.bucket, f"{args.bucket}-tiny"
    for name in ("http_proxy", "HTTP_PROXY"):
        os.environ.pop(name, None)
    with cluster_endpoint() as endpoint:
        reverse_proxy_on(endpoint)
        started = time.perf_counter()
        sets = make_objects(args.data, args.small, args.big)
        total = sum(os.path.getsize(os.path.join(args.data, n)) for n in sets["2-4 MB"] + sets["64 MB"])
        print(f"{len(sets['2-4 MB'])} shards of 2-4 MB and {len(sets['64 MB'])} of 64 MB ({total / MB:.0f} MB) "
              f"in ais://{BUCKET} on {endpoint}, put in {time.perf_counter() - started:.1f} s; "
              f"S3 API at {endpoint}/s3 (S3-Reverse-Proxy on)")
        try:
            if args.only_forked:
                import storage_pipelines

                storage_pipelines.bench_forked(endpoint, BUCKET, sets, args.rounds)
                return
            if args.only_bulk_reads:
                import storage_pipelines

                storage_pipelines.bench_bulk_reads(endpoint, BUCKET, sets, args.rounds)
                return
            if args.only_in_process:
                import storage_in_process

                storage_in_process.bench_in_process(endpoint, BUCKET, sets, args.rounds)
                return
            if args.clients:
                bench_clients(endpoint, sets, args.rounds, args.s3fs_python)
            if args.pipelines:
                import storage_pipelines

                storage_pipelines.bench_pipelines(endpoint, BUCKET, sets, args.rounds, args.data)
            if args.listing:
                import storage_pipelines

                storage_pipelines.bench_listing(endpoint, args.rounds)
        finally:
            client = get_client()
            for name in (BUCKET, TINY_BUCKET):
                client.bucket(name).delete(missing_ok=True)
        print("\nThe cluster's nodes run on this machine and share its cores with the readers; "
              "timings swing with other load.")


if __name__ == "__main__":
    main()
