"""Section 3b's worker front doors under two library trees, timed in turn (before / after a change).

``python -m benchmarks.probe_paired_front_doors BEFORE_TREE AFTER_TREE [--rounds 3] [--quick]``:
each round runs, for each tree in turn (the order reversed every other round), a fresh
process with that tree first on ``PYTHONPATH``; the process builds one pipe first (as a
training script's first epoch, or section 3b's ceiling row, does before the rows are
timed), then times one epoch of the ceiling and of each front door, each from building its
loader, and prints (samples/s, CPU s per 1,000 samples of the process and its workers). The
medians of each tree's rounds are printed side by side. A tree is a folder holding only
``wds_datapipes`` (e.g. ``git archive BASE wds_datapipes | tar -x -C /tmp/before``): the
benchmarks themselves come from this checkout. ``--quick``: 64 photos, one round.
"""

from __future__ import annotations

import json
import os
import subprocess

from benchmarks.harness import Bench, in_turn, median, python_module

CHILD = """
import json, time
import torch
from torch.utils.data import DataLoader
import wds_datapipes as wd
from benchmarks.front_doors import StatefulDataLoader, generic_recipe
from benchmarks.harness import own_and_reaped_cpu
from benchmarks.shards import make_photo_shards
from benchmarks import vision_loops as vl

torch.set_num_threads(1)
photos = make_photo_shards({photos_dir!r}, {count})
jpgs = [s["jpg"] for s in wd.ShardLister(photos).load_tar().group_by_key()]
vl.ours_vision(photos, vl.EVAL, 0)  # a pipe built before the rows, as in section 3b
rows = {{
    "ceiling": vl.bare_vision(jpgs, vl.EVAL, 2),
    "DataLoader, decode_batches": lambda: DataLoader(vl.ours_vision(photos, vl.EVAL, 0), batch_size=None, num_workers=2),
    "DataLoader, generic": lambda: DataLoader(generic_recipe(photos, vl.torchvision_transform(vl.EVAL), vl.BATCH),
                                              batch_size=None, num_workers=2),
}}
if vl.DataLoader2 is not None:
    rows["DataLoader2"] = lambda: vl.through_dataloader2(vl.ours_vision(photos, vl.EVAL, 0), 2)
if StatefulDataLoader is not None:
    rows["StatefulDataLoader"] = lambda: StatefulDataLoader(vl.ours_vision(photos, vl.EVAL, 0), batch_size=None,
                                                            num_workers=2)
out = {{}}
for name, make in rows.items():
    wall, cpu = time.perf_counter(), own_and_reaped_cpu()
    n = vl.count_samples(make())
    wall, cpu = time.perf_counter() - wall, own_and_reaped_cpu() - cpu
    out[name] = (n / wall, cpu / n * 1000)
print(json.dumps(out))
"""


def main(argv: list[str] | None = None) -> None:
    bench = Bench("probe_paired_front_doors", __doc__, rounds=3)
    bench.parser.add_argument("trees", nargs=2)
    bench.parser.add_argument("--photos", type=int, default=2000)
    args = bench.parse(argv)
    if args.quick:
        args.photos = min(args.photos, 64)
    code = CHILD.format(photos_dir=os.path.join(args.data, "photos"), count=args.photos)
    results: dict[str, list[dict]] = {tree: [] for tree in args.trees}
    with bench.results(args):
        for _, tree in in_turn(args.rounds, args.trees):
            command, env = python_module("benchmarks.front_doors")  # the checkout after the tree on PYTHONPATH
            env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(tree), env["PYTHONPATH"]])
            done = subprocess.run([command[0], "-c", code], env=env, cwd=os.path.abspath(tree), check=True,
                                  capture_output=True, text=True)
            results[tree].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(tree, results[tree][-1], flush=True)
        names = list(results[args.trees[0]][0])
        print(f"\n  {'medians of ' + str(args.rounds) + ' rounds':<30}" + "".join(
            f" {os.path.basename(t.rstrip('/')) + ': samples/s  /ceil  CPU s/1k  ceil/it':>46}" for t in args.trees))
        for name in names:
            line = f"  {name:<30}"
            for tree in args.trees:
                wall = median(r[name][0] for r in results[tree])
                cpu = median(r[name][1] for r in results[tree])
                ceiling_wall = median(r["ceiling"][0] for r in results[tree])
                ceiling_cpu = median(r["ceiling"][1] for r in results[tree])
                line += f" {wall:>22,.0f} {wall / ceiling_wall:>6.0%} {cpu:>9.2f} {ceiling_cpu / cpu:>7.0%}"
            print(line)


if __name__ == "__main__":
    main()
