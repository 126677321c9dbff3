"""Names of the flat layout's modules that no longer live anywhere, kept for old imports.

The flat layout's ``member_places``, ``epoch_state``, ``shard_index`` and ``placed_shuffle``
had helpers that later work merged into others (:mod:`_moved` finds every other old name
where it lives now). Each one here does what the old one did, through today's code; they
are reached only through the old paths, which warn. Imports happen inside the functions:
this module sits at the top and reaches into the rooms only when an old name is used.
"""

from __future__ import annotations

import importlib
import os
import types
from typing import Any


def file_stamp(stream: Any) -> tuple[int, int] | None:
    """(size, mtime_ns) of an opened local file, else None (was ``member_places.file_stamp``)."""
    from .epochs.places import stat_stamp

    try:
        return stat_stamp(os.fstat(stream.fileno()))
    except (AttributeError, OSError, ValueError):
        return None


def usable_stamp(places: Any, shard: int, url: str, filesize: int | None) -> tuple[int, int] | None:
    """The (size, mtime_ns) of local shard ``shard`` where it can be read by its places, else None
    (was ``member_places.usable_stamp``); a missing shard, or one of another size than the
    index says, raises."""
    from .epochs.placed_reads import open_usable
    from .epochs.places import stat_stamp
    from .limits import get_limits
    from .shards.openers import local_path, url_scheme

    if places.stamp(shard) is None or url_scheme(url) != "file":
        return None
    opened = open_usable(places, shard, url, filesize, get_limits(), revalidate=False)
    if opened is None:
        return None
    opened.close()
    return stat_stamp(os.stat(local_path(url)))


def check_settings(state: Any, settings: Any) -> None:
    """ValueError where ``state`` was saved with other plan settings (was ``epoch_state.check_settings``)."""
    if state.settings is not None and state.settings != settings:
        raise ValueError(f"the state was saved with other plan settings ({state.settings}) than this "
                         f"pipe's ({settings}): seed, batch_size, mode, shuffle, lanes and block must match")


def __getattr__(name: str) -> types.ModuleType:
    if name == "member_places":  # placed_shuffle's ``from . import member_places``
        return importlib.import_module(f"{__package__}.epochs.places")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

