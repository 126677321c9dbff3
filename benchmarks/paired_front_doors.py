"""Section 3b's worker front doors under two library trees, timed in turn (before / after a change).

``python benchmarks/paired_front_doors.py BEFORE_TREE AFTER_TREE [--rounds 3]``: each round runs,
for each tree in turn, a fresh process with that tree first on ``PYTHONPATH``; the process
builds one pipe first (as a training script's first epoch, or section 3b's ceiling row, does
before the rows are timed), then times one epoch of the ceiling and of each front door, each
from building its loader, and prints (samples/s, CPU s per 1,000 samples of the process and
its workers). The medians of each tree's rounds are printed side by side. A tree is a folder
holding ``wds_datapipes`` (e.g. ``git archive BASE wds_datapipes | tar -x -C /tmp/before``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = """
import json, os, sys, time
sys.path.insert(0, {here!r})
import torch
from torch.utils.data import DataLoader
import wds_datapipes as wd
import bench_pipeline as bp
from front_doors import _cpu_seconds, generic_recipe, StatefulDataLoader
from shards import make_photo_shards

torch.set_num_threads(1)
photos = make_photo_shards({photos_dir!r}, {count})
jpgs = [s["jpg"] for s in wd.ShardLister(photos).load_tar().group_by_key()]
bp.ours_vision(photos, bp.EVAL, 0)  # a pipe built before the rows, as in section 3b
rows = {{
    "ceiling": bp.bare_vision(jpgs, bp.EVAL, 2),
    "DataLoader, decode_batches": lambda: DataLoader(bp.ours_vision(photos, bp.EVAL, 0), batch_size=None, num_workers=2),
    "DataLoader, generic": lambda: DataLoader(generic_recipe(photos, bp.torchvision_transform(bp.EVAL), bp.BATCH),
                                              batch_size=None, num_workers=2),
}}
if bp.DataLoader2 is not None:
    rows["DataLoader2"] = lambda: bp.through_dataloader2(bp.ours_vision(photos, bp.EVAL, 0), 2)
if StatefulDataLoader is not None:
    rows["StatefulDataLoader"] = lambda: StatefulDataLoader(bp.ours_vision(photos, bp.EVAL, 0), batch_size=None,
                                                            num_workers=2)
out = {{}}
for name, make in rows.items():
    wall, cpu = time.perf_counter(), _cpu_seconds()
    n = bp.count_samples(make())
    wall, cpu = time.perf_counter() - wall, _cpu_seconds() - cpu
    out[name] = (n / wall, cpu / n * 1000)
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--photos", type=int, default=2000)
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "wds-datapipes-bench"))
    args = parser.parse_args()
    code = CHILD.format(here=HERE, photos_dir=os.path.join(args.data, "photos"), count=args.photos)
    results: dict[str, list[dict]] = {tree: [] for tree in args.trees}
    for _ in range(args.rounds):
        for tree in args.trees:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
            done = subprocess.run([sys.executable, "-c", code], env=env, cwd=os.path.abspath(tree), check=True,
                                  capture_output=True, text=True)
            results[tree].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(tree, results[tree][-1], flush=True)
    names = list(results[args.trees[0]][0])
    print(f"\n  {'medians of ' + str(args.rounds) + ' rounds':<30}" + "".join(
        f" {os.path.basename(t.rstrip('/')) + ': samples/s  /ceil  CPU s/1k  ceil/it':>46}" for t in args.trees))
    for name in names:
        line = f"  {name:<30}"
        for tree in args.trees:
            wall = statistics.median(r[name][0] for r in results[tree])
            cpu = statistics.median(r[name][1] for r in results[tree])
            ceiling_wall = statistics.median(r["ceiling"][0] for r in results[tree])
            ceiling_cpu = statistics.median(r["ceiling"][1] for r in results[tree])
            line += f" {wall:>22,.0f} {wall / ceiling_wall:>6.0%} {cpu:>9.2f} {ceiling_cpu / cpu:>7.0%}"
        print(line)


if __name__ == "__main__":
    main()
