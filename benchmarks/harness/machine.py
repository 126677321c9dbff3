"""What a results file says first: the machine, the versions, the date, the commit and the command."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: benchmarks/harness/machine.py
STACK = ("torch", "torchdata", "torchvision", "wds-datapipes")


def cpu_model(cpuinfo: str) -> str:
    """The CPU's model name from ``/proc/cpuinfo``'s text ("" where it does not say)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "cpu model") and value.strip():
            return value.strip()
    return ""


def memory_bytes(meminfo: str) -> int:
    """Total memory from ``/proc/meminfo``'s text (its ``MemTotal`` line, in kB), 0 where absent."""
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def machine() -> str:
    """``<CPU model>, <n> cores, <memory> GiB memory, <system>``."""
    model = cpu_model(_read("/proc/cpuinfo")) or platform.processor() or platform.machine()
    cores = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    memory = memory_bytes(_read("/proc/meminfo"))
    if not memory and hasattr(os, "sysconf"):
        try:
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            memory = 0
    cores_text = f"{cores} cores" + (f" ({usable} usable)" if usable != cores else "")
    return f"{model}, {cores_text}, {memory / 2**30:.1f} GiB memory, {platform.system()} {platform.release()}"


def version(distribution: str) -> str:
    """The installed version of a distribution, or ``not installed``."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def versions(peers: Sequence[str] = ()) -> tuple[str, str]:
    """The stack's versions (python, torch, torchdata, torchvision, ours) and the peers'."""
    stack = ", ".join([f"python {platform.python_version()}"] + [f"{name} {version(name)}" for name in STACK])
    return stack, ", ".join(f"{name} {version(name)}" for name in peers) or "none"


def commit() -> str:
    """The checkout's commit, and whether files differ from it ("unknown" outside git)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, check=False,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + (" (with uncommitted changes)" if dirty else "")


def command_line(argv: Sequence[str] | None = None, module: str | None = None) -> str:
    """The command as it can be typed again: ``python -m benchmarks.bench_x ARGS``."""
    args = list(sys.argv[1:] if argv is None else argv)
    program = f"python -m {module}" if module else "python " + " ".join(sys.argv[:1])
    return " ".join([program, *args])


def header(bench: str, peers: Sequence[str], command: str, now: datetime.datetime | None = None) -> list[str]:
    """The lines a results file starts with."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    stack, peer_versions = versions(peers)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "unknown"
    return [
        f"benchmark: {bench}",
        f"date: {now:%Y-%m-%d %H:%M} UTC",
        f"command: {command}",
        f"commit: {commit()}",
        f"machine: {machine()}",
        f"versions: {stack}",
        f"peers: {peer_versions}",
        f"load average at the start: {load}",
    ]
