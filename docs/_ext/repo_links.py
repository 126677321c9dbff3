"""Links from a guide to a file or folder of the repository that is not a page of the site.

The guides are read on GitHub too, where ``[limits.py](../wds_datapipes/limits.py)`` opens the
file. myst-parser would make such a link a download of a copy (a file), a reference to a page that
does not exist (a Markdown file outside ``docs/``, such as the README) or leave it unresolved (a
folder); here each becomes a link to the same path on GitHub (``repo_links_url``, branch
``repo_links_branch``), its ``#fragment`` kept where myst kept it. A link to a path that does not
exist, or lies outside the repository, is a warning (an error under ``-W``): nothing is silently
broken.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.transforms import SphinxTransform
from sphinx.util import logging

logger = logging.getLogger(__name__)


class RepoLinks(SphinxTransform):
    """Turns myst's links to repository files and folders into links to them on GitHub."""

    default_priority = 400  # after myst's own reading; before Sphinx collects downloads (doctree-read)

    def apply(self, **kwargs: Any) -> None:
        for node in list(self.document.findall(addnodes.download_reference)):
            if node.get("reftype") == "myst":  # an existing file that is not a page
                self._link(node, self._path(node["reftarget"]), "")
        for node in list(self.document.findall(addnodes.pending_xref)):
            if node.get("reftype") != "myst":
                continue
            if node.get("refdomain") == "doc" and node["reftarget"] not in self.env.found_docs:
                source = self._source_of(node["reftarget"])  # a Markdown file that is not a page (../README.md)
                if source is not None:
                    self._link(node, source, node.get("reftargetid") or "")
            elif node.get("refdomain") is None:  # a target myst did not find: a folder, or nothing
                target, _, fragment = node["reftarget"].partition("#")
                if target and "://" not in target:
                    self._link(node, self._path(target), fragment)

    def _path(self, target: str) -> Path:
        """The file or folder a relative link of the current page names."""
        return Path(self.env.relfn2path(target, self.env.docname)[1])

    def _source_of(self, docname: str) -> Path | None:
        """The file that myst took for a page named ``docname``."""
        for suffix in self.config.source_suffix:
            path = Path(self.env.srcdir, docname + suffix)
            if path.is_file():
                return path
        return None

    def _link(self, node: nodes.Element, path: Path, fragment: str) -> None:
        root = Path(self.config.repo_links_root or Path(self.env.srcdir).parent).resolve()
        resolved = path.resolve()
        shown = node.get("reftarget", "")
        if not resolved.exists() or not resolved.is_relative_to(root):
            logger.warning("link to %r: no such page, nor file or folder of the repository", shown,
                           location=node, type="repo_links", subtype="missing")
            node.replace_self(node.children or [nodes.Text(shown)])
            return
        kind = "tree" if resolved.is_dir() else "blob"
        url = f"{self.config.repo_links_url}/{kind}/{self.config.repo_links_branch}/"
        url += resolved.relative_to(root).as_posix() + (f"#{fragment}" if fragment else "")
        children = node.children if node.astext() else [nodes.literal(shown, shown)]  # <../a.py>: its path
        reference = nodes.reference("", "", *children, refuri=url, internal=False)
        reference.source, reference.line = node.source, node.line
        node.replace_self(reference)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_config_value("repo_links_url", "", "env", str)
    app.add_config_value("repo_links_branch", "main", "env", str)
    app.add_config_value("repo_links_root", "", "env", str)  # default: the folder above the docs' source
    app.add_transform(RepoLinks)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
