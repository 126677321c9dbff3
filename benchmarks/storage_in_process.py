"""``bench_storage.py --only-in-process``: s3:// bodies in the process that calls obstore itself,
by obstore's GET against by a URL this process presigns (read by http.client), and our own
http:// read of the same objects at the same endpoint: raw reads (each object whole, one
after another, 1 MiB pieces) and ExactEpochs by an index with member places (shuffled: spans
start mid-shard), on 2-4 MB and 64 MB shards.

The rows alternate within a round (the order reversed every other round). Besides the median
round, each round's ratios against http:// (wall and CPU) are taken as pairs, and their
median given: a burst of other load then hits both sides of a ratio alike. CPU is this
process's (user + system, every thread: obstore's runtime threads too)."""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

from bench_storage import alternating

import wds_datapipes as wd
from wds_datapipes.shards.openers import open_shard
from wds_datapipes.storage import object_store

READERS = ("http://", "s3://, obstore's GET", "s3://, presigned (http.client)")
_PIECE = 1 << 20


def _urls(endpoint: str, bucket: str, names: list[str]) -> dict[str, list[str]]:
    s3 = [f"s3://{bucket}/{n}" for n in names]
    return {READERS[0]: [f"{endpoint}/s3/{bucket}/{n}" for n in names], READERS[1]: s3, READERS[2]: s3}


def _raw(urls: list[str]) -> int:
    total, buffer = 0, bytearray(_PIECE)
    for url in urls:
        with open_shard(url, 0) as stream:
            while n := stream.readinto(buffer):
                total += n
    return total


def _epoch(index: str) -> int:
    return sum(sum(len(v) for k, v in s.items() if not k.startswith("__"))
               for s in wd.ExactEpochs(index, batch_size=8, seed=1))


def _run(reader: str, work) -> tuple[float, float, int]:
    object_store.PRESIGNED_READS = reader != READERS[1]
    try:
        began, cpu = time.perf_counter(), time.process_time()
        nbytes = work(reader)
        return time.perf_counter() - began, time.process_time() - cpu, nbytes
    finally:
        object_store.PRESIGNED_READS = True


def _table(title: str, label: str, rounds: int, work) -> None:
    wall: dict[str, list[float]] = {r: [] for r in READERS}
    cpu: dict[str, list[float]] = {r: [] for r in READERS}
    sizes = {}
    for reader in READERS:  # warm: connections, the cluster's page cache
        _run(reader, work)
    for _, reader in alternating(rounds, list(READERS)):
        seconds, cpu_s, nbytes = _run(reader, work)
        wall[reader].append(seconds)
        cpu[reader].append(cpu_s)
        sizes[reader] = nbytes
    if len(set(sizes.values())) > 1:
        print(f"   WARNING: the readers read different byte counts: {sizes}")
    base = READERS[0]
    for reader in READERS:
        mb = sizes[reader] / 1e6
        wall_ratio = statistics.median(w0 / w for w0, w in zip(wall[base], wall[reader]))  # speed vs http://
        cpu_ratio = statistics.median(c / c0 for c0, c in zip(cpu[base], cpu[reader]))
        print(f"| {title} | {label} | {reader} | {mb / statistics.median(wall[reader]):,.0f} "
              f"| {statistics.median(cpu[reader]) / mb * 1000:.2f} | {wall_ratio:.2f} | {cpu_ratio:.2f} |")


def bench_in_process(endpoint: str, bucket: str, sets: dict[str, list[str]], rounds: int) -> None:
    import storage_pipelines

    storage_pipelines.s3_environment(endpoint)
    if (missing := storage_pipelines.s3_missing()):
        print(f"   not measured: s3:// {missing}")
        return
    print(f"\ns3:// bodies in-process: obstore's GET vs presigned URLs, against http:// (median of {rounds} "
          f"rounds, alternating; ratios: the median of each round's pair); load average {os.getloadavg()}\n")
    print("| read | shards | reader | MB/s | CPU ms per MB | speed vs http:// | CPU vs http:// |")
    print("|---|---|---|---:|---:|---:|---:|")
    work_dir = tempfile.mkdtemp(prefix="bench-storage-in-process-")
    try:
        for label in ("2-4 MB", "64 MB"):
            urls = _urls(endpoint, bucket, sets[label])
            _table("raw, whole objects", label, rounds, lambda reader, urls=urls: _raw(urls[reader]))
        for label in ("2-4 MB", "64 MB"):
            indexes = storage_pipelines.place_indexes(work_dir, label, _urls(endpoint, bucket, sets[label]))
            _table("ExactEpochs by places", label, rounds, lambda reader, indexes=indexes: _epoch(indexes[reader]))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    print(f"\nload average at the end {os.getloadavg()}")
