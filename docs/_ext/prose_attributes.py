"""Napoleon, with the docstrings of properties, attributes and values read as prose.

For those, napoleon takes a first line ``text: more`` as ``type: description``, Google's inline
form; ours say what the value is in plain words and the type hint gives the type, so a line such
as "Seconds until ... (None: never)" became a type that no reference finds. Here napoleon reads
them as it reads a method's docstring: the ``Args:`` sections and the rest work as everywhere.
"""

from __future__ import annotations

from typing import Any

from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.ext import napoleon

PROSE = {"property", "attribute", "data"}


def process_docstring(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    napoleon._process_docstring(app, "method" if what in PROSE else what, name, obj, options, lines)


def setup(app: Sphinx) -> dict[str, Any]:
    app.setup_extension("sphinx.ext.napoleon")
    hooked = [listener for listener in app.events.listeners["autodoc-process-docstring"]
              if listener.handler is napoleon._process_docstring]
    if len(hooked) != 1:  # a Sphinx whose napoleon hooks in otherwise: see this module's docstring
        raise ExtensionError("prose_attributes: napoleon's autodoc-process-docstring hook not found")
    app.disconnect(hooked[0].id)
    app.connect("autodoc-process-docstring", process_docstring, priority=hooked[0].priority)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
