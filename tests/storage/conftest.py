"""The object-store back ends' tests: each store (``object_server``, tests/server_fixtures.py)
with its standard environment variables set, and the ``wds_datapipes.backends`` entry
points of this tree visible to this process and to the workers it starts."""

from __future__ import annotations

import os
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from store_helpers import configured

from wds_datapipes.storage import object_store, store_calls

ROOT = Path(__file__).resolve().parents[2]
GROUP = "wds_datapipes.backends"


@pytest.fixture(scope="session", autouse=True)
def backends_entry_points(tmp_path_factory):
    """Where the installed package's metadata predates the ``s3``/``gs``/``az`` entry points (an
    editable install made before they were added), a distribution of the tests' own declares
    them, read from this tree's pyproject.toml, on ``sys.path`` and ``$PYTHONPATH`` (spawned
    workers): the back ends are then found the way an installed package finds them."""
    if entry_points(group=GROUP, name="s3"):
        yield
        return
    declared = _declared_entry_points()
    folder = tmp_path_factory.mktemp("entry-points")
    info = folder / "wds_datapipes_tree_backends-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: wds-datapipes-tree-backends\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n" + "".join(f"{k} = {v}\n" for k, v in declared.items()))
    sys.path.append(str(folder))
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (before, str(folder)) if p)
    try:
        yield
    finally:
        sys.path.remove(str(folder))
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


def _declared_entry_points() -> dict[str, str]:
    """The ``[project.entry-points."wds_datapipes.backends"]`` table of pyproject.toml (name = "target")."""
    section, found = None, {}
    for line in (ROOT / "pyproject.toml").read_text().splitlines():
        if line.startswith("["):
            section = line.strip()
        elif section == f'[project.entry-points."{GROUP}"]' and "=" in line:
            name, _, target = line.partition("=")
            found[name.strip()] = target.strip().strip('"')
    return found


@pytest.fixture
def store(object_server, monkeypatch):
    """``object_server`` with its standard variables in the environment and no settings in code."""
    return configured(object_server, monkeypatch)


@pytest.fixture
def forked(monkeypatch):
    """This process as one forked after obstore started: its calls go through a store agent
    of its own (stopped after the test)."""
    monkeypatch.setattr(store_calls, "_runtime_pid", -1)
    monkeypatch.setattr(store_calls, "_the_agent", None)
    monkeypatch.setattr(object_store, "_unsigned", set())
    yield
    agent = store_calls._the_agent
    if agent is not None:
        agent._proc.stdin.close()
        agent._proc.wait(timeout=30)
        agent._proc.stdout.close()  # both pipes: none left to the garbage collector
