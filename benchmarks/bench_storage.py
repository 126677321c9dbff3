"""Object stores: ours over s3://, http:// and ais:// against each other and webdataset, on the
same objects of one AIStore cluster, in one run (``make bench-storage``).

    python -m benchmarks.bench_storage [--rounds 5] [--small 24] [--big 4] [--no-clients]
                                       [--no-pipelines] [--no-listing] [--s3fs-python PATH]
                                       [--only-forked] [--only-in-process] [--only-bulk-reads] [--quick]

Uses ``$AIS_ENDPOINT``, else the cluster of ``python -m aisio.cluster start``, else starts
one for the run. Turns the cluster's S3-Reverse-Proxy feature on (``features=8192``), so
that every S3 client reads ``ENDPOINT/s3/BUCKET/KEY`` path style without 307 redirects;
every byte of an S3 read is then relayed by the proxy node, while ``ais://`` is redirected
to the target that holds the object. Writes tar shards of random bytes (``.bin`` members of
16-48 kB + ``.cls``): ``--small`` shards of 2-4 MB and ``--big`` of 64 MB, into one bucket.

1. Clients (``--no-clients`` skips): each S3 client library in its own process
   (benchmarks/storage_clients.py, started by ``ClientProcess``) reads every object whole, one after another: MB/s on
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
   resumed mid-epoch; then the cache over s3:// (epoch 2 from the local copies)
   (benchmarks/storage_pipelines.py, storage_places.py; ``--only-forked``,
   ``--only-in-process`` (storage_in_process.py) and ``--only-bulk-reads`` run one table alone).
3. Listing (``--no-listing`` skips): time to the first sample of a 10,000-object bucket
   listed by glob.

Every measurement runs ``--rounds`` times, the rows alternating within a round (the order
reversed every other round) so that a burst of other load hits all alike; tables give the
MEDIAN round, and the ratios the issue states as the median of each round's pair, with
their range. ``--quick``: 2 shards of 2-4 MB and 2 of 4 MB (not 64), one round of one
epoch, a listing of 100 objects.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings

warnings.filterwarnings("ignore", message=r"(?s).*'datapipes', 'dataloader2' modules are deprecated")

from aisio import get_client
from aisio.cluster import cluster_endpoint
from benchmarks import storage_clients, storage_in_process, storage_pipelines, storage_places
from benchmarks.harness import Bench, Run, Timings, in_turn, python_module
from benchmarks.storage_setup import make_objects, reverse_proxy_on

MB = 1e6


class ClientProcess:
    """One storage_clients worker: ``run(bucket, keys)`` -> (seconds, bytes)."""

    def __init__(self, name: str, python: str, endpoint: str):
        self.name = name
        command, env = python_module("benchmarks.storage_clients", name, endpoint)
        self.proc = subprocess.Popen([python, *command[1:]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=env)
        self.error = self._answer().get("error", "")

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


def bench_clients(bench: Bench, endpoint: str, sets: dict[str, list[str]], buckets: tuple[str, str], rounds: int,
                  s3fs_python: str | None) -> None:
    """Each client in its own process, the clients in turn; the worker times its own reads,
    so a round's seconds are the worker's, not the pipe's."""
    pythons = {name: sys.executable for name in storage_clients.CLIENTS}
    pythons["s3fs"] = s3fs_python or sys.executable
    procs = [ClientProcess(name, pythons[name], endpoint) for name in storage_clients.CLIENTS]
    missing = {p.name: p.error for p in procs if p.error}
    live = {p.name: p for p in procs if not p.error}
    bucket, tiny = buckets
    cases = [("2-4 MB", bucket, sets["2-4 MB"]), ("64 MB", bucket, sets["64 MB"]), ("1 KiB", tiny, sets["1 KiB"])]
    timings = Timings()
    for proc in live.values():  # warm: connections, the cluster's page cache
        for _, case_bucket, keys in cases:
            proc.run(case_bucket, keys[:2])
    for _, name in in_turn(rounds, list(live)):
        for case, case_bucket, keys in cases:
            seconds, nbytes = live[name].run(case_bucket, keys)
            timings.add(f"{name}, {case}", Run(seconds, 0.0, len(keys), nbytes))
    for proc in procs:
        proc.close()
    print(f"\n1. Client libraries, one process each, objects read whole one after another "
          f"(median of {rounds} rounds, alternating)\n")
    print("| client | MB/s, 2-4 MB objects | MB/s, 64 MB objects | ms per request, 1 KiB objects "
          "| vs http.client, 2-4 MB | vs http.client, 64 MB |")
    print("|---|---:|---:|---:|---:|---:|")
    for proc in procs:
        name = proc.name
        if name in missing:
            print(f"| {name} | not measured: {missing[name][:120]} | | | | |")
            continue
        rate = {case: timings.rate(f"{name}, {case}", unit="nbytes") / MB for case in ("2-4 MB", "64 MB")}
        versus = {case: timings.ratio(f"{name}, {case}", f"http.client, {case}", unit="nbytes")
                  for case in ("2-4 MB", "64 MB")}
        ms = 1000 / timings.rate(f"{name}, 1 KiB")
        print(f"| {name} | {rate['2-4 MB']:,.0f} | {rate['64 MB']:,.0f} | {ms:.2f} | {versus['2-4 MB']} "
              f"| {versus['64 MB']} |")


def main(argv: list[str] | None = None) -> None:
    bench = Bench("bench_storage", __doc__, peers=("webdataset", "obstore", "boto3", "s3fs", "multi-storage-client",
                                                   "awscli", "aistore"), data="wds-bench-storage")
    bench.parser.add_argument("--small", type=int, default=24, help="shards of 2-4 MB")
    bench.parser.add_argument("--big", type=int, default=4, help="shards of 64 MB (a multiple of the 2 workers)")
    bench.parser.add_argument("--bucket", default="bench-storage",
                              help="the bucket to put the shards in (deleted at the end)")
    bench.parser.add_argument("--s3fs-python", help="a python that can import s3fs (its own venv)")
    bench.parser.add_argument("--no-clients", dest="clients", action="store_false")
    bench.parser.add_argument("--no-pipelines", dest="pipelines", action="store_false")
    bench.parser.add_argument("--no-listing", dest="listing", action="store_false")
    bench.parser.add_argument("--only-forked", action="store_true", help="only the rows of workers forked after obstore")
    bench.parser.add_argument("--only-in-process", action="store_true",
                              help="only s3:// bodies in-process, obstore's GET vs presigned, against http:// "
                                   "(raw reads and ExactEpochs by places)")
    bench.parser.add_argument("--only-bulk-reads", action="store_true",
                              help="only s3:// bodies read in bulk against a recv() at a time, http:// and pipe:curl")
    args = bench.parse(argv)
    big_size, per_round, listed = 64 << 20, storage_pipelines.PER_ROUND, 10_000
    if args.quick:
        args.small, args.big, big_size, per_round, listed = min(args.small, 2), min(args.big, 2), 4 << 20, 1, 100
    buckets = (args.bucket, f"{args.bucket}-tiny")
    only = next((name for name in ("forked", "in_process", "bulk_reads") if getattr(args, f"only_{name}")), "")
    for name in ("http_proxy", "HTTP_PROXY"):
        os.environ.pop(name, None)
    with cluster_endpoint() as endpoint, bench.results(args, variant=only.replace("_", "-")):
        reverse_proxy_on(endpoint)
        started = time.perf_counter()
        sets = make_objects(args.data, args.small, args.big, *buckets, big_size=big_size)
        total = sum(os.path.getsize(os.path.join(args.data, n)) for n in sets["2-4 MB"] + sets["64 MB"])
        print(f"{len(sets['2-4 MB'])} shards of 2-4 MB and {len(sets['64 MB'])} of {big_size >> 20} MB "
              f"({total / MB:.0f} MB) in ais://{args.bucket} on {endpoint}, put in {time.perf_counter() - started:.1f} s; "
              f"S3 API at {endpoint}/s3 (S3-Reverse-Proxy on)")
        try:
            if only == "forked":
                storage_pipelines.bench_forked(bench, endpoint, args.bucket, sets, args.rounds)
            elif only == "bulk_reads":
                storage_pipelines.bench_bulk_reads(bench, endpoint, args.bucket, sets, args.rounds)
            elif only == "in_process":
                storage_in_process.bench_in_process(bench, endpoint, args.bucket, sets, args.rounds)
            else:
                if args.clients:
                    bench_clients(bench, endpoint, sets, buckets, args.rounds, args.s3fs_python)
                if args.pipelines:
                    storage_pipelines.bench_pipelines(bench, endpoint, args.bucket, sets, args.rounds, per_round)
                    # first: its in-process row needs a parent that has not used obstore
                    storage_pipelines.bench_forked(bench, endpoint, args.bucket, sets, args.rounds)
                    storage_places.exact_epochs(bench, endpoint, args.bucket, sets, args.rounds, per_round)
                    storage_places.cache_over_s3(bench, endpoint, args.bucket, sets, args.rounds)
                if args.listing:
                    storage_places.bench_listing(endpoint, args.rounds, listed)
        finally:
            client = get_client()
            for name in buckets:
                client.bucket(name).delete(missing_ok=True)
        print("\nThe cluster's nodes run on this machine and share its cores with the readers; "
              "timings swing with other load.")


if __name__ == "__main__":
    main()
