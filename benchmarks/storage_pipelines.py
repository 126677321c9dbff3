"""Part 2 of bench_storage: whole pipelines with 2 DataLoader workers over s3://, http://,
ais:// and webdataset's ``pipe:``; s3:// in workers forked after the parent used obstore
(``--only-forked``); s3:// bodies read in bulk or a recv() at a time (``--only-bulk-reads``).
See bench_storage's docstring; ExactEpochs, the cache and listing are in storage_places."""

from __future__ import annotations

import os
import shutil
import sys

import webdataset as wds

import wds_datapipes as wd
from benchmarks.harness import Bench, Timings, time_in_turn
from benchmarks.storage_setup import SETS, s3_ready, urls_by_scheme
from benchmarks.worker_loaders import Loader, below_ticks, started, stopped, worker_clock

PER_ROUND = 3  # epochs a round in the pipelines' table: an epoch of the 64 MB set is about 0.4 s for ours
SLOW_PER_ROUND = 1  # for pipe:aws (8-80x slower: one epoch is seconds)


def _ours(urls: list[str], generator_tally: bool = False) -> Loader:
    return Loader("datapipes", lambda: wd.ShardLister(urls).load_tar().group_by_key(), generator_tally=generator_tally)


def _webdataset(urls: list[str], generator_tally: bool = False) -> Loader:
    return Loader("webdataset", lambda: wds.WebDataset(urls, shardshuffle=False, empty_check=False),
                  generator_tally=generator_tally)


def measure(loaders: dict[str, Loader], rounds: int, epochs: dict[str, int], clock) -> Timings:
    """Every loader up and warmed, then rounds of each in turn (``epochs[name]`` epochs a round)."""
    started(loaders)
    try:
        paths = {name: (lambda loader=loader, n=epochs[name]: loader.epochs(n)) for name, loader in loaders.items()}
        return time_in_turn(paths, rounds, clock=clock)
    finally:
        stopped(loaders)


def mb_s(timings: Timings, name: str) -> float:
    return timings.rate(name, unit="nbytes") / 1e6


def bench_pipelines(bench: Bench, endpoint: str, bucket: str, sets: dict[str, list[str]], rounds: int,
                    per_round: int = PER_ROUND) -> None:
    no_s3 = s3_ready(endpoint)
    beside = os.path.join(os.path.dirname(sys.executable), "aws")  # the bench venv's, before any on PATH
    aws = beside if os.path.exists(beside) else shutil.which("aws")
    print("\n2. Pipelines: load_tar().group_by_key(), raw (no decoding), DataLoader with 2 workers, "
          f"{per_round} epochs a round ({SLOW_PER_ROUND} for pipe:aws), each side's samples tallied by one plain "
          f"generator in its workers (MB/s of the median of {rounds} rounds, alternating)")
    if no_s3:
        print(f"   s3:// rows: {no_s3}")
    if not aws:
        print("   webdataset over `aws s3 cp`: no `aws` on PATH (pip install awscli)")
    tables: dict[str, Timings] = {}
    for label in SETS:
        urls = urls_by_scheme(endpoint, bucket, sets[label], s3=not no_s3)
        loaders = {f"ours, {scheme}://": _ours(u, generator_tally=True) for scheme, u in urls.items()}
        loaders["webdataset, pipe:curl"] = _webdataset([f"pipe:curl -s -f {u}" for u in urls["http"]], True)
        if aws:
            loaders["webdataset, pipe:aws s3 cp"] = _webdataset(
                [f"pipe:{aws} s3 cp --only-show-errors s3://{bucket}/{n} -" for n in sets[label]], True)
        epochs = {name: SLOW_PER_ROUND if "pipe:aws" in name else per_round for name in loaders}
        tables[label] = measure(loaders, rounds, epochs, worker_clock([]))
        counts = {loader.last for loader in loaders.values()}
        if len(counts) > 1:
            print(f"   WARNING: the rows read different samples/bytes on {label}: {sorted(counts)}")
    print("\n| reader | MB/s, 2-4 MB shards | MB/s, 64 MB shards |")
    print("|---|---:|---:|")
    for name in tables["2-4 MB"].runs:
        print(f"| {name} | {mb_s(tables['2-4 MB'], name):,.0f} | {mb_s(tables['64 MB'], name):,.0f} |")
    print("\nratios, the median of the rounds' pairs (range) [goals]")
    for a, b, goal in (("ours, s3://", "ours, http://", ">= 0.9"), ("ours, s3://", "ours, ais://", None),
                       ("ours, http://", "ours, ais://", None), ("ours, s3://", "webdataset, pipe:curl", ">= 3"),
                       ("ours, s3://", "webdataset, pipe:aws s3 cp", ">= 3"),
                       ("ours, http://", "webdataset, pipe:curl", None)):
        for label, timings in tables.items():
            if a in timings and b in timings:
                bench.ratio(f"{label}: {a} / {b}", timings.ratio(a, b, unit="nbytes"), goal)
            else:
                print(f"  {label}: {a} / {b}: not measured ({'s3:// back end not available' if no_s3 else 'a row is missing'})")


def bench_forked(bench: Bench, endpoint: str, bucket: str, sets: dict[str, list[str]], rounds: int) -> None:
    """s3:// in DataLoader workers forked after this process used obstore (obstore's runtime
    does not survive a fork): by presigned URLs (the agent signs, the bytes come straight
    from the server) and with the agent relaying every byte, against workers forked before
    the parent used obstore (in-process obstore) and http:// on the same 2-4 MB shards.
    CPU: the workers' and their agents' (every process below this one but the cluster's)."""
    from wds_datapipes.storage import object_store, store_calls

    no_s3 = s3_ready(endpoint)
    print("\ns3:// in workers forked after the parent used obstore, 2-4 MB shards, 2 workers "
          f"(median of {rounds} rounds, alternating)")
    if no_s3:
        print(f"   not measured: s3:// {no_s3}")
        return
    urls = urls_by_scheme(endpoint, bucket, sets["2-4 MB"])
    loaders: dict[str, Loader] = {}
    if store_calls._runtime_pid is None:  # workers forked now make their calls in-process
        loaders["s3://, in-process obstore (forked before)"] = _ours(urls["s3"])
        started({"": loaders["s3://, in-process obstore (forked before)"]})
    else:
        print("   (no in-process row: this process used obstore before)")
    object_store.S3.stamp(urls["s3"][0])  # obstore used here: the workers below are forked after it
    for presigned, name in ((False, "s3://, the agent relays the bytes"), (True, "s3://, presigned URLs")):
        object_store.PRESIGNED_READS = presigned  # the workers forked now keep it
        loaders[name] = _ours(urls["s3"])
        started({"": loaders[name]})
    object_store.PRESIGNED_READS = True
    loaders["http://"] = _ours(urls["http"])
    started({"": loaders["http://"]})
    try:
        paths = {name: (lambda loader=loader: loader.epochs(1)) for name, loader in loaders.items()}
        timings = time_in_turn(paths, rounds, clock=worker_clock([], workers=below_ticks))
    finally:
        stopped(loaders)
    first = next(iter(loaders))
    print("\n| workers' reader | MB/s | vs the first row (paired) | CPU ms per MB (workers + agents) |")
    print("|---|---:|---:|---:|")
    for name in loaders:
        print(f"| {name} | {mb_s(timings, name):,.0f} | {timings.ratio(name, first, unit='nbytes')} "
              f"| {timings.cpu_per(name, per=10**6, part='workers') * 1000 / _bytes_per_count(timings, name):.2f} |")
    for name in loaders:
        if name != "http://":
            bench.ratio(f"forked after obstore: {name} / http://", timings.ratio(name, "http://", unit="nbytes"))


def _bytes_per_count(timings: Timings, name: str) -> float:
    run = timings.last(name)
    return run.nbytes / max(run.count, 1)


def bench_bulk_reads(bench: Bench, endpoint: str, bucket: str, sets: dict[str, list[str]], rounds: int) -> None:
    """``--only-bulk-reads``: s3:// with presigned bodies read in bulk (each read waiting for up to
    ``signed_get.RECEIVE_LOW_WATER`` bytes) and one recv() at a time, against http:// and
    webdataset's ``pipe:curl``, on both shard sizes: MB/s of the median round, the paired
    ratio of each round, and CPU ms per MB of the workers, the main process and the cluster."""
    from aisio.cluster import LocalCluster
    from wds_datapipes.storage import signed_get

    no_s3 = s3_ready(endpoint)
    if no_s3:
        print(f"\nbulk reads: not measured: s3:// {no_s3}")
        return
    cluster = LocalCluster.running()
    nodes = [n.pid for n in cluster.nodes] if cluster is not None and cluster.endpoint == endpoint else []
    bulk = signed_get.RECEIVE_LOW_WATER
    print(f"\ns3:// bodies read in bulk or one recv() at a time, 2 workers (median of {rounds} rounds, alternating)")
    for label in SETS:
        urls = urls_by_scheme(endpoint, bucket, sets[label])
        loaders: dict[str, Loader] = {}
        for name, scheme, low_water in (("s3://, bulk", "s3", bulk), ("s3://, a recv() at a time", "s3", 0),
                                        ("http://", "http", bulk)):
            signed_get.RECEIVE_LOW_WATER = low_water  # the workers forked now keep it
            loaders[name] = _ours(urls[scheme])
            started({"": loaders[name]})
        signed_get.RECEIVE_LOW_WATER = bulk
        loaders["webdataset, pipe:curl"] = _webdataset([f"pipe:curl -s -f {u}" for u in urls["http"]])
        started({"": loaders["webdataset, pipe:curl"]})
        try:
            paths = {name: (lambda loader=loader: loader.epochs(1)) for name, loader in loaders.items()}
            timings = time_in_turn(paths, rounds, clock=worker_clock(nodes))
        finally:
            stopped(loaders)
        print(f"\n{label} shards\n\n| reader | MB/s | vs s3://, bulk (paired) | CPU ms/MB: workers | main | cluster |")
        print("|---|---:|---:|---:|---:|---:|")
        for name in loaders:
            per_mb = {part: timings.cpu_per(name, per=10**6, part=part) * 1000 / _bytes_per_count(timings, name)
                      for part in ("workers", "main", "cluster")}
            print(f"| {name} | {mb_s(timings, name):,.0f} | {timings.ratio(name, 's3://, bulk', unit='nbytes')} "
                  f"| {per_mb['workers']:.2f} | {per_mb['main']:.2f} | {per_mb['cluster']:.2f} |")
        for name in loaders:
            if name != "s3://, bulk":
                bench.ratio(f"{label}: s3://, bulk / {name}", timings.ratio("s3://, bulk", name, unit="nbytes"))
