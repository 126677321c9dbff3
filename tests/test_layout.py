"""The house: rooms whose imports only go down, no import circles, no module a reader has to scroll through."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("wds_datapipes", "aisio", "benchmarks")  # benchmarks: in the graph for its layers and circles
LONGEST = 500  # lines: past this a module hides its structure
MOST_AT_TOP = 12  # modules at wds_datapipes/'s top (issue 38): the rest belongs in a room

# What each room of wds_datapipes may import, besides itself. The shared basics (errors,
# limits, handlers, topology, threads, ...) sit at the package's top and import no room.
ROOMS_BELOW = {
    "basics": set(),
    "stats": {"basics"},  # every stage reports into it; it knows none of them
    "tar": {"basics", "stats"},
    "storage": {"basics", "stats"},
    "shards": {"basics", "stats", "tar", "storage"},
    "cache": {"basics", "stats", "tar", "storage", "shards"},  # a layer under shards' open_shard, put there from above
    "pipes": {"basics", "stats"},
    "decoding": {"basics", "stats", "pipes"},
    "epochs": {"basics", "stats", "tar", "storage", "shards", "cache"},
    "loaders": {"basics", "stats", "epochs"},
    "writing": {"basics", "stats", "tar", "storage", "shards", "decoding", "epochs"},
    "tools": {"basics", "stats", "tar", "storage", "shards", "cache", "pipes", "decoding", "epochs", "loaders"},
}
# May import any room: the package, the command line, and the old module paths (whose retired helpers call into rooms).
TOP = {"wds_datapipes", "wds_datapipes.__main__", "wds_datapipes.cli", "wds_datapipes._moved"}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The project modules ``name`` imports anywhere in it: at the top, inside functions and
    classes, under ``if TYPE_CHECKING:`` (annotations tie modules as imports do: two
    modules naming each other's types are a circle) and by ``importlib.import_module`` of
    a literal name."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(package, node.level, node.module or "")
            submodules = [f"{module}.{alias.name}" for alias in node.names if f"{module}.{alias.name}" in MODULES]
            targets = submodules if len(submodules) == len(node.names) else [module, *submodules]
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                level = len(first.value) - len(first.value.lstrip("."))
                targets = [_absolute(package, level, first.value.lstrip(".")) if level else first.value]
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _absolute(package: str, level: int, module: str) -> str:
    """The absolute name of ``from <level dots><module> import ...`` written in ``package``."""
    if not level:
        return module
    base = package.split(".")[: len(package.split(".")) - level + 1]
    return ".".join(base + ([module] if module else []))


def _is_import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id == "import_module")


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _room(name: str) -> str:
    parts = name.split(".")
    if name in TOP:
        return "top"
    if len(parts) > 2 or (ROOT / parts[0] / parts[1]).is_dir():
        return parts[1]
    return "basics"


def test_the_layout_is_what_this_test_knows():
    rooms = {_room(n) for n in MODULES if n.startswith("wds_datapipes")}
    assert rooms == set(ROOMS_BELOW) | {"top"}, "a new room: say what it may import in ROOMS_BELOW"


def test_the_package_s_top_holds_at_most_a_dozen_modules():
    """Counted from the files (``__init__`` and ``__main__`` included), not from MODULES."""
    top = sorted(path.name for path in (ROOT / "wds_datapipes").glob("*.py"))
    assert len(top) <= MOST_AT_TOP, f"{len(top)} modules at wds_datapipes/'s top ({', '.join(top)}): move one into " \
                                     "the room that uses it"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("wds_datapipes") and n not in TOP))
def test_imports_only_go_down(name):
    room = _room(name)
    allowed = ROOMS_BELOW[room] | {room}
    for target in GRAPH[name]:
        assert not target.startswith("aisio"), f"{name} imports {target}: the core knows nothing of AIStore"
        assert _room(target) in allowed, f"{name} (room {room!r}) imports {target} (room {_room(target)!r})"


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected components of more than one
    module (Tarjan's algorithm), each sorted. A package's ``__init__`` counts as a module: one
    that imports a module which imports the package's names back is a circle too."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return circles


def test_there_are_no_import_circles():
    circles = _circles(GRAPH)
    assert circles == [], "\n".join(" <-> ".join(c) for c in circles)


def test_imports_in_functions_under_type_checking_and_by_import_module_are_seen(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .media import AudioSpec\nelse:\n    from .values import gunzip\n"
        "def f():\n    import importlib\n    from .images import decode_image\n"
        "    importlib.import_module('wds_datapipes.decoding.vision')\n"
        "    importlib.import_module('.batch_decoder', __package__)\n")
    assert _imports("wds_datapipes.decoding.probe", probe) == {f"wds_datapipes.decoding.{name}" for name in (
        "media", "values", "images", "vision", "batch_decoder")}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_longer_than_a_reader_can_hold(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= LONGEST, f"{name} has {lines} lines: split it where a natural seam is"


_SCRIPTS = sorted(str(p.relative_to(ROOT)) for folder in ("benchmarks", "examples", "tests")
                  for p in (ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("path", _SCRIPTS)
def test_no_benchmark_example_or_test_file_is_longer_either(path):
    lines = len((ROOT / path).read_text().splitlines())
    assert lines <= LONGEST, f"{path} has {lines} lines: split it where a natural seam is"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("benchmarks")))
def test_benchmarks_import_only_down(name):
    """benchmarks/ in layers: the harness at the bottom imports nothing else of the package;
    what benchmarks share sits above it; nothing imports a benchmark or a probe (``bench_*``,
    ``probe_*``), the top."""
    for target in GRAPH[name]:
        if name.startswith("benchmarks.harness"):
            assert not target.startswith("benchmarks.") or target.startswith("benchmarks.harness"), \
                f"{name} (the harness) imports {target}"
        assert not target.split(".")[-1].startswith(("bench_", "probe_")) or not target.startswith("benchmarks."), \
            f"{name} imports {target}: what two benchmarks share goes in a module below them"


def test_the_checks_above_would_see_a_circle_and_an_upward_import():
    """The graph these tests read is the real one: known edges are in it, lazy and
    annotation-only imports included, and a circle in a graph is found."""
    assert "wds_datapipes.tar" in GRAPH["wds_datapipes.shards.tar_loader"]
    assert "wds_datapipes.epochs.epoch_pipe" in GRAPH["wds_datapipes.loaders.hooks"]
    assert "aisio.local_etl" in GRAPH["aisio.listing"]  # a lazy import counts too
    assert {"benchmarks.harness", "benchmarks.front_doors"} <= GRAPH["benchmarks.bench_pipeline"]
    assert "wds_datapipes.decoding.specs" in GRAPH["wds_datapipes.decoding.media"]  # under TYPE_CHECKING too
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
    assert _room("wds_datapipes.epochs.plan") == "epochs" and _room("wds_datapipes.topology") == "basics"


def test_the_flat_layout_s_module_paths_still_import_with_a_warning():
    import importlib
    import pickle
    import sys

    import wds_datapipes as wd

    for old in ("wds_datapipes.tar_reader", "wds_datapipes.exact_epochs", "wds_datapipes.member_places"):
        sys.modules.pop(old, None)
        with pytest.warns(DeprecationWarning, match=f"{old} moved"):
            module = importlib.import_module(old)
        assert module.__name__ == old
    assert sys.modules["wds_datapipes.tar_reader"].iter_tar_members is wd.tar.iter_tar_members
    assert sys.modules["wds_datapipes.member_places"].read_placed.__module__ == "wds_datapipes.epochs.placed_reads"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        sys.modules["wds_datapipes.exact_epochs"].nothing  # noqa: B018

    # A pickle made when the classes lived at the top (protocol 0 names them in plain text).
    made = pickle.dumps(wd.ShardLister(["a.tar", "b.tar"]).load_tar(), protocol=0)
    assert b"wds_datapipes.shards.tar_loader" in made
    old = made.replace(b"wds_datapipes.shards.tar_loader", b"wds_datapipes.tar_loader").replace(
        b"wds_datapipes.shards.listing", b"wds_datapipes.shard_listing")
    with pytest.warns(DeprecationWarning):
        pipe = pickle.loads(old)
    assert type(pipe) is wd.TarLoader and list(pipe.source_datapipe) == ["a.tar", "b.tar"]


def test_no_stage_knows_the_exporters():
    """The stats' exporters (TensorBoard, Prometheus, profiler ranges, trace files) sit at the
    room's edge: the stages report into the stats, which hand intervals to an observer they do
    not name. Only the stats' public face (``wds_datapipes.stats``) and the exporters themselves
    import ``wds_datapipes.stats.export``."""
    edge = "wds_datapipes.stats.export"
    for name, targets in GRAPH.items():
        if name == "wds_datapipes.stats" or name == edge or name.startswith(edge + "."):
            continue
        knows = sorted(t for t in targets if t == edge or t.startswith(edge + "."))
        assert not knows, f"{name} imports {knows}: a stage or a stats module that knows an exporter"
