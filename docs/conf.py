"""The documentation site: the guides (``docs/*.md``, through myst-parser) and the API reference
(``docs/api/``, from the docstrings by autodoc).

``make docs`` builds it into ``build/docs``; ``tests/test_docs_site.py`` builds it with every warning
an error. Nitpicky mode is on: every cross-reference must resolve, or be one of the external names
listed at the end of this file with the reason it cannot.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(DOCS / "_ext"), str(ROOT)]  # our extensions; the checkout's code, installed or not

project = "wds-datapipes"
author = "The wds-datapipes authors"
copyright = "the wds-datapipes authors"
try:
    release = metadata.version("wds-datapipes")
except metadata.PackageNotFoundError:  # a checkout that was never installed
    release = ""
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",  # the tables of names at the top of each reference page
    "sphinx.ext.napoleon",  # our docstrings' Google-style ``Args:``, ``Returns:``, ``Example:``
    "prose_attributes",  # docs/_ext: napoleon reads properties' and values' docstrings as prose
    "myst_parser",  # the Markdown guides
    "repo_links",  # docs/_ext: guide links to files of the repository, not pages of the site
    "public_api",  # docs/_ext: every public name documented, and found under its public path
    "rooms",  # docs/_ext: the contributors' page: every module and its docstring's first paragraph
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns: list[str] = []
nitpicky = True  # every reference resolves (tests/test_docs_site.py builds with -W)

# The guides link to headings by their GitHub anchors (``speed.md#performance-guide``); the same
# slugs here, for headings down to ####.
myst_heading_anchors = 4

# A heading that skips a level (# then ###) reads as it does on GitHub, where the guides are read too.
suppress_warnings = ["myst.header"]

# Relative links from a guide to a file of the repository that is not a page of the site
# (``../wds_datapipes/limits.py``, ``../benchmarks/``) go to that file on GitHub's main branch
# (docs/_ext/repo_links.py); a link to a file that does not exist is an error.
repo_links_url = "https://github.com/wds-datapipes/wds-datapipes"
repo_links_branch = "main"

# The public names each of these modules lists in ``__all__`` must each be documented, with a
# docstring, somewhere in docs/api/ (docs/_ext/public_api.py checks it; tests/test_docs_site.py lists
# the same modules).
public_api_modules = ["wds_datapipes", "wds_datapipes.writing", "wds_datapipes.stats", "aisio"]

autosummary_generate = False  # the tables only: no stub pages written into the source tree
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True  # ``handler=reraise_exception``, not the function's repr
autodoc_class_signature = "mixed"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True  # an ``Attributes:`` section's fields, not a second entry beside :undoc-members:'s

html_theme = "alabaster"
html_title = f"wds-datapipes {release}".strip()
html_theme_options = {
    "description": "WebDataset tar shards into PyTorch",
    "github_user": "wds-datapipes",
    "github_repo": "wds-datapipes",
    "github_button": False,
    "fixed_sidebar": True,
}
html_static_path: list[str] = []

# Names from outside the project, which no reference can resolve: there is no network to fetch the
# other projects' inventories (intersphinx), so each family is listed here instead, and shows as plain
# text. Python's builtins (``str``, ``None``) and ``typing``'s names need no entry: Sphinx lets them be.
_EXTERNAL = {
    # The standard library's modules our signatures name (``collections.abc.Iterator``, ``io.RawIOBase``,
    # ``os.PathLike``), and those they may.
    "stdlib": r"(collections|collections\.abc|pathlib|io|os|logging|threading|queue|concurrent\.futures"
              r"|multiprocessing|subprocess|socket|http\.client|datetime|enum|dataclasses|argparse"
              r"|tarfile|sqlite3|types|random|numbers|contextlib|ctypes|abc|re|json|typing)\..+",
    # PyTorch, torchdata, torchvision and TorchCodec: tensors, devices and the DataPipes we build on
    # (``IterDataPipe``: how our pipes' attribute annotations name torch's base class).
    "torch": r"(torch|torchdata|torchvision|torchcodec)(\..+)?|IterDataPipe",
    # numpy's arrays; the aistore SDK's client, retry, ETL and dSort types (aisio's signatures);
    # Pillow, webdataset, obstore and pyarrow, which other signatures may name.
    "libraries": r"(numpy|PIL|webdataset|aistore|obstore|pyarrow)(\..+)?",
}
nitpick_ignore_regex = [(r"py:.*", pattern) for pattern in _EXTERNAL.values()]

# The type variables of our generic pipes (``Shuffler[T]``): placeholders, with no entry to link to.
nitpick_ignore_regex.append((r"py:class", r"(wds_datapipes|aisio)\..*\.(T|T_co)"))
