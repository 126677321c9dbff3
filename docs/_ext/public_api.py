"""Checks that the API reference documents every public name, and finds names by their public path.

- Every name in the ``__all__`` of each module in ``public_api_modules`` is documented under that
  module's path (``wds_datapipes.ShardLister``), or the build warns, naming it and the module.
- Everything that autodoc documents has a docstring: an empty one is a warning, not a blank entry
  (with ``:undoc-members:``, so is every public method of a documented class that lacks one). A
  value re-exported by a package gets the ``#:`` comment where it is assigned, not its type's docstring.
- A dataclass field's default factory shows as ``dict()``, not ``<factory>`` (which Sphinx cannot parse).
- A reference by the module that defines a public name (``wds_datapipes.shards.listing.ShardLister``,
  as autodoc writes type hints) resolves to its entry under the public path. Classes get this from
  autodoc's ``:canonical:``; functions and values through ``missing-reference`` here.
- A reference that names an entry by its last components only (``:class:`SampleDecoder``` in a
  module that imports the name, ``:attr:`WriteReport.index```) resolves to the one entry of that
  role's kinds whose path ends so (a type hint's class may also be a type alias: ``Handler``). A
  builtin's name (``bytes``) is never matched this way, and two matches are a warning.
"""

from __future__ import annotations

import builtins
import dataclasses
import importlib
import sys
from typing import Any

from docutils import nodes
from sphinx.addnodes import pending_xref
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.pycode import ModuleAnalyzer
from sphinx.util import logging
from sphinx.util.docstrings import prepare_docstring
from sphinx.util.nodes import make_refnode

logger = logging.getLogger(__name__)


def public_names(app: Sphinx) -> dict[str, list[str]]:
    """Each module of ``public_api_modules`` -> the names in its ``__all__``."""
    return {module: list(importlib.import_module(module).__all__) for module in app.config.public_api_modules}


def _defined_at(app: Sphinx) -> dict[str, str]:
    """The path of the module that defines each public function or value -> its public path."""
    found = getattr(app, "_public_api_defined_at", None)
    if found is None:
        found = {}
        for module, names in public_names(app).items():
            for name in names:
                value = getattr(importlib.import_module(module), name)
                home, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
                if isinstance(home, str) and isinstance(qualname, str) and f"{home}.{qualname}" != f"{module}.{name}":
                    found.setdefault(f"{home}.{qualname}", f"{module}.{name}")
        app._public_api_defined_at = found
    return found


def check_documented(app: Sphinx, env: BuildEnvironment) -> None:
    objects = env.get_domain("py").objects
    for module, names in public_names(app).items():
        for name in names:
            if f"{module}.{name}" not in objects:
                logger.warning("%s.%s is public (in %s.__all__) but has no entry in docs/api/",
                               module, name, module, type="public_api", subtype="undocumented")


def own_docstring(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """A value (``STAGES = (...)``) has no docstring but its type's ("Built-in immutable sequence"):
    it gets the ``#:`` comment above its assignment, in the module of the package that assigns it
    (autodoc looks in the module it is documented under only), or none, which is then a warning."""
    if what != "data" or not _is_type_docstring(obj, lines):
        return
    module, _, attribute = name.rpartition(".")
    found = []
    for candidate in sorted(m for m in sys.modules if m == module or m.startswith(f"{module}.")):
        if getattr(sys.modules[candidate], attribute, None) is obj:
            comment = ModuleAnalyzer.for_module(candidate).find_attr_docs().get(("", attribute))
            if comment and list(comment) not in found:
                found.append(list(comment))
    lines[:] = found[0] if len(found) == 1 else []


def _is_type_docstring(obj: Any, lines: list[str]) -> bool:
    own = [line for line in prepare_docstring(type(obj).__doc__ or "") if line.strip()]
    return bool(own) and [line for line in lines if line.strip()] == own


def check_docstring(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    if what != "module" and not any(line.strip() for line in lines):
        logger.warning("%s (%s) has no docstring", name, what, location=app.env.docname,
                       type="public_api", subtype="no_docstring")


def factory_defaults(app: Sphinx, what: str, name: str, obj: Any, options: Any, signature: str | None,
                     return_annotation: str | None) -> tuple[str | None, str | None] | None:
    """A dataclass field's ``default_factory`` shows as ``dict()`` where Python's signature says
    ``<factory>``, which Sphinx cannot parse (the whole signature then shows as raw text)."""
    if not signature or "<factory>" not in signature or not dataclasses.is_dataclass(obj):
        return None
    factories = [f.default_factory for f in dataclasses.fields(obj)
                 if f.init and f.default_factory is not dataclasses.MISSING]
    if signature.count("<factory>") != len(factories):
        return None
    for factory in factories:
        signature = signature.replace("<factory>", f"{getattr(factory, '__qualname__', 'factory')}()", 1)
    return signature, return_annotation


def by_public_path(app: Sphinx, env: BuildEnvironment, node: pending_xref,
                   contnode: nodes.TextElement) -> nodes.reference | None:
    if node.get("refdomain") != "py":
        return None
    domain, target = env.get_domain("py"), node["reftarget"]
    public = _defined_at(app).get(target)
    if public is not None:
        return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], public, node, contnode)
    if node.get("refspecific") or hasattr(builtins, target):
        return None
    kinds = set(domain.objtypes_for_role(node["reftype"]) or ())
    if node["reftype"] == "class":
        kinds.add("data")  # a type alias, named in a type hint
    matches = sorted(name for name, entry in domain.objects.items()
                     if name.endswith(f".{target}") and entry.objtype in kinds and not entry.aliased)
    if len(matches) > 1:
        logger.warning("%r could be any of %s: name it by its whole path", target, ", ".join(matches),
                       location=node, type="public_api", subtype="ambiguous")
    if len(matches) != 1:
        return None
    entry = domain.objects[matches[0]]
    return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, matches[0])


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_config_value("public_api_modules", [], "env", list)
    app.connect("env-check-consistency", check_documented)
    app.connect("autodoc-process-docstring", own_docstring, priority=400)  # before napoleon and the check
    app.connect("autodoc-process-docstring", check_docstring, priority=600)
    app.connect("autodoc-process-signature", factory_defaults)
    app.connect("missing-reference", by_public_path)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
