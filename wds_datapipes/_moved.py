"""The module paths of the flat layout (``wds_datapipes.tar_reader``, ``wds_datapipes.exact_epochs``, ...).

Before the modules were grouped into rooms, every module sat at the package's top. Code
that imports one of those paths, and pickles that name a class by one
(``wds_datapipes.tar_loader.TarLoader``), keep working: each old path is a module whose
names are looked up where they live now, with one :class:`DeprecationWarning` that
names the new path. The public names stay on the package itself (``wd.ExactEpochs``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

PACKAGE = __name__.rpartition(".")[0]

# old module -> the modules its names moved to, searched in order (_retired: helpers that were merged away)
MOVED: dict[str, tuple[str, ...]] = {
    "batch_decoding": ("decoding.batch_decoder",),
    "batching": ("pipes.batching",),
    "dataloader2_fix": ("loaders.dataloader2",),
    "epoch_plan": ("epochs.plan", "epochs.spans", "epochs.stream"),
    "epoch_state": ("epochs.state", "epochs.plan", "_retired"),
    "exact_epochs": ("epochs.exact_epochs", "epochs.reading", "loaders.hooks", "epochs.epoch_pipe", "epochs.state",
                     "epochs.plan", "topology", "torch_datapipes", "pipe_base", "_retired"),
    "fields": ("pipes.fields",),
    "grouping": ("shards.grouping",),
    "http_stream": ("shards.http_stream",),
    "member_places": ("epochs.places", "epochs.placed_reads", "_retired"),
    "openers": ("shards.openers",),
    "placed_shuffle": ("epochs.placed_shuffle", "epochs.placed_reads", "shards.openers", "_retired"),
    "shard_index": ("epochs.index", "_retired"),
    "shard_listing": ("shards.listing", "topology"),
    "shuffling": ("pipes.shuffling",),
    "tar_loader": ("shards.tar_loader",),
    "tar_reader": ("tar.walk", "tar.headers", "tar.sources", "tar.blocks", "tar.extended", "tar.header_kinds"),
    "vision": ("decoding.vision",),
}


class _MovedModule(types.ModuleType):
    """An old module path: its attributes are those of the modules its names moved to."""

    def __init__(self, name: str, targets: tuple[str, ...]):
        super().__init__(name, f"Moved: see {', '.join(targets)}.")
        self._targets = targets

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        for target in self._targets:
            module = importlib.import_module(target)
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(f"module {self.__name__!r} (moved to {', '.join(self._targets)}) has no attribute "
                             f"{name!r}")


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths, after every other finder (a real module of that name wins)."""

    def find_spec(self, fullname: str, path=None, target=None):
        package, _, name = fullname.rpartition(".")
        if package != PACKAGE or name not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec) -> types.ModuleType:
        name = spec.name.rpartition(".")[2]
        targets = tuple(f"{PACKAGE}.{target}" for target in MOVED[name])
        warnings.warn(f"{spec.name} moved: its names are in {', '.join(targets)}; import them from there (or use the "
                      f"names on {PACKAGE} itself)", DeprecationWarning, stacklevel=2)
        return _MovedModule(spec.name, targets)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install() -> None:
    """Makes the old paths importable (once per process)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
