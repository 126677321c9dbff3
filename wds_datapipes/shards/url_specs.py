"""What a shard URL spec expands to, without I/O: ``::`` joins specs, ``${NAME}`` reads
``WDS_NAME``, braces expand (webdataset's rules). No torch: the writer and the command line
use it; the ``ShardLister`` pipe is :mod:`.listing`."""

from __future__ import annotations

import os
import re

from braceexpand import braceexpand

_VARIABLE = re.compile(r"\$\{(\w+)\}")


def expand_url_spec(spec: str) -> list[str]:
    """Expand one URL spec into shard URLs, without touching the filesystem.

    ``::`` joins several specs (as in webdataset); in each, ``${NAME}`` becomes the
    environment variable ``WDS_NAME`` (webdataset's rule, also inside a variable's value),
    then braces are expanded (``train-{000..009}.tar``). Globs, directories and prefixes
    are expanded later, by the scheme's back end (:func:`~.openers.list_urls`), because that needs I/O.
    """
    urls: list[str] = []
    for part in spec.split("::"):
        part = _substitute_variables(part.strip())
        if part:
            urls.extend(braceexpand(part))
    return urls


def _substitute_variables(spec: str) -> str:
    for _ in range(10):  # webdataset's bound on variables whose values hold variables
        expanded = _VARIABLE.sub(_variable_value, spec)
        if expanded == spec:
            return spec
        spec = expanded
    return spec


def _variable_value(match: re.Match) -> str:
    name = "WDS_" + match.group(1)
    if name not in os.environ:
        raise ValueError(f"shard spec: {match.group(0)} needs the environment variable {name}, which is not set")
    return os.environ[name]
