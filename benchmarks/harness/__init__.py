"""The benchmarks' one harness: rounds, pairing, medians, ratios and the results file.

Every benchmark under ``benchmarks/`` times its paths and writes its output through these
names; a new benchmark (``benchmarks/bench_<what>.py``) needs nothing else::

    from benchmarks.harness import Bench, time_in_turn

    def main(argv=None) -> None:
        bench = Bench("bench_what", __doc__, peers=("webdataset",), rounds=5)
        bench.parser.add_argument("--samples", type=int, default=10_000)
        args = bench.parse(argv)                  # --rounds, --quick, --data, --results filled in
        if args.quick:
            args.samples = 200                    # tiny data: the run proves it works, nothing more
        with bench.results(args):                 # the header, then all that is printed, into the file
            paths = {"ours": lambda: run_ours(args.samples), "webdataset": lambda: run_theirs(args.samples)}
            timings = time_in_turn(paths, args.rounds, warm=True, expect=args.samples)
            for name in paths:
                print(f"  {name:<20} {timings.rate(name):10,.0f} samples/s")
            bench.ratio("ours / webdataset", timings.ratio("ours", "webdataset"), ">= 3")

    if __name__ == "__main__":
        main()

Run it as ``python -m benchmarks.bench_what [--quick]`` from the checkout; add a ``make``
target beside the others and a line in ``tests/test_benchmarks.py``'s ``QUICK`` list if its
``--quick`` run needs no cluster or network.

Timing (``timing.py``):

- A *path* is a callable that does the work once and returns what it produced: a count, or
  ``(count, bytes)``. ``time_in_turn(paths, rounds, clock=, warm=, expect=, after_each=)``
  runs every path once a round, in turn, the order reversed every other round
  (``in_turn(rounds, names)`` is that order), and returns ``Timings``: every ``Run`` of
  every path (``wall`` and ``cpu`` seconds, ``count``, ``nbytes``, CPU ``parts``).
- ``Timings.rate(name, of="wall"|"cpu", unit="count"|"nbytes")``, ``.seconds(name)``,
  ``.cpu_per(name, per=1000)``: **medians** of the path's rounds, never the best.
- ``Timings.ratio(a, b)`` -> ``Ratio``: ``a``'s rate over ``b``'s **paired by round** (the two
  ran seconds apart, so a slow spell hits both), the median of the pairs and their range;
  ``Timings.paired(a, b)`` gives the pairs themselves. ``Ratio.of(pairs)`` sums up any list
  of pairs; ``str(ratio)`` reads ``1.23 (1.10-1.31)``, ``ratio.text(percent=True)`` ``93% (90%-95%)``.
- ``Clock(wall=, cpu=, parts={name: meter})``: what a run is read by (``CLOCK``: the wall
  clock and the CPU of this process and its reaped children; ``PROCESS_CLOCK``: this
  process only). Give a fake one in a test. ``median(values)`` raises on none.

The results file (``bench.py``, ``machine.py``):

- ``Bench(name, doc, peers=, rounds=, quick_rounds=, data=)``: ``.parser`` (add the
  benchmark's own options), ``.parse(argv)``, ``.results(args, variant="")`` (a context: the
  header and everything printed inside go to the terminal and to
  ``benchmarks/results/<name>[-<variant>]-<date>.txt``, ``-2`` ... when taken; a ``--quick``
  run writes to a temporary folder unless ``--results`` says where), ``.ratio(label, ratio,
  goal=">= 0.9", percent=)`` (one printed line, and the ``.json`` beside the file).
- The header: benchmark, date (UTC), command, commit, ``machine()`` (CPU model, cores,
  memory, system), ``versions(peers)`` (python, torch, torchdata, torchvision, ours; the
  peers'), the load average. ``python_module(module, *args)``: the command and environment
  that run another module of the package in a subprocess.
"""

from benchmarks.harness.bench import Bench, Tee, goal_met, python_module, results_path
from benchmarks.harness.machine import ROOT, cpu_model, machine, memory_bytes, version, versions
from benchmarks.harness.timing import (
    CLOCK,
    PROCESS_CLOCK,
    BenchError,
    Clock,
    Ratio,
    Run,
    Timings,
    in_turn,
    median,
    own_and_reaped_cpu,
    time_in_turn,
)

__all__ = [
    "CLOCK", "PROCESS_CLOCK", "ROOT", "Bench", "BenchError", "Clock", "Ratio", "Run", "Tee", "Timings",
    "cpu_model", "goal_met", "in_turn", "machine", "median", "memory_bytes", "own_and_reaped_cpu",
    "python_module", "results_path", "time_in_turn", "version", "versions",
]
