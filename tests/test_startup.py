"""Start-up: the command line and the writer start without torch, and the lazy package keeps its promises.

``import wds_datapipes`` loads its public names on first use (PEP 562); the pipes, with their
functional names and the loaders' hooks, load all together as soon as one is touched. Each
way in is run in a fresh process, where nothing else has loaded them. Oracles: ``tarfile``
for the samples of the shards, and ``python -X importtime`` for what a command imports.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import statistics
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

import wds_datapipes

ROOT = Path(__file__).resolve().parent.parent
# Imported by none of the commands' --help, nor by `import wds_datapipes`.
HEAVY = {"torch", "torchvision", "torchdata", "torchcodec", "numpy", "PIL", "simplejpeg", "pyarrow",
         "obstore", "webdataset", "aistore", "tqdm"}
# What the writer needs of them to write a folder's files into shards: numpy, for the index.
WRITER_NEEDS = {"numpy", "tqdm"}
BUDGET_S = 0.3  # --help, and the writer's first shard file opened, on a quiet machine
QUIET_FLOOR_S = 0.025  # a bare `python -c pass` there (0.02 s on this 2-core machine)
ROUNDS = 5


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def _run(args: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)


def _imported(args: list[str], cwd: Path) -> set[str]:
    """The top-level packages ``python -X importtime ARGS`` imports (its exit status must be 0)."""
    run = _run(["-X", "importtime", *args], cwd)
    assert run.returncode == 0, run.stderr[-3000:]
    names = set()
    for line in run.stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2 and "cumulative" not in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    assert "wds_datapipes" in names  # the command ran, and importtime saw it
    return names


def _folder(tmp_path: Path, n: int = 6) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(n):
        (folder / f"s{i:03d}.txt").write_text(f"sample {i}")
        (folder / f"s{i:03d}.cls").write_text(str(i % 3))
    return folder


def _tar_samples(paths: list[str]) -> dict[str, dict[str, bytes]]:
    """Oracle: each sample's fields, read with tarfile."""
    samples: dict[str, dict[str, bytes]] = {}
    for path in paths:
        with tarfile.open(path) as tar:
            for member in tar.getmembers():
                key, _, suffix = member.name.partition(".")
                samples.setdefault(key, {})[suffix] = tar.extractfile(member).read()
    return samples


# ---------------------------------------------------------------- what a start imports


@pytest.mark.parametrize("verb", [None, "create", "index", "inspect", "verify"])
def test_help_of_the_command_and_each_verb_imports_no_torch_and_no_numpy(verb, tmp_path):
    imported = _imported(["-m", "wds_datapipes", *([verb] if verb else []), "--help"], tmp_path)
    assert imported & HEAVY == set()


def test_import_wds_datapipes_imports_no_torch_and_no_numpy(tmp_path):
    assert _imported(["-c", "import wds_datapipes, wds_datapipes.cli"], tmp_path) & HEAVY == set()


def test_the_writer_writes_a_folder_without_torch(tmp_path):
    folder = _folder(tmp_path)
    out = tmp_path / "out"
    imported = _imported(["-m", "wds_datapipes", "create", str(folder), "-o", f"{out}/s-%06d.tar",
                          "--maxcount", "4", "--quiet"], tmp_path)
    assert imported & HEAVY <= WRITER_NEEDS
    shards = sorted(str(p) for p in out.glob("s-*.tar"))
    assert len(shards) == 2
    expected = {f"s{i:03d}": {"txt": f"sample {i}".encode(), "cls": str(i % 3).encode()} for i in range(6)}
    assert _tar_samples(shards) == expected


# ---------------------------------------------------------------- how long a start takes


def _timed_env(cwd: Path) -> dict[str, str]:
    """As an installed package starts: with its modules' bytecode cached (pip compiles it), here
    in a folder of the test's own (the checkout's environment may forbid writing bytecode)."""
    env = {**_env(), "PYTHONPYCACHEPREFIX": str(cwd / "pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _wall(args: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    run = subprocess.run([sys.executable, *args], cwd=cwd, env=_timed_env(cwd), capture_output=True, timeout=240,
                         check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return time.perf_counter() - start


# Runs the command line as `python -m wds_datapipes` does, and writes the time at which the first
# shard file is opened (the writer's os.open of <shard>.part: an "open" audit event).
FIRST_SHARD = textwrap.dedent("""
    import os, runpy, sys, time
    seen = []
    def hook(event, args):
        if event == "open" and not seen and str(args[0]).endswith(".tar.part"):
            seen.append(time.time())
    sys.addaudithook(hook)
    sys.argv = ["wds_datapipes", *sys.argv[2:]]
    try:
        runpy.run_module("wds_datapipes", run_name="__main__", alter_sys=True)
    finally:
        with open(os.environ["FIRST_SHARD_FILE"], "w") as out:
            out.write(repr(seen[0]) if seen else "none")
""")


def _to_first_shard(folder: Path, tmp_path: Path, round_: int) -> float:
    stamp = tmp_path / f"first-{round_}.txt"
    out = tmp_path / f"out-{round_}"
    start = time.time()
    run = subprocess.run([sys.executable, "-c", FIRST_SHARD, "-", "create", str(folder), "-o",
                          f"{out}/s-%06d.tar", "--quiet"], cwd=tmp_path, capture_output=True, text=True,
                         env={**_timed_env(tmp_path), "FIRST_SHARD_FILE": str(stamp)}, timeout=240, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    opened = stamp.read_text()
    assert opened != "none", "the writer opened no <shard>.part file"
    return float(opened) - start


def test_help_and_the_writers_first_shard_come_within_the_budget(tmp_path):
    """Medians of interleaved runs against a bare interpreter's start in the same rounds: the
    budget (0.3 s) grows with how much slower than a quiet machine that bare start runs now,
    so a loaded 2-core CI machine does not fail it; torch alone takes several budgets. The
    first round compiles the bytecode and is not counted."""
    folder = _folder(tmp_path)
    times: dict[str, list[float]] = {"floor": [], "help": [], "create --help": [], "first shard": []}
    _wall(["-m", "wds_datapipes", "--help"], tmp_path)
    _to_first_shard(folder, tmp_path, -1)
    for round_ in range(ROUNDS):
        times["floor"].append(_wall(["-c", "pass"], tmp_path))
        times["help"].append(_wall(["-m", "wds_datapipes", "--help"], tmp_path))
        times["create --help"].append(_wall(["-m", "wds_datapipes", "create", "--help"], tmp_path))
        times["first shard"].append(_to_first_shard(folder, tmp_path, round_))
    medians = {name: statistics.median(values) for name, values in times.items()}
    budget = BUDGET_S * max(1.0, medians["floor"] / QUIET_FLOOR_S)
    print(json.dumps({"budget_s": round(budget, 3), **{k: round(v, 3) for k, v in medians.items()}}))
    for name in ("help", "create --help", "first shard"):
        assert medians[name] <= budget, f"{name}: {medians[name]:.3f} s, over {budget:.3f} s ({medians})"


# ---------------------------------------------------------------- the lazy package's promises


def _python(code: str, cwd: Path, *args: str) -> str:
    run = _run(["-c", textwrap.dedent(code), *args], cwd)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


READ = """import json, sys
{setup}
dp = {pipeline}
samples = {{s["__key__"]: {{k: v.decode() for k, v in s.items() if not k.startswith("__")}} for s in dp}}
print(json.dumps({{"samples": samples, "hooks": hasattr(dp, "set_epoch")}}))
"""
WAYS_IN = {
    "a public name": ("import wds_datapipes as wd",
                      "wd.ShardLister(sys.argv[1:], shuffle=True).load_tar().group_by_key()"),
    "from the package": ("from wds_datapipes import ShardLister",
                         "ShardLister(sys.argv[1:], shuffle=True).load_tar().group_by_key()"),
    "a module of ours": ("from wds_datapipes.shards.listing import ShardLister",
                         "ShardLister(sys.argv[1:], shuffle=True).load_tar().group_by_key()"),
    "torch first": ("import torch\nimport wds_datapipes\nfrom torch.utils.data.datapipes.iter import IterableWrapper",
                    "IterableWrapper(sys.argv[1:]).list_shards(shuffle=True).load_tar().group_by_key()"),
    "torch after us": ("import wds_datapipes\nfrom torch.utils.data.datapipes.iter import IterableWrapper",
                       "IterableWrapper(sys.argv[1:]).list_shards(shuffle=True).load_tar().group_by_key()"),
}


@pytest.mark.parametrize("way", sorted(WAYS_IN))
def test_the_functional_names_and_hooks_are_there_whichever_way_a_pipe_is_first_touched(way, make_shards, tmp_path):
    shards = make_shards(2, 3)
    setup, pipeline = WAYS_IN[way]
    out = json.loads(_python(READ.format(setup=setup, pipeline=pipeline), tmp_path, *shards))
    expected = {key: {k: v.decode() for k, v in fields.items()} for key, fields in _tar_samples(shards).items()}
    assert out == {"samples": expected, "hooks": True}


PICKLED = """
    import pickle, sys
    import wds_datapipes as wd
    dp = wd.ShardLister(sys.argv[1:], shuffle=True, seed=3).load_tar().group_by_key()
    sys.stdout.write(pickle.dumps(dp).hex())
"""
UNPICKLE = """
    import json, pickle, sys
    dp = pickle.loads(bytes.fromhex(sys.stdin.read()))
    assert "torch" in sys.modules
    print(json.dumps({"keys": sorted(s["__key__"] for s in dp), "hooks": hasattr(dp, "set_epoch"),
                      "more": hasattr(dp, "decode")}))
"""


def test_a_pickled_pipeline_loads_whole_in_a_fresh_process(make_shards, tmp_path):
    """A pickle names our pipes' modules only: loading it must bring the hooks and every functional name."""
    shards = make_shards(2, 3)
    blob = _python(PICKLED, tmp_path, *shards)
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(UNPICKLE)], input=blob, cwd=tmp_path, env=_env(),
                         capture_output=True, text=True, timeout=240, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout) == {"keys": sorted(_tar_samples(shards)), "hooks": True, "more": True}


SPAWNED = """
    import json, sys
    import wds_datapipes as wd
    if __name__ == "__main__":
        from torch.utils.data import DataLoader
        dp = wd.ShardLister(sys.argv[1:], shuffle=True, seed=1).load_tar().group_by_key().to_tuple("txt")
        loader = DataLoader(dp, batch_size=None, num_workers=2, multiprocessing_context="spawn")
        loader.dataset.set_epoch(1)
        print(json.dumps(sorted(t[0].decode() for t in loader)))
"""


def test_spawned_loader_workers_read_our_pipes(make_shards, tmp_path):
    shards = make_shards(2, 3)
    script = tmp_path / "spawned.py"  # spawn starts its workers from the main module's file
    script.write_text(textwrap.dedent(SPAWNED))
    run = _run([str(script), *shards], tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout) == sorted(f["txt"].decode() for f in _tar_samples(shards).values())


def test_the_public_names_are_listed_alike_in_the_three_places():
    """__init__'s TYPE_CHECKING imports (what type checkers see), its _PUBLIC table (what loads
    them) and __all__ name the same names, from the same modules; each resolves."""
    tree = ast.parse((ROOT / "wds_datapipes" / "__init__.py").read_text())
    checked = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    imports = {alias.name: node.module for node in checked.body for alias in node.names}
    table = {name: module for module, names in wds_datapipes._PUBLIC.items() for name in names}
    assert imports == table
    assert set(wds_datapipes.__all__) == set(table) | {"MultiProcessingReadingService"}
    for name, module in table.items():  # not MultiProcessingReadingService: torchdata >= 0.10 has none
        assert getattr(wds_datapipes, name) is getattr(importlib.import_module(f"wds_datapipes.{module}"), name)
    assert set(wds_datapipes.__all__) <= set(dir(wds_datapipes))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        wds_datapipes.nothing  # noqa: B018


def test_the_names_that_load_the_pipes_are_the_functional_names_we_register():
    """Oracle: torch's own registry of functional names, once our pipes are loaded (a fresh process)."""
    out = _python("""
        import json, wds_datapipes as wd
        from torch.utils.data import IterDataPipe
        before = set(IterDataPipe.functions)
        wd.ShardLister  # loads the pipes
        print(json.dumps(sorted(set(IterDataPipe.functions) - before)))
    """, Path.cwd())
    from wds_datapipes import _FUNCTIONAL_NAMES

    assert set(json.loads(out)) == _FUNCTIONAL_NAMES
