"""Exact epochs: planning cost, resume cost, and shuffle quality, in one run.

    python -m benchmarks.bench_epochs [--shards 64] [--per-shard 500] [--sample-kb 8] [--rounds 3] [--quick]

1. Planning: the plan of one rank over 100,000 shards of 10,000 samples (10^9 samples),
   and after a topology change mid-epoch: time and peak memory (tracemalloc); the same for
   a mixture of 100 sources of 1,000 such shards each, in each batching.
2. Resuming: time to the first batch of a new pipeline loaded with a state at 10% and at
   90% of an epoch, with member places (each sample read at its place), with the index's
   sample offsets (one seek per lane) and without them (tar headers walked, payloads
   seeked over), on shards in the page cache.
3. Shuffle quality, against webdataset's shard shuffle + buffer shuffle holding as many
   samples as our shuffle block: the correlation between a sample's position in the epoch
   and its position in the dataset, and how many shards a batch of 64 draws from.
4. Reading a mixture of 100 one-shard sources: samples/s, the most shards open at once,
   the samples held.

Times are medians of ``--rounds`` runs (a plan's peak memory is taken from one more run,
traced: tracing slows Python code about twice); the resume rows run in turn, the order
reversed every other round, and the 90% / 10% ratio is the median of each round's pair.
``--quick``: plans of 1,000 shards (a mixture: 4 sources of 50), 4 shards of 50 samples,
a mixture of 4 sources of 50 samples, one round.
"""

from __future__ import annotations

import os
import time
import tracemalloc

import numpy as np
import webdataset as wds

import wds_datapipes as wd
from benchmarks.harness import PROCESS_CLOCK, Bench, median, time_in_turn
from wds_datapipes.epochs.mixture import MixSettings, epoch_windows, plan_mixture
from wds_datapipes.epochs.plan import PlanSettings, Segment, plan_epoch

BATCH = 64


def make_shards(folder: str, shards: int, per_shard: int, sample_kb: int) -> list[str]:
    paths = [os.path.join(folder, f"epochs-{i:05d}.tar") for i in range(shards)]
    stamp = os.path.join(folder, f".done-{shards}-{per_shard}-{sample_kb}")
    if not os.path.exists(stamp):
        payload = os.urandom(sample_kb * 1024)
        for s, path in enumerate(paths):
            with wds.TarWriter(path) as writer:
                for i in range(per_shard):
                    writer.write({"__key__": f"s{s:05d}-{i:05d}", "bin": payload, "cls": str(i % 10)})
        open(stamp, "w").close()
    return paths


def measured(work, rounds: int):
    """(seconds, peak bytes, result) of ``work()``: the median time of ``rounds`` runs without
    tracing (which slows Python code about twice), the peak of one traced run."""
    result = None

    def run() -> int:
        nonlocal result
        result = work()
        return 1

    elapsed = median(PROCESS_CLOCK.run(run).wall for _ in range(rounds))
    tracemalloc.start()
    work()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return elapsed, peak, result


def histories(samples: int) -> tuple:
    """A plain epoch, and one resumed after a topology change: 8 ranks of 4 workers that each
    took 1% of the epoch (10^7 of 10^9 samples)."""
    return ("plain epoch", ()), ("after a topology change", (Segment(8, 4, (samples // 100,) * 4),))


def bench_planning(shards: int, rounds: int) -> None:
    print(f"1. planning one rank's epoch: {shards:,} shards x 10,000 samples ({shards * 10_000:,} samples)")
    sizes = np.full(shards, 10_000)
    settings = PlanSettings(seed=1, batch_size=BATCH)
    for label, history in histories(shards * 10_000):
        def work(history=history):
            plan = plan_epoch(sizes, settings, 3, 8, 4, history)
            reader = plan.reader(5, 2)
            return plan.reader_spans(5, 2), reader, reader.block_positions(0)

        elapsed, peak, (spans, reader, first_block) = measured(work, rounds)
        print(f"   {label:<26} {elapsed * 1000:7.1f} ms, peak {peak / 1e6:6.1f} MB "
              f"(8 ranks x 4 workers; reader 5/2: {reader.length:,} samples, {len(list(spans)):,} spans, "
              f"first block {len(first_block)})")


def bench_mixture_planning(sources: int, shards: int, rounds: int) -> None:
    print(f"1b. planning one rank's epoch of a mixture: {sources} sources, {sources * shards:,} shards x 10,000 "
          "samples in all")
    sizes = [np.full(shards, 10_000) for _ in range(sources)]
    weights = tuple(float(w) for w in np.random.default_rng(0).uniform(0.1, 1.0, sources).round(3))
    for batching in ("random", "stratified", "per_source"):
        settings = MixSettings(names=tuple(f"source-{k}" for k in range(sources)), weights=weights,
                               samples_per_epoch=sources * shards * 10_000, batching=batching, seed=1,
                               batch_size=BATCH)
        for label, history in histories(sources * shards * 10_000):
            def work(settings=settings, history=history):
                windows = epoch_windows(settings, [int(s.sum()) for s in sizes], 3)
                reader = plan_mixture(sizes, settings, 3, windows, 8, 4, history).reader(5, 2)
                return reader, next(reader.sources(0))

            elapsed, peak, (reader, first) = measured(work, rounds)
            print(f"   {batching:<10} {label:<26} {elapsed * 1000:7.1f} ms, peak {peak / 1e6:6.1f} MB "
                  f"(reader 5/2: {reader.length:,} samples from {sum(len(s) > 0 for s in reader.spans)} sources, "
                  f"first run {len(first)})")


def first_batch(index: str, state: wd.EpochState) -> int:
    """Builds a pipeline, loads ``state`` and takes its first batch (the clock times all of it)."""
    dp = wd.ExactEpochs(index, batch_size=BATCH).batch_samples(BATCH)
    dp.load_state_dict(state)
    next(iter(dp))
    return 1


def bench_resume(bench: Bench, folder: str, shards: list[str], rounds: int) -> None:
    print(f"2. time to the first batch after resuming (page cache warm; median of {rounds} round(s) in turn)")
    kinds = {"with places": {"places": True}, "with offsets": {}, "without offsets": {"offsets": False}}
    paths, per_epoch = {}, 0
    for kind, options in kinds.items():
        index = os.path.join(folder, f"index-{kind.replace(' ', '-')}.json")
        wd.ShardIndex.from_scans(wd.build_index(shards, places=options.get("places", False)),
                                 relative_to=index).save(index, offsets=options.get("offsets", True))
        per_epoch = wd.ExactEpochs(index, batch_size=BATCH).batches_per_epoch
        for share in (0.1, 0.9):
            state = wd.EpochState(epoch=0, batches=int(per_epoch * share))
            paths[f"{kind} at {share:.0%}"] = lambda index=index, state=state: first_batch(index, state)
    timings = time_in_turn(paths, rounds, clock=PROCESS_CLOCK, warm=True)
    for kind in kinds:
        for share in ("10%", "90%"):
            print(f"   {kind:<17} at {share} of the epoch: {timings.seconds(f'{kind} at {share}') * 1000:7.1f} ms")
        bench.ratio(f"{kind}, 90% / 10%", timings.ratio(f"{kind} at 10%", f"{kind} at 90%"), "< 1.5")
    print(f"   ({per_epoch} batches of {BATCH} per epoch)")


def bench_mixture_reading(folder: str, sources: int = 100, per_shard: int = 200, sample_kb: int = 8) -> None:
    """Reads (not only plans) an epoch of a mixture of one-shard sources: samples/s, the most
    shards open at once (files in /proc/self/fd), and the samples the reader holds."""
    print(f"4. reading a mixture: {sources} sources of one shard x {per_shard} samples of {sample_kb} KB "
          "(random batching, lanes=16, block=512)")
    indexes = {}
    for k in range(sources):
        sub = os.path.join(folder, f"mix-{k:03d}")
        os.makedirs(sub, exist_ok=True)
        index = os.path.join(sub, "index.json")
        if not os.path.exists(index):
            shard = make_shards(sub, 1, per_shard, sample_kb)
            wd.ShardIndex.from_scans(wd.build_index(shard), relative_to=index).save(index)
        indexes[f"source-{k:03d}"] = index
    dp = wd.MixedEpochs(indexes, batch_size=BATCH, seed=1)
    fds = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else None
    before = len(os.listdir(fds)) if fds else 0
    most, count = 0, 0
    start = time.perf_counter()
    for count, _ in enumerate(dp, 1):
        if fds and count % 64 == 0:
            most = max(most, len(os.listdir(fds)) - before)
    elapsed = time.perf_counter() - start
    held = sum(plan.block_size for plan in dp._run.reader().plans)
    print(f"   {count:,} samples in {elapsed:.2f} s ({count / elapsed:,.0f}/s); at most {most} more files open "
          f"(limit of open files: usually 1024); samples held at once: at most {held}")


def quality(order: list[str], dataset: dict[str, int], shard_of: dict[str, int]) -> tuple[float, float]:
    positions = np.array([dataset[k] for k in order])
    correlation = abs(np.corrcoef(np.arange(len(positions)), positions)[0, 1])
    batches = [order[i : i + BATCH] for i in range(0, len(order) - BATCH + 1, BATCH)]
    shards_per_batch = float(np.mean([len({shard_of[k] for k in b}) for b in batches]))
    return correlation, shards_per_batch


def bench_quality(folder: str, shards: list[str], block: int) -> None:
    print(f"3. shuffle quality (batches of {BATCH}; memory: {block} samples)")
    index = wd.ShardIndex.from_scans(wd.build_index(shards))
    dataset, shard_of = {}, {}
    for s in range(len(index)):
        for i in range(int(index.sizes[s])):
            key = f"s{s:05d}-{i:05d}"
            dataset[key] = len(dataset)
            shard_of[key] = s
    ours = [s["__key__"] for s in wd.ExactEpochs(index, batch_size=BATCH, block=block, seed=3)]
    theirs = [s["__key__"] for s in wds.WebDataset(shards, shardshuffle=len(shards), seed=3).shuffle(block)]
    print(f"   {'':<44} {'|corr(epoch, dataset)|':>22} {'shards per batch':>17}")
    for label, order in ((f"ours: ExactEpochs(lanes=16, block={block})", ours),
                         (f"webdataset: shardshuffle + shuffle({block})", theirs)):
        corr, per_batch = quality(order, dataset, shard_of)
        print(f"   {label:<44} {corr:22.3f} {per_batch:17.1f}")


def main(argv: list[str] | None = None) -> None:
    bench = Bench("bench_epochs", __doc__, peers=("webdataset",), rounds=3, data="wds-bench-epochs")
    bench.parser.add_argument("--shards", type=int, default=64)
    bench.parser.add_argument("--per-shard", type=int, default=500)
    bench.parser.add_argument("--sample-kb", type=int, default=8)
    args = bench.parse(argv)
    plan_shards, mix_sources, mix_shards, read_sources = 100_000, 100, 1000, 100
    if args.quick:
        args.shards, args.per_shard = min(args.shards, 4), min(args.per_shard, 50)
        plan_shards, mix_sources, mix_shards, read_sources = 1000, 4, 50, 4
    os.makedirs(args.data, exist_ok=True)
    with bench.results(args):
        bench_planning(plan_shards, args.rounds)
        bench_mixture_planning(mix_sources, mix_shards, args.rounds)
        shards = make_shards(args.data, args.shards, args.per_shard, args.sample_kb)
        print(f"data: {args.shards} shards x {args.per_shard} samples of {args.sample_kb} KB")
        bench_resume(bench, args.data, shards, args.rounds)
        bench_quality(args.data, shards, 512)
        bench_mixture_reading(args.data, sources=read_sources, per_shard=50 if args.quick else 200)


if __name__ == "__main__":
    main()
