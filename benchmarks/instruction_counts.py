"""Instructions a path runs, counted by valgrind's callgrind in one process: a measure that a
shared machine's load does not move, for differences (1%) that its wall clock cannot resolve.

The parent (``count_instructions``) starts ``python -m benchmarks.instruction_counts`` under
``valgrind --tool=callgrind --instr-atstart=no``: the imports and the data run uninstrumented
(about 5x slower than native, instead of 50x); around each measured pass the child calls
two C functions of a tiny library built here with gcc from valgrind's own ``callgrind.h``,
which start instrumentation and zero the counts, then dump them under the pass's label and
stop. The parent reads each dump's ``totals:`` line. Each setting runs once untimed first
(lazy imports, caches), then the passes alternate ``off on on off ...``.

``make valgrind`` installs valgrind (its package holds ``callgrind.h``) and gcc where missing.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

from benchmarks.harness import ROOT, python_module

_MARKS_C = r"""
#include <valgrind/callgrind.h>
void marks_begin(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void marks_end(const char *label) { CALLGRIND_DUMP_STATS_AT(label); CALLGRIND_STOP_INSTRUMENTATION; }
"""
MARKS = ROOT / "build" / "bench-stats" / "callgrind_marks.so"


def missing_tools() -> list[str]:
    """What counting instructions needs and this machine lacks (``make valgrind`` installs them)."""
    found = [tool for tool in ("valgrind", "gcc") if shutil.which(tool) is None]
    if not os.path.exists("/usr/include/valgrind/callgrind.h"):
        found.append("callgrind.h (the valgrind package)")
    return found


def build_marks() -> str:
    """The marks library, built once (again where its source changed)."""
    source = MARKS.with_suffix(".c")
    if not MARKS.exists() or not source.exists() or source.read_text() != _MARKS_C:
        MARKS.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(_MARKS_C)
        subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(MARKS), str(source)], check=True)
    return str(MARKS)


def count_instructions(cases: list[str], passes: int, *args: str, timeout: float = 3600) -> tuple[dict, str]:
    """Instructions of each measured pass of each of ``cases`` (``<case>-off`` and ``<case>-on``),
    ``passes`` of each, counted in one process under callgrind; ``args`` go to the child (the
    data it reads). Also returns what the child printed (the share of samples it timed)."""
    marks = build_marks()
    with tempfile.TemporaryDirectory(prefix="wds-callgrind-") as folder:
        out = os.path.join(folder, "callgrind.out")
        command, env = python_module("benchmarks.instruction_counts", *cases, "--passes", str(passes),
                                     "--marks", marks, *args)
        valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
        done = subprocess.run(valgrind + command, check=False, env=dict(env, PYTHONHASHSEED="0"),
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"callgrind run of {cases} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        counts: dict[str, list[int]] = {}
        for path in sorted(glob.glob(out + ".*"), key=lambda p: int(p.rsplit(".", 1)[1])):
            with open(path) as dump:
                text = dump.read()
            label = re.search(r"^desc: Trigger: Client Request: (\S+)$", text, re.MULTILINE)
            total = re.search(r"^totals: (\d+)", text, re.MULTILINE)
            if label and total:
                counts.setdefault(label.group(1), []).append(int(total.group(1)))
    return counts, done.stdout


def timed_shares(numbers) -> str:
    """Which share of each per-sample stage's samples a run with stats on timed (a snapshot's numbers)."""
    shares = [f"{s.name} 1 in {s.calls / s.timed:.0f}" for s in numbers.stages.values() if s.timed and s.calls]
    return ", ".join(shares) or "no per-sample stage (samples counted where a span ends)"


def _child(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="+")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--marks", required=True)
    parser.add_argument("--index", help="the index the cases by places read")
    parser.add_argument("--photo", action="append", default=[], help="a photo shard the vision case reads")
    parser.add_argument("--expect", action="append", default=[], help="CASE=SAMPLES a pass must read")
    args = parser.parse_args(argv)
    import torch

    import wds_datapipes as wd
    from benchmarks.stats_paths import COUNTED
    from benchmarks.vision_loops import count_samples
    from wds_datapipes.stats import meters

    torch.set_num_threads(1)  # the crops' ops in this thread: no pool's spinning in the counts
    # The sampler's gap follows the clock (about 1 ms of work between two timed samples, at most
    # sample_every): under callgrind every sample looks 50x slower and would be timed far more
    # often than natively. Pinned at sample_every, the gap is the native one of any stage whose
    # samples take under 1 ms / sample_every (the share each run timed is printed, to compare).
    meters.TIME_ALL_NS = 1 << 62
    marks = ctypes.CDLL(args.marks)
    marks.marks_end.argtypes = [ctypes.c_char_p]
    expected = {case: int(n) for case, _, n in (e.partition("=") for e in args.expect)}
    data = {"index": args.index, "photos": args.photo}

    def run(case: str, on: bool, label: str | None) -> None:
        reads, make, watched = COUNTED[case]
        if on:
            wd.stats.enable()
        if label:
            marks.marks_begin()
        items = make(data[reads])
        count = count_samples(wd.stats.watch(items) if on and watched else items)
        if label:
            marks.marks_end(label.encode())
        if on:
            if label:
                print(f"{case}: timed {timed_shares(wd.stats.snapshot())}", flush=True)
            wd.stats.disable()
        if count != expected[case]:
            sys.exit(f"{case} {'on' if on else 'off'}: {count} samples, expected {expected[case]}")

    for case in args.cases:
        run(case, False, None)  # untimed: lazy imports, the page cache, first-use caches
        run(case, True, None)
        for i in range(args.passes):
            for on in ((False, True) if i % 2 == 0 else (True, False)):
                run(case, on, f"{case}-{'on' if on else 'off'}")


if __name__ == "__main__":
    _child(sys.argv[1:])
