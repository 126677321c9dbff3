"""``.. rooms:: PACKAGE``: every module of a package, room (subpackage) by room, with what its
docstring's first paragraph says, found by walking the package's files (a new module appears by
itself; only the packages are imported, to see which module names they hold something else under).

Each module gets its ``py:module`` entry here, so that ``:mod:`wds_datapipes.decoding.media``` in a
docstring lands on this page. Only the first paragraphs are shown, with their references as plain
code: the modules' own docstrings name internal functions, which the reference does not document.
Modules named in ``:skip:`` (space-separated last components) are left out.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import types
from pathlib import Path
from typing import Any, ClassVar

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`~?\.?([^`<]+?)(?:\s*<[^>]*>)?`")  # :class:`~a.B` -> ``a.B``


def modules_of(package: str, skip: set[str]) -> dict[str, list[tuple[str, Path]]]:
    """Each room of the package (the package itself first) -> its modules and their files, by name."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ValueError(f"no package {package!r}")
    top = Path(spec.origin).parent
    rooms: dict[str, list[tuple[str, Path]]] = {}
    for init in sorted(top.rglob("__init__.py")):
        room = ".".join((package, *init.parent.relative_to(top).parts))
        if skip & set(room.split(".")) or "__pycache__" in init.parts:
            continue
        rooms[room] = [(room, init)] + [
            (f"{room}.{file.stem}", file) for file in sorted(init.parent.glob("*.py"))
            if file.name != "__init__.py" and file.stem not in skip]
    return rooms


def summary(file: Path) -> list[str]:
    """The first paragraph of the module's docstring, references shown as code."""
    docstring = ast.get_docstring(ast.parse(file.read_text(encoding="utf-8"))) or ""
    first = docstring.strip().split("\n\n")[0]
    return [ROLE.sub(r"``\1``", line) for line in first.splitlines()] if first else ["(no docstring)"]


def shadowed(module: str) -> bool:
    """Whether the package holds something else under the module's name (``wds_datapipes.stats.report``,
    the function): that name's entry is then the public one, and the module gets none here."""
    package, _, name = module.rpartition(".")
    if not package or importlib.util.find_spec(package) is None:
        return False
    value = getattr(importlib.import_module(package), name, None)
    return value is not None and not isinstance(value, types.ModuleType)


class Rooms(SphinxDirective):
    """A section for each room: its modules, each with its entry and first paragraph."""

    required_arguments = 1
    option_spec: ClassVar[dict[str, Any]] = {"skip": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        skip = set(self.options.get("skip", "").split())
        lines: list[str] = []
        for room, modules in modules_of(self.arguments[0], skip).items():
            lines += [f"``{room}``", "-" * (len(room) + 4), ""]
            for module, file in modules:
                self.env.note_dependency(str(file))
                if module != room:
                    lines += [f".. rubric:: ``{module}``", ""]
                lines += [f".. py:module:: {module}", *(["   :no-index:"] if shadowed(module) else []), "",
                          *(f"   {line}" for line in summary(file)), ""]
        holder = nodes.section()
        holder.document = self.state.document
        nested_parse_with_titles(self.state, StringList(lines, source=f"<rooms of {self.arguments[0]}>"), holder)
        return holder.children


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("rooms", Rooms)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
