"""The package: ``python -m build`` makes a wheel and an sdist that twine passes, and the wheel
works installed in a fresh virtual environment, away from the checkout.

The build runs on a copy of the working tree as git sees it (tracked and untracked files, not
ignored ones), offline with the pinned setuptools (``--no-isolation``), so that it neither
downloads anything nor writes into the checkout. The fresh environment gets the wheel alone
(``pip install --no-deps --no-index``); torch and the other dependencies come from this test's
own environment through a ``.pth`` line naming its site-packages, so nothing is downloaded
again. A ``.pth`` path line adds that folder without running the ``.pth`` files in it, so the
checkout's editable install stays out: ``wds_datapipes`` must come from the wheel.
Oracles: PyPI's list of classifiers (trove-classifiers), ``tarfile`` for the shards the
installed command writes, and the files themselves (``zipfile``, ``tarfile``).
"""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(args: list, cwd: Path, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    run = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                         check=False, env=env)
    assert run.returncode == 0, f"{args}: {run.stdout[-2000:]}\n{run.stderr[-3000:]}"
    return run


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """The wheel and the sdist, built from a copy of the working tree."""
    base = tmp_path_factory.mktemp("package")
    files = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], ROOT).stdout
    source = base / "source"
    for name in filter(None, files.split("\0")):
        if (ROOT / name).is_file():  # a file deleted in the working tree is still in the index
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    out = base / "dist"
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, source], base, timeout=600)
    wheels, sdists = list(out.glob("*.whl")), list(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(out.iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0], "base": base}


def test_twine_passes_the_wheel_and_the_sdist(dist):
    run = _run([sys.executable, "-m", "twine", "check", "--strict", dist["wheel"], dist["sdist"]], dist["base"])
    assert run.stdout.count("PASSED") == 2, run.stdout


def test_the_wheel_holds_the_packages_their_type_markers_the_licence_and_the_metadata(dist):
    from trove_classifiers import classifiers as known

    with zipfile.ZipFile(dist["wheel"]) as wheel:
        names = set(wheel.namelist())
        info = next(n.rsplit("/", 1)[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = email.message_from_bytes(wheel.read(f"{info}/METADATA"))
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    assert {"wds_datapipes/__init__.py", "wds_datapipes/py.typed", "aisio/__init__.py", "aisio/py.typed",
            "wds_datapipes/cli.py", f"{info}/licenses/LICENSE"} <= names
    assert not any(n.startswith(("tests/", "benchmarks/", "examples/", "docs/")) for n in names)
    assert metadata["License-Expression"] == "Apache-2.0"
    assert "Apache License" in zipfile.ZipFile(dist["wheel"]).read(f"{info}/licenses/LICENSE").decode()
    classifiers = metadata.get_all("Classifier")
    assert set(classifiers) <= known, set(classifiers) - known
    assert {f"Programming Language :: Python :: 3.{minor}" for minor in range(10, 14)} <= set(classifiers)
    urls = dict(url.split(", ", 1) for url in metadata.get_all("Project-URL"))
    assert {"Homepage", "Documentation", "Issues", "Changelog"} <= set(urls)
    assert metadata["Requires-Python"] == ">=3.10"
    assert "wds-datapipes = wds_datapipes.cli:main" in entry_points


def test_the_sdist_holds_what_builds_the_wheel_and_the_tests(dist):
    with tarfile.open(dist["sdist"]) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "wds_datapipes/py.typed",
            "aisio/py.typed", "tests/conftest.py", "tests/test_package.py"} <= names
    assert not any("__pycache__" in name for name in names)


@pytest.fixture(scope="module")
def installed(dist) -> Path:
    """A fresh virtual environment with the wheel installed, and this environment's packages beside it."""
    venv = dist["base"] / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], dist["base"])
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--no-index",
          dist["wheel"]], dist["base"])
    fresh = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                      dist["base"]).stdout.strip())
    (fresh / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def test_the_installed_wheel_imports_away_from_the_checkout(installed, tmp_path):
    python = installed / "bin" / "python"
    code = ("import importlib.resources, wds_datapipes, aisio, wds_datapipes.cli\n"
            "print(wds_datapipes.__file__); print(aisio.__file__)\n"
            "print(importlib.resources.files('wds_datapipes').joinpath('py.typed').is_file())\n"
            "print(wds_datapipes.ShardLister(['a.tar']).load_tar() is not None)\n")
    lines = _run([python, "-c", code], tmp_path, env=_clean_env()).stdout.split()
    site = str(installed)
    assert lines[0].startswith(site) and lines[1].startswith(site), lines
    assert lines[2:] == ["True", "True"]


def test_the_installed_command_helps_writes_and_verifies_shards(installed, tmp_path):
    command = installed / "bin" / "wds-datapipes"
    env = _clean_env()
    shown = _run([command, "--help"], tmp_path, env=env).stdout
    assert shown.startswith("usage: wds-datapipes") and all(v in shown for v in ("index", "inspect", "verify", "create"))
    assert "usage: wds-datapipes create" in _run([command, "create", "--help"], tmp_path, env=env).stdout
    source = tmp_path / "in"
    source.mkdir()
    for i in range(5):
        (source / f"k{i}.txt").write_text(f"text {i}")
        (source / f"k{i}.cls").write_text(str(i))
    _run([command, "create", source, "-o", tmp_path / "out" / "s-%04d.tar", "--maxcount", "2", "--quiet"], tmp_path,
         env=env)
    shards = sorted((tmp_path / "out").glob("s-*.tar"))
    samples = {}
    for shard in shards:
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                key, _, suffix = member.name.partition(".")
                samples.setdefault(key, {})[suffix] = tar.extractfile(member).read().decode()
    assert len(shards) == 3
    assert samples == {f"k{i}": {"txt": f"text {i}", "cls": str(i)} for i in range(5)}
    verified = _run([command, "verify", tmp_path / "out" / "index.json"], tmp_path, env=env)
    assert "ok: 3 shards, 5 samples" in verified.stderr
