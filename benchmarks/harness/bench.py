"""A benchmark's command line, its results file and the ratios it states."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import operator
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from benchmarks.harness.machine import ROOT, command_line, header
from benchmarks.harness.timing import Ratio

RESULTS = ROOT / "benchmarks" / "results"
QUICK_RESULTS = Path(tempfile.gettempdir()) / "wds-datapipes-bench-results"
_GOALS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


class Tee:
    """A text stream that writes to each of its streams (the terminal and the results file),
    flushed at once: a process forked later (a loader's worker) holds no copy of a buffer
    that it could write again when it exits."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
            stream.flush()
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()

    def isatty(self) -> bool:
        return False


def results_path(folder: Path, stem: str, day: datetime.date) -> Path:
    """``folder/<stem>-<day>.txt``, or ``-2``, ``-3`` ... after it where that is taken."""
    path, n = folder / f"{stem}-{day:%Y-%m-%d}.txt", 1
    while path.exists():
        n += 1
        path = folder / f"{stem}-{day:%Y-%m-%d}-{n}.txt"
    return path


def goal_met(value: float, goal: str) -> bool:
    """Whether ``value`` meets a goal written ``">= 0.9"``, ``"<= 5%"``, ``"> 1"``."""
    op, _, number = goal.strip().partition(" ")
    number = number.strip()
    wanted = float(number[:-1]) / 100 if number.endswith("%") else float(number.rstrip("x"))
    return _GOALS[op](value, wanted)


class Bench:
    """One benchmark's command line (``--rounds``, ``--quick``, ``--data``, ``--results`` and
    its own options on ``parser``), its results file and the ratios it states."""

    def __init__(self, name: str, doc: str, *, peers: Sequence[str] = (), rounds: int = 5, quick_rounds: int = 1,
                 data: str | None = "wds-datapipes-bench"):
        self.name, self.peers = name, tuple(peers)
        self.rounds, self.quick_rounds = rounds, quick_rounds
        self.data = None if data is None else os.path.join(tempfile.gettempdir(), data)
        self.parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{name}", description=doc,
                                              formatter_class=argparse.RawDescriptionHelpFormatter)
        self.parser.add_argument("--rounds", "--repeats", type=int, default=None,
                                 help=f"rounds of the paths in turn; medians are reported (default {rounds})")
        self.parser.add_argument("--quick", action="store_true",
                                 help=f"tiny data, {quick_rounds} round(s): proves that the benchmark runs end to "
                                      "end (its figures mean nothing)")
        if self.data is not None:
            self.parser.add_argument("--data", default=None, help=f"where its data is written once and reused "
                                                                  f"(default {self.data}; -quick after it with --quick)")
        self.parser.add_argument("--results", default=None,
                                 help="the folder of the results file (default benchmarks/results; with --quick "
                                      f"{QUICK_RESULTS}); '-' for none")
        self.ratios: list[dict] = []
        self.argv: list[str] = []

    def parse(self, argv: Sequence[str] | None = None) -> argparse.Namespace:
        """The arguments, ``rounds`` and ``data`` filled in (fewer rounds and a data folder of its own with --quick)."""
        self.argv = list(sys.argv[1:] if argv is None else argv)
        args = self.parser.parse_args(self.argv)
        if args.rounds is None:
            args.rounds = self.quick_rounds if args.quick else self.rounds
        if self.data is not None and args.data is None:
            args.data = self.data + ("-quick" if args.quick else "")
        return args

    def folder(self, args: argparse.Namespace) -> Path | None:
        if args.results == "-":
            return None
        return Path(args.results) if args.results else (QUICK_RESULTS if args.quick else RESULTS)

    @contextlib.contextmanager
    def results(self, args: argparse.Namespace, variant: str = "") -> Iterator[Path | None]:
        """Everything printed inside goes to the terminal and to the results file
        ``<folder>/<bench>[-<variant>][-quick]-<date>.txt``, after a header (machine, versions,
        date, commit, command); the ratios stated by ``ratio`` also go to a ``.json`` beside it."""
        folder = self.folder(args)
        now = datetime.datetime.now(datetime.timezone.utc)
        stem = "-".join(part for part in (self.name, variant, "quick" if args.quick else "") if part)
        path = None if folder is None else results_path(folder, stem, now.date())
        lines = header(self.name, self.peers, command_line(self.argv, f"benchmarks.{self.name}"), now)
        stream = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            stream = path.open("w")
        terminal, started = sys.stdout, time.perf_counter()
        sys.stdout = Tee(terminal, stream) if stream else terminal
        self.ratios = []
        try:
            print("\n".join(lines) + "\n", flush=True)
            yield path
        except BaseException as exn:
            print(f"\nstopped by {type(exn).__name__}: {exn}")
            raise
        finally:
            load = " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "unknown"
            print(f"\nload average at the end: {load}; the run took {time.perf_counter() - started:.0f} s", flush=True)
            sys.stdout = terminal
            if stream is not None:
                stream.close()
                self._write_ratios(path.with_suffix(".json"), lines)
                print(f"results: {path}", file=sys.stderr)

    def _write_ratios(self, path: Path, lines: list[str]) -> None:
        if not self.ratios:
            return
        fields = dict(line.split(": ", 1) for line in lines)
        path.write_text(json.dumps({**fields, "ratios": self.ratios}, indent=1) + "\n")

    def ratio(self, label: str, value: Ratio | float, goal: str | None = None, *, percent: bool = False,
              note: str = "") -> None:
        """Prints one ratio the benchmark states (a paired ``Ratio`` or a number), and whether
        it meets ``goal`` (``">= 0.9"``, ``"<= 5%"``), and keeps it for the ``.json``."""
        ratio = value if isinstance(value, Ratio) else Ratio(value, value, value, 1)
        met = None if goal is None else goal_met(ratio.value, goal)
        verdict = "" if goal is None else f" [goal {goal}: {'met' if met else 'NOT met'}]"
        print(f"  {label:<72} {ratio.text(percent):>18}{verdict}{'  ' + note if note else ''}")
        self.ratios.append({"label": label, "value": ratio.value, "low": ratio.low, "high": ratio.high,
                            "pairs": ratio.pairs, "goal": goal, "met": met})


def python_module(module: str, *args: str) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run ``python -m <module> ARGS`` from any folder
    (the checkout on ``PYTHONPATH``, after what is there already)."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] + [str(ROOT)]
    return [sys.executable, "-m", module, *args], dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
