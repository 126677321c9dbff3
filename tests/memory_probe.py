"""Runs hostile-shard scenarios under an address-space limit and reports, per scenario, the
error and how much the peak memory rose (a JSON line each). Used by tests/test_memory_bounds.py.

    python memory_probe.py DATA_DIR HEADROOM_MB SCENARIO...

Each scenario reads files the test wrote into DATA_DIR. Before the first one, the process
sets RLIMIT_AS to its current address space plus HEADROOM_MB: a scenario that needs more
fails with MemoryError (which the reader would turn into our error: the report keeps the
message, so the test sees it). The peak is VmHWM after a reset of it (/proc/self/clear_refs).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import warnings

warnings.filterwarnings("ignore")

import torch
from torch.utils.data.datapipes.iter import IterableWrapper

import wds_datapipes as wd

UNLIMITED = wd.Limits(max_member_bytes=1 << 62)


def _status(field: str, pid: str = "self") -> int:
    """A /proc/PID/status field, in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        return True
    except OSError:
        return False


def _members(path: str, limits: wd.Limits | None = None) -> int:
    return sum(1 for _ in wd.ShardLister([path]).load_tar(limits=limits or wd.get_limits()))


def _decoded(field: str, path: str, spec: str | None = None) -> int:
    with open(path, "rb") as source:
        sample = {"__key__": "bomb", "__url__": path, field: source.read()}
    return len(list(IterableWrapper([sample]).decode(*([spec] if spec else []))))


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as children:
        return [int(c) for c in children.read().split()]


def _epochs(data: str, loader: str) -> dict:
    """RSS (main process and workers) after epochs 5 and 30 of a decoding pipeline."""
    dp = wd.ShardLister(f"{data}/epoch-{{000..003}}.tar", shuffle=True, seed=0).load_tar().group_by_key()
    dp = dp.shuffle_samples(bufsize=50).decode().to_tuple("bin", "cls").batch_samples(16)
    if loader == "dataloader2":
        from torchdata.dataloader2 import DataLoader2

        iterable = DataLoader2(dp, reading_service=wd.MultiProcessingReadingService(num_workers=2))
    else:
        iterable = dp
    sizes = {}
    try:
        for epoch in range(1, 31):
            batches = sum(1 for _ in iterable)
            if epoch in (5, 30):
                pids = [os.getpid(), *_children(os.getpid())]
                sizes[epoch] = sum(_status("VmRSS", str(pid)) for pid in pids)
                sizes[f"processes_{epoch}"] = len(pids)
    finally:
        if loader == "dataloader2":
            iterable.shutdown()
    return {"batches": batches, "rss_5": sizes[5], "rss_30": sizes[30], "processes": sizes["processes_30"]}


SCENARIOS = {
    "claim-100GiB": lambda d: _members(f"{d}/claim.tar"),
    "claim-100GiB-no-limit": lambda d: _members(f"{d}/claim.tar", UNLIMITED),
    "pax-size-1PB-no-limit": lambda d: _members(f"{d}/pax-claim.tar", UNLIMITED),
    "sparse-100GiB": lambda d: _members(f"{d}/sparse.tar"),
    "gz-member-bomb": lambda d: _members(f"{d}/bomb.tar.gz"),
    "gz-many-1MiB-members": lambda d: _members(f"{d}/many.tar.gz"),
    "png-bomb": lambda d: _decoded("png", f"{d}/bomb.png", "rgb8"),
    "gz-field-bomb": lambda d: _decoded("json.gz", f"{d}/bomb.json.gz"),
    "npy-claim": lambda d: _decoded("npy", f"{d}/claim.npy"),
    "npz-bomb": lambda d: _decoded("npz", f"{d}/bomb.npz"),
}


def main() -> None:
    data, headroom, names = sys.argv[1], int(sys.argv[2]) << 20, sys.argv[3:]
    torch.set_num_threads(1)
    if any(name.startswith("epochs") for name in names):
        for name in names:
            print(json.dumps({"scenario": name, **_epochs(data, name.partition(":")[2] or "none")}), flush=True)
        return
    _members(f"{data}/warm.tar")  # lazy imports and first allocations, before the limit
    _decoded("png", f"{data}/warm.png", "rgb8")
    _decoded("npz", f"{data}/warm.npz")
    limit = _status("VmSize") + headroom
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    for name in names:
        measured = _reset_peak()
        before = _status("VmRSS")
        started = time.monotonic()
        try:
            outcome = {"result": SCENARIOS[name](data)}
        except Exception as exn:  # noqa: BLE001 - the report says what it was
            outcome = {"error": type(exn).__name__, "message": str(exn)[:500]}
        peak = _status("VmHWM") - before if measured else None
        print(json.dumps({"scenario": name, "peak_rise": peak, "seconds": time.monotonic() - started, **outcome}),
              flush=True)


if __name__ == "__main__":
    main()
