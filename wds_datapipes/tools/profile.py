"""``python -m wds_datapipes profile SHARDS --recipe NAME [--workers N]``: which stage limits, and by how much.

A recipe is a pipeline named by its steps after ``ShardLister(SHARDS).load_tar()`` (see
:data:`RECIPES`). The command reads every given shard once per run, each run measured by
:mod:`wds_datapipes.stats` (no measure of its own: every number is a snapshot's):

1. **Each stage alone**, in this process: ``load_tar()`` (listing, opening, reading, tar
   headers), then with each step of the recipe added in turn. A run's time is the loop's
   (``WaitStats``: the first batch, the waits and the steps); what a step adds to the time of a
   sample is the difference between two runs; beside it, the stage's own time as the stats
   count it (``StageStats.seconds``).
2. **The pipeline whole** under torch's ``DataLoader`` with 1 worker, then N: its samples per
   second, and where the workers' time went (``Snapshot.stages``).
3. **What limits**: :func:`wds_datapipes.stats.diagnose` of the N-worker run, the limiting stage's
   share of the workers' time against the next stage's, and the report's setting.

``--json`` prints the same numbers as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any

Step = tuple[str, str, Callable[[Any], Any]]  # (stats stage it adds, what it is, pipe -> pipe)


def _raw(batch: int) -> list[Step]:
    return [("tar", "group_by_key()", lambda dp: dp.group_by_key()),
            ("batch", f"batch_samples({batch})", lambda dp: dp.batch_samples(batch))]


def _decode(batch: int) -> list[Step]:
    return [("tar", "group_by_key()", lambda dp: dp.group_by_key()),
            ("decode", "decode('rgb8')", lambda dp: dp.decode("rgb8")),
            ("batch", f"batch_samples({batch})", lambda dp: dp.batch_samples(batch))]


def _vision(batch: int) -> list[Step]:
    from ..decoding.vision import RandomResizedCrop

    crop = RandomResizedCrop(224, seed=0)
    return [("tar", "group_by_key()", lambda dp: dp.group_by_key()),
            ("decode", f"decode_batches('torchrgb8', batch_size={batch}, transform=RandomResizedCrop(224))",
             lambda dp: dp.decode_batches("torchrgb8", batch_size=batch, transform=crop)),
            ("transform", "to_tuple('jpg;png;jpeg', 'cls')", lambda dp: dp.to_tuple("jpg;png;jpeg", "cls"))]


#: The recipes ``profile`` knows, by name: ``raw`` (samples as bytes, batched), ``decode`` (every
#: field decoded sample by sample, images to uint8 RGB arrays), ``vision`` (the README's: images to
#: 224x224 random crops straight into the batch, then (image, cls) tuples).
RECIPES: dict[str, Callable[[int], list[Step]]] = {"raw": _raw, "decode": _decode, "vision": _vision}


def add_profile_command(commands) -> None:
    """Adds ``profile`` to the command line's subcommands."""
    profile = commands.add_parser(
        "profile", help="time each stage alone and the pipeline whole: which stage limits",
        description="Read the shards with a named recipe: each stage alone in this process (load_tar, then each "
        "step added), then the whole pipeline under DataLoader with 1 and N workers, every run measured by "
        "wd.stats; print the samples per second of each, and which stage limits and by how much.",
    )
    profile.add_argument("shards", nargs="+", metavar="SHARDS", help="shard URLs (brace patterns, globs, ...)")
    profile.add_argument("--recipe", choices=sorted(RECIPES), default="raw", help="the pipeline (default raw)")
    profile.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1),
                         help="loader workers of the second whole run (default: the CPUs, at most 4)")
    profile.add_argument("--batch-size", type=int, default=32, help="samples per batch (default 32)")
    profile.add_argument("--json", action="store_true", help="print the numbers as JSON instead of text")
    profile.set_defaults(run=run_profile)


def run_profile(args: argparse.Namespace) -> int:
    """The ``profile`` command: runs :func:`profile` and prints its result."""
    if args.workers < 1 or args.batch_size < 1:
        raise ValueError("--workers and --batch-size must be at least 1")
    found = profile(args.shards, args.recipe, workers=args.workers, batch_size=args.batch_size)
    print(json.dumps(found, indent=1) if args.json else describe(found))
    return 0


def profile(shards: list[str], recipe: str, workers: int = 2, batch_size: int = 32) -> dict:
    """Each stage of ``recipe`` alone over ``shards``, then the pipeline whole with 1 and
    ``workers`` loader workers; plain numbers, every one from a stats snapshot (see the module)."""
    steps = RECIPES[recipe](batch_size)
    alone = []
    for k in range(len(steps) + 1):
        def build(k=k):
            dp = _reader(shards)
            for _, _, step in steps[:k]:
                dp = step(dp)
            return dp

        numbers = _measured(build, None)
        stage, what = ("read", "load_tar()") if k == 0 else steps[k - 1][:2]
        alone.append({"stage": stage, "step": what, **numbers})
    samples = max(run["samples"] for run in alone)
    whole = [{"workers": n, **_measured(_whole_pipe(shards, steps), n)} for n in sorted({1, workers})]
    for run in [*alone, *whole]:
        run["samples_per_s"] = samples / run["seconds"] if run["seconds"] > 0 else 0.0
        run["ms_per_sample"] = {name: seconds / samples * 1e3 if samples else 0.0
                                for name, seconds in run["stages"].items()}
    before = 0.0
    for run in alone:  # what each step adds to a sample's time, by the loop's clock
        per = run["seconds"] / samples if samples else 0.0
        run["added_ms_per_sample"], before = (per - before) * 1e3, per
    last = whole[-1]
    ranked = sorted(((name, share) for name, share in last["shares"].items() if name != "handover"),
                    key=lambda kv: -kv[1])
    limiting = {"stage": last["limiting"], "share": last["shares"].get(last["limiting"] or "", 0.0),
                "setting": last["setting"], "workers": last["workers"]}
    others = [(name, share) for name, share in ranked if name != limiting["stage"]]
    if others:
        limiting["next_stage"], limiting["next_share"] = others[0]
        limiting["times_next"] = limiting["share"] / others[0][1] if others[0][1] else None
    return {"recipe": recipe, "shards": shards, "batch_size": batch_size, "samples": samples,
            "bytes": alone[0]["bytes"], "alone": alone, "whole": whole, "limiting": limiting,
            "report": last.pop("report")}


def _reader(shards: list[str]):
    """``ShardLister(shards).load_tar()``, with every pipe of ours a recipe names loaded (their
    functional names registered)."""
    from ..decoding import batch_decoder, decoder  # noqa: F401 - decode_batches, decode
    from ..pipes import batching, fields  # noqa: F401 - batch_samples, to_tuple
    from ..shards import grouping  # noqa: F401 - group_by_key
    from ..shards.listing import ShardLister
    from ..shards.tar_loader import TarLoader

    return TarLoader(ShardLister(shards))


def _whole_pipe(shards: list[str], steps: list[Step]) -> Callable[[], Any]:
    """A builder of the whole recipe's pipeline over ``shards``."""
    def build():
        dp = _reader(shards)
        for _, _, step in steps:
            dp = step(dp)
        return dp

    return build


def _measured(build: Callable[[], Any], workers: int | None) -> dict:
    """One run, stats on for it alone: the pipe ``build()`` makes, iterated in this process
    (``workers`` None) or under a DataLoader with that many workers; its snapshot's numbers."""
    from .. import stats

    stats.enable()
    try:
        dp = build()
        if workers is not None:
            import torch

            dp = torch.utils.data.DataLoader(dp, batch_size=None, num_workers=workers)
        for _ in stats.watch(dp):
            pass
        s = stats.snapshot()
    finally:
        stats.disable()
    wait = s.wait
    d = stats.diagnose(s)
    run = {"seconds": wait.first_seconds + wait.blocked_seconds + wait.step_seconds + wait.last_seconds,
           "samples": s.stages["tar"].items, "bytes": s.stages["read"].bytes,
           "stages": {name: st.seconds for name, st in s.stages.items()}}
    if workers is not None:
        run.update(shares=d.shares, limiting=d.stage, setting=d.setting, report=stats.report(s))
    return run


_OWN = {"read": ("list", "open", "read")}  # the stats stages of load_tar() alone (its tar headers: "tar")


def describe(found: dict) -> str:
    """The text ``profile`` prints for :func:`profile`'s numbers."""
    lines = [(f"profile of recipe {found['recipe']!r}: {found['samples']} samples, {found['bytes'] / 1e6:.1f} MB "
             f"in {len(found['shards'])} shard spec(s), batch size {found['batch_size']}"),
             "", "each stage alone, in this process (every step up to it):",
             f"  {'stage':<10} {'samples/s':>10} {'+ms a sample':>13} {'its stats ms':>13}  step"]
    for run in found["alone"]:
        own = sum(run["ms_per_sample"].get(name, 0.0) for name in _OWN.get(run["stage"], (run["stage"],)))
        lines.append(f"  {run['stage']:<10} {run['samples_per_s']:>10.1f} {run['added_ms_per_sample']:>13.3f} "
                     f"{own:>13.3f}  {run['step']}")
    lines += ["", "the pipeline whole, DataLoader:"]
    one = found["whole"][0]["samples_per_s"]
    for run in found["whole"]:
        top = ", ".join(f"{name} {share:.0%}" for name, share in
                        sorted(run["shares"].items(), key=lambda kv: -kv[1]) if share >= 0.01)
        speedup = f" ({run['samples_per_s'] / one:.2f}x one worker)" if run["workers"] > 1 and one else ""
        lines.append(f"  {run['workers']} worker{'s' if run['workers'] > 1 else ' '} "
                     f"{run['samples_per_s']:>10.1f} samples/s{speedup}; the workers' time: {top}")
    lim = found["limiting"]
    if lim["stage"] is not None:
        by = ""
        if lim.get("next_stage"):
            times = f", {lim['times_next']:.1f}x" if lim.get("times_next") else ""
            by = f"{times} the next stage ({lim['next_stage']} {lim['next_share']:.0%})"
        lines += ["", (f"limiting stage: {lim['stage']}, {lim['share']:.0%} of the time of {lim['workers']} "
                  f"worker(s){by}; setting: {lim['setting']}")]
    lines += ["", "stats.report() of the last whole run:", *("  " + line for line in found["report"].splitlines())]
    return "\n".join(lines)


__all__ = ["RECIPES", "add_profile_command", "describe", "profile", "run_profile"]
