"""Where the time of ``DataLoader(ours_vision(photos, EVAL, 0), batch_size=None, num_workers=2)`` goes.

Times one epoch from building its loader (as section 3b does) beside the bare 2-thread loop
over the same JPEGs, and splits the loader's epoch into phases by timestamps taken in the
workers themselves (``time.perf_counter`` is one clock for every process of the machine):

- start: from building the loader until each worker's first ``__iter__`` (fork, worker setup)
  and until it has made its first batch;
- steady state: each worker's CPU per sample after its first batch, user and kernel, and its
  page faults (fresh shared memory is faulted in page by page);
- the tail: when each worker made its last batch, against the end of the epoch (the workers
  joined);
- the main process's CPU per batch.

Usage: ``python -m benchmarks.probe_worker_time [--rounds 3] [--profile DIR] [--quick]``
(``--profile`` writes a cProfile of each worker's iteration to DIR/worker-PID.prof). The
ceiling and the loader's epoch take turns, the order reversed every other round; each
phase prints every round and their median. Wall times on a loaded machine are noisy; the
CPU columns are not. ``--quick``: 256 photos, one round.
"""

from __future__ import annotations

import cProfile
import json
import os
import resource
import tempfile
import time

import torch
from torch.utils.data import DataLoader, IterDataPipe

import wds_datapipes as wd
from benchmarks.harness import PROCESS_CLOCK, Bench, in_turn, median
from benchmarks.shards import make_photo_shards
from benchmarks.vision_loops import EVAL, bare_vision, counted, ours_vision
from wds_datapipes.pipes import shared_batches


class Timed(IterDataPipe):
    """Yields its source's batches; in a worker, writes when each came and the worker's rusage."""

    def __init__(self, source, folder: str, profile: bool):
        self.source, self.folder, self.profile = source, folder, profile

    def __iter__(self):
        start, usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        record = {"pid": os.getpid(), "iter": start, "start_usage": _usage(usage), "batches": []}
        profiler = cProfile.Profile() if self.profile else None
        iterator = iter(self.source)
        while True:
            if profiler is not None:
                profiler.enable()
            try:
                batch = next(iterator)
            except StopIteration:
                break
            finally:
                if profiler is not None:
                    profiler.disable()
            record["batches"].append((time.perf_counter(), len(batch[1]),
                                      _usage(resource.getrusage(resource.RUSAGE_SELF))))
            yield batch
        record["end"] = time.perf_counter()
        record["buffers"] = len(shared_batches._buffers)  # the shared-memory buffers this worker made
        if profiler is not None:
            profiler.dump_stats(os.path.join(self.folder, f"worker-{os.getpid()}.prof"))
        with open(os.path.join(self.folder, f"worker-{os.getpid()}.json"), "w") as f:
            json.dump(record, f)


def _usage(u) -> tuple[float, float, int]:
    return u.ru_utime, u.ru_stime, u.ru_minflt


def one_epoch(photos: list[str], folder: str, profile: bool) -> dict:
    for name in os.listdir(folder):
        os.remove(os.path.join(folder, name)) if name.endswith(".json") else None
    children0 = _usage(resource.getrusage(resource.RUSAGE_CHILDREN))
    self0 = _usage(resource.getrusage(resource.RUSAGE_SELF))
    built = time.perf_counter()
    loader = DataLoader(Timed(ours_vision(photos, EVAL, 0), folder, profile), batch_size=None, num_workers=2)
    arrivals, n = [], 0
    for _, labels in loader:
        arrivals.append(time.perf_counter())
        n += len(labels)
    end = time.perf_counter()
    self1 = _usage(resource.getrusage(resource.RUSAGE_SELF))
    children1 = _usage(resource.getrusage(resource.RUSAGE_CHILDREN))
    workers = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            with open(os.path.join(folder, name)) as f:
                workers.append(json.load(f))
    return {"built": built, "end": end, "n": n, "arrivals": arrivals, "workers": workers,
            "main": [b - a for a, b in zip(self0, self1)], "children": [b - a for a, b in zip(children0, children1)]}


def report(epoch: dict) -> dict[str, float]:
    built, end = epoch["built"], epoch["end"]
    out = {"wall": end - built, "main_cpu_ms_batch": 1000 * sum(epoch["main"][:2]) / len(epoch["arrivals"]),
           "children_cpu": sum(epoch["children"][:2]), "children_sys": epoch["children"][1]}
    for i, w in enumerate(epoch["workers"]):
        first, last = w["batches"][0], w["batches"][-1]
        samples_after_first = sum(b[1] for b in w["batches"][1:])
        u0, s0, f0 = first[2]
        u1, s1, f1 = last[2]
        out[f"w{i}_iter"] = w["iter"] - built
        out[f"w{i}_first"] = first[0] - built
        out[f"w{i}_start_cpu"] = sum(w["start_usage"][:2])  # CPU of the worker before its first __iter__
        out[f"w{i}_first_cpu"] = u0 + s0 - sum(w["start_usage"][:2])
        out[f"w{i}_first_sys"] = s0 - w["start_usage"][1]
        out[f"w{i}_first_faults"] = f0 - w["start_usage"][2]
        out[f"w{i}_start_faults"] = w["start_usage"][2]
        out[f"w{i}_samples"] = sum(b[1] for b in w["batches"])
        out[f"w{i}_batches"] = len(w["batches"])
        out[f"w{i}_fresh_buffers"] = w["buffers"]
        later = samples_after_first or float("nan")  # a worker of one batch has no steady state
        out[f"w{i}_user_ms"] = 1000 * (u1 - u0) / later
        out[f"w{i}_sys_ms"] = 1000 * (s1 - s0) / later
        out[f"w{i}_faults_per_batch"] = (f1 - f0) / ((len(w["batches"]) - 1) or float("nan"))
        out[f"w{i}_last"] = w["end"] - built
        out[f"w{i}_total_cpu"] = u1 + s1
    out["last_batch_made"] = max(w["end"] for w in epoch["workers"]) - built
    out["last_batch_in_main"] = epoch["arrivals"][-1] - built
    out["shutdown"] = end - epoch["arrivals"][-1]  # the workers stopped and joined
    return out


def main(argv: list[str] | None = None) -> None:
    bench = Bench("probe_worker_time", __doc__, rounds=3)
    bench.parser.add_argument("--photos", type=int, default=2000)
    bench.parser.add_argument("--profile", default=None, help="a folder for each worker's cProfile")
    args = bench.parse(argv)
    if args.quick:
        args.photos = min(args.photos, 256)  # 4 shards of 64: each worker makes 2 batches
    torch.set_num_threads(1)
    photos = make_photo_shards(os.path.join(args.data, "photos"), args.photos)
    jpgs = [s["jpg"] for s in wd.ShardLister(photos).load_tar().group_by_key()]
    ceiling = counted(bare_vision(jpgs, EVAL, 2))
    folder = args.profile or tempfile.mkdtemp()
    os.makedirs(folder, exist_ok=True)
    rows: list[dict[str, float]] = []
    ceilings = []
    with bench.results(args):
        for _, path in in_turn(args.rounds, ["ceiling", "loader"]):
            if path == "ceiling":
                ceilings.append(PROCESS_CLOCK.run(ceiling))
            else:
                rows.append(report(one_epoch(photos, folder, args.profile is not None)))
        print(f"ceiling: wall {median(r.wall for r in ceilings):.3f} s, "
              f"CPU {1000 * median(r.cpu for r in ceilings) / len(jpgs):.2f} ms/sample (medians)")
        for key in rows[0]:
            values = [r[key] for r in rows]
            print(f"  {key:<22} " + "  ".join(f"{v:9.3f}" for v in values) + f"   median {median(values):9.3f}")


if __name__ == "__main__":
    main()
