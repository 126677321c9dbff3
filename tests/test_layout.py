"""The house: rooms whose imports only go down, no import circles, no module a reader has to scroll through."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("wds_datapipes", "aisio")
LONGEST = 500  # lines: past this a module hides its structure

# What each room of wds_datapipes may import, besides itself. The shared basics (errors,
# limits, handlers, topology, threads, ...) sit at the package's top and import no room.
ROOMS_BELOW = {
    "basics": set(),
    "tar": {"basics"},
    "shards": {"basics", "tar"},
    "pipes": {"basics"},
    "decoding": {"basics", "pipes"},
    "epochs": {"basics", "tar", "shards"},
    "loaders": {"basics", "epochs"},
    "writing": {"basics", "tar", "shards", "decoding", "epochs"},
}
TOP = {"wds_datapipes", "wds_datapipes.__main__", "wds_datapipes.cli"}  # may import any room


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
    """The project modules ``name`` imports anywhere in it (lazy imports in functions included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block.test)
                   for n in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue  # annotations only: never imported when the code runs
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            submodules = [f"{module}.{alias.name}" for alias in node.names if f"{module}.{alias.name}" in MODULES]
            targets = submodules if len(submodules) == len(node.names) else [module, *submodules]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"


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


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("wds_datapipes") and n not in TOP))
def test_imports_only_go_down(name):
    room = _room(name)
    allowed = ROOMS_BELOW[room] | {room}
    for target in GRAPH[name]:
        assert not target.startswith("aisio"), f"{name} imports {target}: the core knows nothing of AIStore"
        assert _room(target) in allowed, f"{name} (room {room!r}) imports {target} (room {_room(target)!r})"


def test_there_are_no_import_circles():
    # Tarjan's strongly connected components over every import, lazy ones included.
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in GRAPH[node]:
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
            # A package's __init__ importing its own modules is not a circle of the code.
            code = [m for m in component if MODULES[m].name != "__init__.py"]
            if len(code) > 1:
                circles.append(sorted(component))

    for node in GRAPH:
        if node not in index:
            visit(node)
    assert circles == [], "\n".join(" <-> ".join(c) for c in circles)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_longer_than_a_reader_can_hold(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= LONGEST, f"{name} has {lines} lines: split it where a natural seam is"


def test_the_checks_above_would_see_a_circle_and_an_upward_import():
    """The graph these tests read is the real one: known edges are in it."""
    assert "wds_datapipes.tar" in GRAPH["wds_datapipes.shards.tar_loader"]
    assert "wds_datapipes.epochs.epoch_pipe" in GRAPH["wds_datapipes.loaders.hooks"]
    assert "aisio.local_etl" in GRAPH["aisio.listing"]  # a lazy import counts too
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
