"""Writing datasets: sample dicts, folders and manifests in, indexed tar shards out.

``plan`` (pure: which sample goes to which shard, which rank writes which shard),
``shard_file`` (one shard: members copied or encoded into ``<name>.part``, then renamed,
its offsets and member places taken in the same pass), ``progress`` (the frozen, tagged
settings and the shards complete, for resuming; joining the ranks' records into the
index), ``writer`` (``write_shards``: start here), ``destination`` (patterns with a
scheme: shards spooled, uploaded, progress and index kept at the destination),
``sources`` (folder trees, ImageFolder, JSONL/CSV manifests and existing shards as samples).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .progress import WriterSettings, join_index
    from .shard_file import FileBytes
    from .writer import WriteReport, write_shards

# Loaded on first use (PEP 562): ``create --help`` imports .command without the writer and numpy.
_HOME = {"WriterSettings": "progress", "join_index": "progress", "FileBytes": "shard_file",
         "WriteReport": "writer", "write_shards": "writer"}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["FileBytes", "WriteReport", "WriterSettings", "join_index", "write_shards"]
