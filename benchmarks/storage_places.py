"""Part 2 of bench_storage, one process: ExactEpochs by an index with member places over each
scheme, the cache over s3://; and part 3, the time to the first sample of a bucket listed by
glob. See bench_storage's docstring."""

from __future__ import annotations

import io
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import wds_datapipes as wd
from aisio import get_client
from benchmarks.harness import CLOCK, PROCESS_CLOCK, Bench, Timings, in_turn
from benchmarks.storage_setup import SETS, place_indexes, s3_ready, urls_by_scheme

LISTED_BUCKET = "bench-storage-listed"


def _payload(sample: dict) -> int:
    return sum(len(v) for k, v in sample.items() if not k.startswith("__"))


def exact_epochs(bench: Bench, endpoint: str, bucket: str, sets: dict[str, list[str]], rounds: int,
                 per_round: int) -> None:
    """ExactEpochs (shuffled, one process) by an index with member places: samples/s of an
    epoch, and the time to the first batch of a state resumed at 50% of the epoch."""
    no_s3 = s3_ready(endpoint)
    print(f"\nExactEpochs by an index with --places, shuffled (spans start mid-shard), one process, "
          f"{per_round} epochs a round (median of {rounds} rounds, alternating)\n")
    print("| shards | reader | samples/s, an epoch | MB/s | first batch resumed at 50% (ms) |")
    print("|---|---|---:|---:|---:|")
    work = tempfile.mkdtemp(prefix="bench-storage-index-")
    try:
        for label in SETS:
            indexes = place_indexes(work, label, urls_by_scheme(endpoint, bucket, sets[label], s3=not no_s3))
            epochs, resumes = Timings(), Timings()
            for _, scheme in in_turn(rounds, list(indexes)):
                pipe = wd.ExactEpochs(indexes[scheme], batch_size=8, seed=1)

                def read(pipe=pipe) -> tuple[int, int]:  # epochs 0, 1, 2: the same samples, each epoch's own order
                    counted = [(1, _payload(sample)) for _ in range(per_round) for sample in pipe]
                    return len(counted), sum(b for _, b in counted)

                def resume(index=indexes[scheme], batches=pipe.batches_per_epoch // 2) -> int:
                    resumed = wd.ExactEpochs(index, batch_size=8, seed=1).batch_samples(8)
                    resumed.load_state_dict(wd.EpochState(epoch=0, batches=batches))
                    next(iter(resumed))
                    return 1

                epochs.add(scheme, PROCESS_CLOCK.run(read))
                resumes.add(scheme, CLOCK.run(resume))
            for scheme in indexes:
                print(f"| {label} | ours, {scheme}:// | {epochs.rate(scheme):,.0f} "
                      f"| {epochs.rate(scheme, unit='nbytes') / 1e6:,.0f} | {resumes.seconds(scheme) * 1000:,.0f} |")
            if "s3" in indexes:
                bench.ratio(f"ExactEpochs by places, {label}: s3:// / http://", epochs.ratio("s3", "http"), ">= 0.9")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def cache_over_s3(bench: Bench, endpoint: str, bucket: str, sets: dict[str, list[str]], rounds: int) -> None:
    """Epoch 1 and 2 with the cache over s3:// (2-4 MB shards, one process): epoch 2 reads
    the local copies (each opening revalidated by the object's size and version)."""
    print("\nThe cache over s3:// (2-4 MB shards, one process, load_tar().group_by_key())")
    no_s3 = s3_ready(endpoint)
    if no_s3:
        print(f"   not measured: s3:// {no_s3}")
        return
    urls = urls_by_scheme(endpoint, bucket, sets["2-4 MB"])["s3"]
    timings = Timings()

    def epoch() -> tuple[int, int]:
        sizes = [_payload(s) for s in wd.ShardLister(urls).load_tar().group_by_key()]
        return len(sizes), sum(sizes)

    for r, label in in_turn(rounds, ["no cache", "cache"]):
        folder = tempfile.mkdtemp(prefix="bench-storage-cache-")
        try:
            wd.set_cache(folder if label == "cache" else None, "100GB" if label == "cache" else 0)
            for e in (1, 2):
                timings.add(f"{label}, epoch {e}", CLOCK.run(epoch))
        finally:
            wd.set_cache(None)
            shutil.rmtree(folder, ignore_errors=True)
    for name in timings.runs:
        print(f"   {name:<22} {timings.rate(name, unit='nbytes') / 1e6:7,.0f} MB/s   "
              f"{timings.ratio(name, 'no cache, epoch 1', unit='nbytes')} x no cache, epoch 1 (paired)")
    bench.ratio("the cache over s3://, epoch 2 / no cache, epoch 1",
                timings.ratio("cache, epoch 2", "no cache, epoch 1", unit="nbytes"))


def _tiny_shard(i: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        data = f"{i}".encode()
        info = tarfile.TarInfo(f"s{i:06d}.cls")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def bench_listing(endpoint: str, rounds: int, objects: int = 10_000) -> None:
    """Time to the first sample of a bucket of ``objects`` one-sample shards listed by glob, and
    the time to list it all, for s3:// (ShardLister's glob) and ais:// (AISSourceLister)."""
    from aisio import AISSourceLister

    no_s3 = s3_ready(endpoint)
    bucket = get_client().bucket(LISTED_BUCKET)
    bucket.delete(missing_ok=True)
    bucket.create()

    def put_all() -> int:
        with ThreadPoolExecutor(8) as pool:
            return len(list(pool.map(
                lambda i: bucket.object(f"train/shard-{i:06d}.tar").get_writer().put_content(_tiny_shard(i)),
                range(objects))))

    put = CLOCK.run(put_all)
    print(f"\n3. Time to the first sample of a bucket of {objects:,} objects listed by glob "
          f"(put in {put.wall:.0f} s; median of {rounds} rounds, alternating)\n")
    makers: dict[str, Callable[[], object]] = {
        "ours, ais:// (AISSourceLister, glob)": lambda: AISSourceLister(f"ais://{LISTED_BUCKET}/train/*.tar"),
    }
    if not no_s3:
        makers["ours, s3:// (ShardLister, glob)"] = lambda: wd.ShardLister(f"s3://{LISTED_BUCKET}/train/*.tar")
    first, whole = Timings(), Timings()
    failed: dict[str, str] = {}
    for _, name in in_turn(rounds, list(makers)):
        if name in failed:
            continue
        try:
            first.add(name, CLOCK.run(lambda name=name: (next(iter(makers[name]().load_tar().group_by_key())), 1)[1]))
        except Exception as exn:  # noqa: BLE001 - a row that fails says why; the others go on
            failed[name] = f"{type(exn).__name__}: {str(exn)[:160]}"
            continue
        whole.add(name, CLOCK.run(lambda name=name: sum(1 for _ in makers[name]())))
        if whole.last(name).count != objects:
            print(f"   WARNING: {name} listed {whole.last(name).count} objects, not {objects}")
    print("| lister | first sample (ms) | the whole listing (ms) |")
    print("|---|---:|---:|")
    for name in makers:
        if name in failed:
            print(f"| {name} | failed: {failed[name]} | |")
            continue
        print(f"| {name} | {first.seconds(name) * 1000:,.0f} | {whole.seconds(name) * 1000:,.0f} |")
    if no_s3:
        print(f"| ours, s3:// (ShardLister, glob) | {no_s3} | |")
    bucket.delete(missing_ok=True)
