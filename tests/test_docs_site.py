"""The documentation site builds with every warning an error, and holds what it must.

The site (docs/conf.py: the guides through myst-parser, the API reference through autodoc, in
nitpicky mode) is built once, as ``make docs`` builds it, in a subprocess into a temp dir. Its
Sphinx warnings fail the build; beyond that the tests read what was built, against oracles of
their own: every guide in docs/ is a page; every name in the public modules' ``__all__`` has an
entry in the site's inventory (read by Sphinx's own inventory reader); every relative link of a
guide (taken from the Markdown with a regex) lands on a built page and an anchor that exists,
or on the GitHub URL of a file or folder that exists in the checkout.

The checks themselves (docs/_ext) are shown to fail: a small project of its own, with a public
name left out, a function without a docstring and a link to a missing file, fails the build
naming each, and nothing else.
"""

from __future__ import annotations

import fcntl
import html
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REPO_URL = "https://github.com/wds-datapipes/wds-datapipes"
# The modules whose __all__ is the public API the reference must cover.
PUBLIC_MODULES = ("wds_datapipes", "wds_datapipes.writing", "wds_datapipes.stats", "aisio")
BUILD_TIMEOUT_S = 900  # ~25 s of CPU; minutes of wall clock on a 2-core machine shared with other work

# One build for the module's tests: under pytest-xdist they ask to run in one worker, and workers
# that get some anyway wait for the one build of the run (see ``site``).
pytestmark = pytest.mark.xdist_group("docs_site")

if importlib.util.find_spec("torchdata.dataloader2") is None:  # torchdata >= 0.10 (the newest stack)
    pytest.skip("the reference documents wd.MultiProcessingReadingService, DataLoader2's, which this "
                "torchdata does not have", allow_module_level=True)


def sphinx_build(source: Path, out: Path) -> subprocess.CompletedProcess:
    """``make docs``'s command (-W --keep-going: every warning reported, then a failure)."""
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-E", "-W", "--keep-going", "-q",
               str(source), str(out / "html"), "-d", str(out / "doctrees")]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, cwd=out)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once a run: pytest-xdist's workers share the run's temp folder, and the first
    to take the lock builds (pytest 9.2 ignores how pytest-xdist 3.8 groups tests, so a module's
    tests may land on several workers)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's folder, above each worker's own
    out = shared / "docs_site"
    with open(shared / "docs_site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "result.json").exists():
            out.mkdir(exist_ok=True)
            built = sphinx_build(DOCS, out)
            (out / "result.json").write_text(json.dumps([built.returncode, built.stderr + built.stdout[-3000:]]))
    returncode, output = json.loads((out / "result.json").read_text())
    assert returncode == 0 and "WARNING" not in output, f"the docs build failed (make docs shows the same):\n{output}"
    return out / "html"


def test_every_guide_is_a_page(site):
    guides = sorted(page.stem for page in DOCS.glob("*.md") if page.stem != "index")
    assert guides, "no guides found"
    missing = [guide for guide in guides if not (site / f"{guide}.html").is_file()]
    assert not missing, f"guides without a page: {missing}"
    index = (site / "index.html").read_text()
    not_linked = [guide for guide in guides if f'href="{guide}.html"' not in index]
    assert not not_linked, f"guides not in the index page's table of contents: {not_linked}"


def test_every_public_name_has_an_entry(site):
    from sphinx.util.inventory import InventoryFile

    with open(site / "objects.inv", "rb") as inventory:
        entries = InventoryFile.load(inventory, "", lambda base, uri: uri)
    documented = {name for kind, names in entries.items() if kind.startswith("py:") for name in names}
    public = {f"{module}.{name}" for module in PUBLIC_MODULES for name in importlib.import_module(module).__all__}
    assert len(public) > 80  # the oracle itself: each module's __all__, read here
    assert not sorted(public - documented), "public names without an entry in the reference"


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")  # [text](target): Markdown links, not images
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)


def github_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a Markdown page's headings: the heading's text (no code marks, a
    link's text), lower case, without what is not a letter, digit, ``_``, ``-`` or space, spaces
    as ``-``; a repeated one gets ``-1``, ``-2``, ...  The guides are read on GitHub, so their
    links use these (myst's ``myst_heading_anchors`` gives the same ones on the site)."""
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", page.read_text()), re.MULTILINE):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        repeat = 0
        while (slug if repeat == 0 else f"{slug}-{repeat}") in anchors:
            repeat += 1
        anchors.add(slug if repeat == 0 else f"{slug}-{repeat}")
    return anchors


def test_guide_links_land_on_pages_anchors_or_repository_files(site):
    checked = 0
    for page in sorted(DOCS.glob("*.md")):
        built = html.unescape((site / f"{page.stem}.html").read_text())
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:: not ours to check offline
            path, _, fragment = target.partition("#")
            linked = (DOCS / path).resolve() if path else page
            if fragment and linked.suffix == ".md":
                assert fragment in github_anchors(linked), f"{page.name}: {target}: no such heading"
            if path.endswith(".md") and linked.parent == DOCS:  # another guide: a link to its page
                assert f'href="{linked.stem}.html' in built, f"{page.name}: link to {target} not a page link"
            elif path:  # a file or folder of the repository: its GitHub URL, and it exists
                assert linked.exists() and linked.is_relative_to(ROOT), f"{page.name}: {target} does not exist"
                kind = "tree" if linked.is_dir() else "blob"
                url = f"{REPO_URL}/{kind}/main/{linked.relative_to(ROOT).as_posix()}"
                assert f'href="{url}{"#" + fragment if fragment else ""}"' in built, (
                    f"{page.name}: {target} is not linked as {url}")
            checked += 1
    assert checked > 30  # the guides link to each other and to the code


def test_the_checks_fail_the_build_naming_what_is_wrong(tmp_path):
    """A project of its own: the oracle is what it was built with (one name left out, one function
    without a docstring, one link to a missing file), against the build's warnings."""
    repo = tmp_path / "repo"
    (repo / "fakepkg").mkdir(parents=True)
    (repo / "docs").mkdir()
    (repo / "NOTES.md").write_text("# Notes\n\n## Part\n")
    (repo / "fakepkg" / "inner.py").write_text(textwrap.dedent('''
        """Where the public names live."""


        def helper() -> int:
            """Returns one."""
            return 1


        class Thing:
            """A thing."""

            @property
            def limit(self) -> float | None:
                """Seconds until it stops (None: never)."""
                return None
        '''))
    (repo / "fakepkg" / "__init__.py").write_text(textwrap.dedent('''
        """A package for the checks."""

        from .inner import Thing, helper

        __all__ = ["Thing", "documented", "forgotten", "helper"]


        def documented() -> None:
            """Uses :func:`fakepkg.inner.helper` and :class:`Thing` (by where they are defined)."""


        def forgotten() -> None:
            """Has no entry."""


        def blank() -> None:
            pass
        '''))
    (repo / "docs" / "conf.py").write_text(textwrap.dedent(f'''
        import sys
        sys.path[:0] = [{str(DOCS / "_ext")!r}, {str(repo)!r}]
        extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "prose_attributes", "myst_parser",
                      "repo_links", "public_api"]
        nitpicky = True
        myst_heading_anchors = 2
        repo_links_url = "https://example.invalid/repo"
        public_api_modules = ["fakepkg"]
        '''))
    (repo / "docs" / "index.md").write_text(textwrap.dedent('''
        # Index

        [code](../fakepkg/__init__.py), [folder](../fakepkg/), [notes](../NOTES.md#part),
        [gone](../missing.py).

        ```{toctree}
        api
        ```
        '''))
    (repo / "docs" / "api.rst").write_text(textwrap.dedent('''
        API
        ===

        .. autofunction:: fakepkg.documented

        .. autofunction:: fakepkg.helper

        .. autofunction:: fakepkg.blank

        .. autoclass:: fakepkg.Thing
           :members:
        '''))
    result = sphinx_build(repo / "docs", tmp_path)
    warnings = sorted(line.split("WARNING: ", 1)[1] for line in result.stderr.splitlines() if "WARNING: " in line)
    assert result.returncode != 0
    assert warnings == [
        "fakepkg.blank (function) has no docstring",
        "fakepkg.forgotten is public (in fakepkg.__all__) but has no entry in docs/api/",
        "link to '../missing.py': no such page, nor file or folder of the repository",
    ], result.stderr
    index = (tmp_path / "html" / "index.html").read_text()
    for url in ("blob/main/fakepkg/__init__.py", "tree/main/fakepkg", "blob/main/NOTES.md#part"):
        assert f'href="https://example.invalid/repo/{url}"' in index
