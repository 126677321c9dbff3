"""``bench_storage --only-in-process``: s3:// bodies in the process that calls obstore itself,
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
import tempfile

import wds_datapipes as wd
from benchmarks.harness import PROCESS_CLOCK, Bench, time_in_turn
from benchmarks.storage_setup import SETS, place_indexes, s3_ready
from wds_datapipes.shards.openers import open_shard
from wds_datapipes.storage import object_store

READERS = ("http://", "s3://, obstore's GET", "s3://, presigned (http.client)")
_PIECE = 1 << 20


def _urls(endpoint: str, bucket: str, names: list[str]) -> dict[str, list[str]]:
    s3 = [f"s3://{bucket}/{n}" for n in names]
    return {READERS[0]: [f"{endpoint}/s3/{bucket}/{n}" for n in names], READERS[1]: s3, READERS[2]: s3}


def _raw(urls: list[str]) -> tuple[int, int]:
    total, buffer = 0, bytearray(_PIECE)
    for url in urls:
        with open_shard(url, 0) as stream:
            while n := stream.readinto(buffer):
                total += n
    return len(urls), total


def _epoch(index: str) -> tuple[int, int]:
    sizes = [sum(len(v) for k, v in s.items() if not k.startswith("__"))
             for s in wd.ExactEpochs(index, batch_size=8, seed=1)]
    return len(sizes), sum(sizes)


def _as(reader: str, work):
    """``work`` run as ``reader`` reads: by obstore's GET or by presigned URLs."""
    def run():
        object_store.PRESIGNED_READS = reader != READERS[1]
        try:
            return work(reader)
        finally:
            object_store.PRESIGNED_READS = True
    return run


def _table(bench: Bench, title: str, label: str, rounds: int, work) -> None:
    timings = time_in_turn({reader: _as(reader, work) for reader in READERS}, rounds, clock=PROCESS_CLOCK, warm=True)
    sizes = {reader: timings.last(reader).nbytes for reader in READERS}
    if len(set(sizes.values())) > 1:
        print(f"   WARNING: the readers read different byte counts: {sizes}")
    for reader in READERS:
        mb = sizes[reader] / 1e6
        cpu_ms_mb = timings.seconds(reader, of="cpu") / mb * 1000
        print(f"| {title} | {label} | {reader} | {timings.rate(reader, unit='nbytes') / 1e6:,.0f} | {cpu_ms_mb:.2f} "
              f"| {timings.ratio(reader, READERS[0], unit='nbytes')} "
              f"| {1 / timings.ratio(reader, READERS[0], of='cpu', unit='nbytes').value:.2f} |")
    for reader in READERS[1:]:
        bench.ratio(f"{title}, {label}: {reader} / http://", timings.ratio(reader, READERS[0], unit="nbytes"))


def bench_in_process(bench: Bench, endpoint: str, bucket: str, sets: dict[str, list[str]], rounds: int) -> None:
    if (missing := s3_ready(endpoint)):
        print(f"   not measured: s3:// {missing}")
        return
    print(f"\ns3:// bodies in-process: obstore's GET vs presigned URLs, against http:// (median of {rounds} "
          f"rounds, alternating; ratios: the median of each round's pair)\n")
    print("| read | shards | reader | MB/s | CPU ms per MB | speed vs http:// | CPU vs http:// |")
    print("|---|---|---|---:|---:|---:|---:|")
    work_dir = tempfile.mkdtemp(prefix="bench-storage-in-process-")
    try:
        for label in SETS:
            urls = _urls(endpoint, bucket, sets[label])
            _table(bench, "raw, whole objects", label, rounds, lambda reader, urls=urls: _raw(urls[reader]))
        for label in SETS:
            indexes = place_indexes(work_dir, label, _urls(endpoint, bucket, sets[label]))
            _table(bench, "ExactEpochs by places", label, rounds,
                   lambda reader, indexes=indexes: _epoch(indexes[reader]))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    print(f"\nload average at the end of the in-process rows {os.getloadavg()}")
