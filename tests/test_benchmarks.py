"""The benchmarks' harness (rounds, pairing, medians, ratios, the results file), every module
of benchmarks/ importing, and the --quick run of each benchmark that needs no cluster or
network, end to end.

Oracles: for the timing logic, durations scripted into a fake clock, the expected order,
medians and pairs worked out by hand below; for the results file's header, what this test
reads itself (``/proc/cpuinfo``, ``os.cpu_count``, each module's own ``__version__``); for
the quick runs, the sections each benchmark's docstring promises, found in its results file.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # benchmarks/ is a package of the checkout, not of the wheel

from benchmarks.harness import (
    Bench,
    BenchError,
    Clock,
    Ratio,
    Run,
    Tee,
    Timings,
    cpu_model,
    goal_met,
    in_turn,
    median,
    memory_bytes,
    time_in_turn,
)
from benchmarks.harness.bench import QUICK_RESULTS, RESULTS


class FakeClock:
    """A wall clock and a CPU clock that move only when a path says how long it took."""

    def __init__(self):
        self.now = self.cpu_now = 0.0

    def spend(self, wall: float, cpu: float | None = None) -> None:
        self.now += wall
        self.cpu_now += wall / 2 if cpu is None else cpu

    def clock(self) -> Clock:
        return Clock(wall=lambda: self.now, cpu=lambda: self.cpu_now, parts={"half": lambda: self.cpu_now / 2})


def scripted(fake: FakeClock, log: list[str], durations: dict[str, list[float]], count: int = 100):
    """Paths that log each call and take the next of their scripted durations."""
    def path(name: str):
        left = iter(durations[name])

        def run() -> int:
            log.append(name)
            fake.spend(next(left))
            return count
        return run
    return {name: path(name) for name in durations}


def test_paths_take_turns_and_the_order_reverses_every_other_round():
    assert in_turn(3, ["a", "b", "c"]) == [(0, "a"), (0, "b"), (0, "c"), (1, "c"), (1, "b"), (1, "a"),
                                           (2, "a"), (2, "b"), (2, "c")]
    assert in_turn(2, ["a", "b"], start=1) == [(1, "b"), (1, "a"), (2, "a"), (2, "b")]
    fake, log = FakeClock(), []
    time_in_turn(scripted(fake, log, {"a": [1, 1, 1], "b": [1, 1, 1]}), 3, clock=fake.clock())
    assert log == ["a", "b", "b", "a", "a", "b"]


def test_a_rate_is_the_median_round_never_the_best():
    fake, log = FakeClock(), []
    # a's rounds take 4, 1 and 2 s: 100 samples/s at best, 50 at the median.
    timings = time_in_turn(scripted(fake, log, {"a": [4, 1, 2], "b": [2, 2, 2]}), 3, clock=fake.clock())
    assert timings.rate("a") == pytest.approx(50.0)
    assert timings.seconds("a") == pytest.approx(2.0)
    assert timings.rate("a", of="cpu") == pytest.approx(100.0)  # the fake CPU moves half the wall clock
    assert timings.cpu_per("a", per=1000) == pytest.approx(10.0)  # 1 CPU second for 100 samples, the median
    assert timings.cpu_per("a", per=1000, part="half") == pytest.approx(5.0)
    assert [run.wall for run in timings.rounds("a")] == [4, 1, 2]
    # Four rounds: the mean of the middle two (rates 25, 50, 100, 100 samples/s).
    four = time_in_turn(scripted(fake, [], {"a": [4, 1, 2, 1]}), 4, clock=fake.clock())
    assert four.rate("a") == pytest.approx(75.0)
    with pytest.raises(BenchError):
        median([])


def test_a_ratio_is_taken_within_each_round_not_between_medians():
    fake, log = FakeClock(), []
    # Round 2 is slow for a only; round 3 for b only. By pairs: a/b = 1, 1/3, 4/3 -> 1.0;
    # between the medians (a: 100/3, b: 100 samples/s) it would read 1/3.
    timings = time_in_turn(scripted(fake, log, {"a": [1, 3, 3], "b": [1, 1, 4]}), 3, clock=fake.clock())
    assert timings.paired("a", "b") == pytest.approx([1.0, 1 / 3, 4 / 3])
    ratio = timings.ratio("a", "b")
    assert (ratio.value, ratio.low, ratio.high, ratio.pairs) == pytest.approx((1.0, 1 / 3, 4 / 3, 3))
    assert timings.rate("a") / timings.rate("b") == pytest.approx(1 / 3)
    assert str(ratio) == "1.00 (0.33-1.33)"
    assert ratio.text(percent=True) == "100% (33%-133%)"
    assert str(Ratio.of([0.5])) == "0.50"  # one pair: no range


def test_bytes_warm_up_expected_counts_and_cleanup():
    fake = FakeClock()
    calls: list[str] = []

    def path() -> tuple[int, int]:
        calls.append("run")
        fake.spend(2)
        return 10, 4000

    timings = time_in_turn({"p": path}, 2, clock=fake.clock(), warm=True, expect=10,
                           after_each=lambda name: calls.append(f"after {name}"))
    assert calls == ["run", "run", "after p", "run", "after p"]  # the warm-up run is untimed, no cleanup
    assert len(timings.rounds("p")) == 2
    assert timings.rate("p", unit="nbytes") == pytest.approx(2000.0)
    with pytest.raises(BenchError, match="p: produced 10, expected 11"):
        time_in_turn({"p": path}, 1, clock=fake.clock(), expect=11)
    with pytest.raises(BenchError, match="not measured"):
        Timings(["q"]).rate("q")
    assert Run(2.0, 1.0, 10, 4000).rate(of="cpu", unit="nbytes") == pytest.approx(4000.0)


def test_goals_read_as_written():
    assert goal_met(0.93, ">= 90%") and not goal_met(0.89, ">= 90%")
    assert goal_met(3.2, ">= 3") and goal_met(1.01, "> 1") and not goal_met(1.0, "> 1")
    assert goal_met(0.04, "<= 0.05") and goal_met(1.2, "< 1.5") and not goal_met(1.5, "< 1.5")


def test_cpu_model_and_memory_from_the_proc_files_text():
    cpuinfo = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9B14\nflags\t\t: fpu\n"
    assert cpu_model(cpuinfo) == "AMD EPYC 9B14"
    assert cpu_model("processor : 0\n") == ""
    assert memory_bytes("MemTotal:       24641536 kB\nMemFree: 1 kB\n") == 24641536 * 1024
    assert memory_bytes("") == 0


def test_the_results_file_says_the_machine_versions_date_and_command(tmp_path, capsys):
    import torch
    import webdataset

    bench = Bench("bench_probe", "A benchmark of nothing.", peers=("webdataset", "no-such-distribution"))
    argv = ["--results", str(tmp_path), "--rounds", "3"]
    args = bench.parse(argv)
    assert args.rounds == 3
    with bench.results(args) as path:
        print("  row one                         123 samples/s")
        bench.ratio("ours / theirs", Ratio.of([1.5, 2.0, 2.5]), ">= 2")
    text = path.read_text()
    today = datetime.datetime.now(datetime.timezone.utc).date()
    assert path == tmp_path / f"bench_probe-{today:%Y-%m-%d}.txt"
    fields = dict(line.split(": ", 1) for line in text.splitlines()[:8])
    assert fields["benchmark"] == "bench_probe"
    assert fields["date"].startswith(f"{today:%Y-%m-%d}")
    assert fields["command"] == "python -m benchmarks.bench_probe " + " ".join(argv)
    own_cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in own_cpuinfo.splitlines() if line.startswith("model name")),
                 "")
    assert fields["machine"].startswith(model)
    assert f"{os.cpu_count()} cores" in fields["machine"] and "GiB memory" in fields["machine"]
    stack = dict(item.rsplit(" ", 1) for item in fields["versions"].split(", "))
    assert torch.__version__.startswith(stack["torch"]) and stack["python"] == sys.version.split()[0]
    assert {"torchdata", "torchvision", "wds-datapipes"} <= set(stack)
    assert fields["peers"] == f"webdataset {webdataset.__version__}, no-such-distribution not installed"
    assert "row one" in text and "row one" in capsys.readouterr().out  # to the file and the terminal
    assert "  ours / theirs" in text and "2.00 (1.50-2.50) [goal >= 2: met]" in text
    assert "load average at the end" in text.splitlines()[-1]
    saved = json.loads(path.with_suffix(".json").read_text())
    assert saved["command"] == fields["command"] and saved["machine"] == fields["machine"]
    assert saved["ratios"] == [{"label": "ours / theirs", "value": 2.0, "low": 1.5, "high": 2.5, "pairs": 3,
                                "goal": ">= 2", "met": True}]
    with bench.results(bench.parse(argv)) as second:  # a second run the same day: a file of its own
        pass
    assert second.name == f"bench_probe-{today:%Y-%m-%d}-2.txt" and path.read_text() == text


def test_a_run_that_fails_still_leaves_its_file_and_quick_runs_go_elsewhere(tmp_path):
    bench = Bench("bench_probe", "doc", rounds=7, quick_rounds=1, data="bench-probe-data")
    args = bench.parse(["--results", str(tmp_path)])
    with pytest.raises(ValueError), bench.results(args) as path:
        print("half a table")
        raise ValueError("the shard went away")
    text = path.read_text()
    assert "half a table" in text and "stopped by ValueError: the shard went away" in text
    assert not isinstance(sys.stdout, Tee)  # the terminal is given back
    assert (args.rounds, bench.folder(args)) == (7, tmp_path)
    full, quick = bench.parse([]), bench.parse(["--quick"])
    assert (full.rounds, bench.folder(full)) == (7, RESULTS)
    assert (quick.rounds, bench.folder(quick), quick.data) == (1, QUICK_RESULTS, full.data + "-quick")
    assert bench.folder(bench.parse(["--results", "-"])) is None


MODULES = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                 for p in (ROOT / "benchmarks").rglob("*.py"))


def _run(args: list[str], timeout: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_every_module_of_the_benchmarks_imports():
    """In a fresh process (a module registers an opener, sets warnings): each imports on this
    stack, whatever optional peer is missing (a benchmark says what it lacks when it runs)."""
    code = ("import importlib, json, sys\nfailed = {}\nfor name in sys.argv[1:]:\n"
            "    try:\n        importlib.import_module(name)\n"
            "    except BaseException as exn:\n        failed[name] = f'{type(exn).__name__}: {exn}'\n"
            "print(json.dumps(failed))\n")
    done = _run(["-c", code, *MODULES], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {}
    assert len(MODULES) >= 25 and "benchmarks.harness" in MODULES


# The benchmarks whose --quick run needs no cluster and no network, each with what its
# results file must hold (its sections' titles, from its docstring). (bench_ais and
# bench_storage need an AIStore cluster; the probes, which compare nothing, are imported above.)
QUICK = {
    "bench_write": ["cp -r", "webdataset ShardWriter", "ours, no index", "ours / webdataset ShardWriter",
                    "function, 2 workers / 1 worker"],
    "bench_cache": ["no cache", "cache, limit half the dataset", "DataLoader, 2 workers", "places / headers"],
    "bench_epochs": ["1. planning", "1b. planning", "2. time to the first batch", "3. shuffle quality",
                     "4. reading a mixture", "with places, 90% / 10%"],
    "bench_stats": ["1. wall clock and CPU", "places, 1 KB, in order, by wall: on / off",
                    "README vision, DataLoader 2 workers, by cpu: on / off", "2. instructions"],
    "bench_media": ["audio flac", "audio wav", "audio mp3", "video mp4", "ours decode('video') / torchcodec"],
    "bench_pipeline": ["1. raw grouped samples", "2. vision, one process", "3. vision, two cores", "3b. every front door",
                       "4. uniform small images", "5. shuffled raw samples", "raw, 1 KB payloads: ours / webdataset",
                       "2 cores, DataLoader(2 workers), decode_batches (README vision): / the ceiling"],
}
OWN_DATA = {"bench_epochs", "bench_pipeline", "bench_nodes", "bench_stats"}  # those that keep data between runs (--data)


def _quick(bench: str, folder: Path) -> subprocess.CompletedProcess:
    data = ["--data", str(folder / "data")] if bench in OWN_DATA else []
    return _run(["-m", f"benchmarks.{bench}", "--quick", "--results", str(folder), *data], timeout=600)


@pytest.mark.parametrize("bench", sorted(QUICK))
def test_quick_run_goes_end_to_end_into_its_results_file(bench, tmp_path):
    done = _quick(bench, tmp_path)
    assert done.returncode == 0, f"{bench} --quick failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    [path] = tmp_path.glob(f"{bench}-quick-*.txt")
    text = path.read_text()
    assert text.startswith(f"benchmark: {bench}\n") and f"command: python -m benchmarks.{bench} --quick" in text
    for section in QUICK[bench]:
        assert section in text, f"{bench}: no {section!r} in its results file"


def test_bench_nodes_runs_quick_where_torchdata_nodes_exists_and_says_why_not_elsewhere(tmp_path):
    if importlib.util.find_spec("torchdata.nodes") is None:  # torchdata < 0.10: the tested stack
        from benchmarks import bench_nodes

        with pytest.raises(SystemExit, match=r"torchdata.nodes needs torchdata >= 0.10"):
            bench_nodes.main(["--quick", "--results", str(tmp_path)])
        assert not list(tmp_path.iterdir())  # refused before writing anything
        return
    done = _quick("bench_nodes", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    [path] = tmp_path.glob("bench_nodes-quick-*.txt")
    assert "torchdata.nodes: Loader(IterableWrapper(ours))" in path.read_text()
