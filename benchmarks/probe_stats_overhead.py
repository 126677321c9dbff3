"""What stats cost when on (``wd.stats.enable()``), against the same pipeline with stats off.

Paths, each timed on and off in turn (the order reversed every other round), the ratio taken
within each round and summed up as the median of the pairs:

- raw samples by member places (``ExactEpochs``, ``views=True``, one process): 1 KB samples in
  order (the fastest path), and photos (~50 KB) in order and shuffled;
- the README's vision recipe: ``decode_batches`` to 224x224 crops, ``DataLoader`` with 2 workers,
  read through ``stats.watch`` when on.

Usage: ``python -m benchmarks.probe_stats_overhead [--rounds 9] [--quick]``. It prints what
turning stats on costs by the wall clock and by CPU (this process's and its reaped workers'):
+1% is the issue's budget. On a loaded machine the wall clock's pairs spread by several
percent either way: read the median with its range, and the CPU's.
"""

from __future__ import annotations

import os

from torch.utils.data import DataLoader

import wds_datapipes as wd
from benchmarks.harness import Bench, time_in_turn
from benchmarks.raw_reading import exact_epochs, places_index
from benchmarks.shards import make_payload_shards, make_photo_shards
from benchmarks.vision_loops import EVAL, count_samples, ours_vision


def _switched(on: bool, make, watch: bool = False):
    """A harness path: stats turned on (or off), the pipeline built, read whole, stats off again."""

    def run() -> int:
        if on:
            wd.stats.enable()
        try:
            items = make()
            return count_samples(wd.stats.watch(items) if watch and on else items)
        finally:
            wd.stats.disable()

    return run


def main(argv=None) -> None:
    bench = Bench("probe_stats_overhead", __doc__, rounds=9)
    args = bench.parse(argv)
    small = 4000 if args.quick else 60_000
    photos = 128 if args.quick else 2000
    with bench.results(args):
        small_index = places_index(make_payload_shards(os.path.join(args.data, "payload"), 1, small, 2000),
                                   os.path.join(args.data, "index", f"payload-1k-{small}.json"))
        photo_files = make_photo_shards(os.path.join(args.data, "photos"), photos)
        photo_index = places_index(photo_files, os.path.join(args.data, "index", f"photos-{photos}.json"))
        vision = photo_files[: max(1, len(photo_files) // 4)]  # a quarter: the recipe decodes every photo
        cases = {
            "places, 1 KB, in order": (lambda: exact_epochs(small_index, False, views=True), small, False),
            "places, photos, in order": (lambda: exact_epochs(photo_index, False, views=True), photos, False),
            "places, photos, shuffled": (lambda: exact_epochs(photo_index, True, views=True), photos, False),
            "vision recipe, DataLoader 2 workers": (
                lambda: DataLoader(ours_vision(vision, EVAL, 0), batch_size=None, num_workers=2),
                sum(1 for _ in wd.ShardLister(vision).load_tar().group_by_key()), True),
        }
        for name, (make, count, watch) in cases.items():
            paths = {"off": _switched(False, make), "on": _switched(True, make, watch)}
            timings = time_in_turn(paths, args.rounds, warm=True, expect=count)
            print(f"  {name:<38} off {timings.rate('off'):10,.0f}/s  on {timings.rate('on'):10,.0f}/s")
            for of in ("wall", "cpu"):  # off's rate over on's: what turning stats on costs
                ratio = timings.ratio("off", "on", of=of)
                print(f"    on costs {ratio.value - 1:+.2%} by {of:<4} (pairs {ratio.low - 1:+.2%} .. "
                      f"{ratio.high - 1:+.2%}, {ratio.pairs} rounds)")


if __name__ == "__main__":
    main()
