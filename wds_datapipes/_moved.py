"""Module paths that moved (``wds_datapipes.tar_reader``, ``wds_datapipes.shards.cache``, ...).

Before the modules were grouped into rooms, every module sat at the package's top; later
moves took the allocator into ``pipes`` and the shard cache into a room of its own. Code
that imports an old path, and pickles that name a class by one
(``wds_datapipes.tar_loader.TarLoader``, ``wds_datapipes.shards.cache.CacheSettings``), keep
working: each old path is a module whose names are looked up where they live now, with one
:class:`DeprecationWarning` that names the new path. The public names stay on the package
itself (``wd.ExactEpochs``).

A few helpers of the flat layout were merged into others later; the functions at the end of
this module do what each did, through today's code, and are reached only through the old
paths. Their imports happen inside them: this module sits at the top and reaches into the
rooms only when an old name is used.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
import types
import warnings
from typing import Any

PACKAGE = __name__.rpartition(".")[0]

# old module (relative to the package) -> the modules its names moved to, searched in order
MOVED: dict[str, tuple[str, ...]] = {
    "allocator": ("pipes.allocator",),
    "batch_decoding": ("decoding.batch_decoder",),
    "batching": ("pipes.batching",),
    "dataloader2_fix": ("loaders.dataloader2",),
    "epoch_plan": ("epochs.plan", "epochs.spans", "epochs.stream"),
    "epoch_state": ("epochs.state", "epochs.plan"),
    "exact_epochs": ("epochs.exact_epochs", "epochs.reading", "loaders.hooks", "epochs.epoch_pipe", "epochs.state",
                     "epochs.plan", "topology", "torch_datapipes", "pipe_base"),
    "fields": ("pipes.fields",),
    "grouping": ("shards.grouping",),
    "http_stream": ("shards.http_stream",),
    "member_places": ("epochs.places", "epochs.placed_reads"),
    "openers": ("shards.openers",),
    "placed_shuffle": ("epochs.placed_shuffle", "epochs.placed_reads", "shards.openers"),
    "shard_index": ("epochs.index",),
    "shard_listing": ("shards.listing", "topology"),
    "shards.cache": ("cache.layer",),
    "shards.cache_settings": ("cache.settings",),
    "shards.cache_store": ("cache.store",),
    "shards.cache_streams": ("cache.streams",),
    "shuffling": ("pipes.shuffling",),
    "tar_loader": ("shards.tar_loader",),
    "tar_reader": ("tar.walk", "tar.headers", "tar.sources", "tar.blocks", "tar.extended", "tar.header_kinds"),
    "vision": ("decoding.vision",),
    "_retired": (),  # where the helpers at the end of this module lived before
}

# old module -> its helpers that were merged away (the functions below), looked up after MOVED's modules
RETIRED: dict[str, tuple[str, ...]] = {
    "epoch_state": ("check_settings",),
    "exact_epochs": ("check_settings",),
    "member_places": ("file_stamp", "usable_stamp"),
    "placed_shuffle": ("usable_stamp", "member_places"),
    "shard_index": ("file_stamp",),
    "_retired": ("file_stamp", "usable_stamp", "check_settings", "member_places"),
}


class _MovedModule(types.ModuleType):
    """An old module path: its attributes are those of the modules its names moved to."""

    def __init__(self, name: str, targets: tuple[str, ...], retired: tuple[str, ...] = ()):
        super().__init__(name, f"Moved: see {', '.join(targets) or 'the names on ' + PACKAGE}.")
        self._targets = targets
        self._retired = retired

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        for target in self._targets:
            module = importlib.import_module(target)
            if hasattr(module, name):
                return getattr(module, name)
        if name in self._retired:
            return _retired(name)
        raise AttributeError(f"module {self.__name__!r} (moved to {', '.join(self._targets)}) has no attribute "
                             f"{name!r}")


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths, after every other finder (a real module of that name wins)."""

    def find_spec(self, fullname: str, path=None, target=None):
        if not fullname.startswith(f"{PACKAGE}.") or fullname[len(PACKAGE) + 1:] not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec) -> types.ModuleType:
        old = spec.name[len(PACKAGE) + 1:]
        targets = tuple(f"{PACKAGE}.{target}" for target in MOVED[old])
        warnings.warn(f"{spec.name} moved: its names are in {', '.join(targets) or PACKAGE}; import them from "
                      f"there (or use the names on {PACKAGE} itself)", DeprecationWarning, stacklevel=2)
        return _MovedModule(spec.name, targets, RETIRED.get(old, ()))

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install() -> None:
    """Makes the old paths importable (once per process)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())


# ------------------------------------------------------------ helpers merged away since the flat layout


def _retired(name: str) -> Any:
    if name == "member_places":  # placed_shuffle's ``from . import member_places``
        return importlib.import_module(f"{PACKAGE}.epochs.places")
    return {"file_stamp": file_stamp, "usable_stamp": usable_stamp, "check_settings": check_settings}[name]


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
