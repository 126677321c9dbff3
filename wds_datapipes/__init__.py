"""Stream WebDataset tar shards into PyTorch through registered DataPipes.

``import wds_datapipes`` is cheap: it loads none of the modules below (and so no torch),
only the two hooks that must be in place early (the flat layout's module paths, and the
watch on torchdata's reading service). The public names load on first use (PEP 562), and
the pipes load all together, registering the functional names (``list_shards``,
``load_tar``, ``group_by_key``, ``decode``, ``decode_batches``, ``shuffle_samples``,
``batch_samples``, ``to_tuple``, ``rename_keys``, ``map_fields``) and the loaders' hooks, as
soon as any of these happens:

- a public name is touched whose module builds on torch (``wd.ShardLister``, ``from
  wds_datapipes import decode`` ...), or any module of ours that does so is imported
  (``from wds_datapipes.shards.listing import ShardLister``, a pickle naming a pipe of ours);
- ``import wds_datapipes`` runs where torch is imported already (``import torch`` first, as
  in a training script: ``IterableWrapper(samples).decode()`` then works with no name of ours
  touched);
- torch is imported after us, and one of the functional names above is first asked of a pipe
  (``IterableWrapper(samples).decode()`` again).

The names that need no torch (:class:`ShardIndex`, :class:`Limits`, the errors, the handlers,
...) load alone: the command line and the writer start without torch.

The hooks: on every pipeline holding a pipe of ours that draws per-epoch orders (and on no
other), ``state_dict``, ``load_state_dict`` and ``set_epoch``, which reach an
:class:`ExactEpochs` or :class:`MixedEpochs` (or the shuffles) upstream. Nothing here imports
torchdata: ``wds_datapipes.MultiProcessingReadingService`` (DataLoader2's, with a fixed worker
loop) imports it when first used, and torchdata's own service is given the same loop for
graphs of our pipes when it is imported (:mod:`wds_datapipes.loaders.dataloader2`).
"""

# To add a public name: add it to its module's entry in _PUBLIC (a new module: a new entry; the
# modules load in this order), to the TYPE_CHECKING imports (what type checkers and readers see)
# and to __all__. tests/test_startup.py checks that the three agree.

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import threading
from typing import TYPE_CHECKING, Any

from . import _moved
from .loaders import dataloader2 as _dataloader2

if TYPE_CHECKING:
    from .cache.layer import CacheSettings, CacheStats, cache_stats, get_cache, set_cache, verify_cache
    from .decoding.batch_decoder import BatchDecoder
    from .decoding.decoder import Decoder
    from .decoding.media import Audio, AudioBatch, AudioSpec, Video, VideoSpec, collate_media
    from .decoding.vision import CenterCrop, RandomResizedCrop
    from .epochs.exact_epochs import ExactEpochs
    from .epochs.index import ShardIndex, ShardInfo, build_index, scan_shard
    from .epochs.mixed_epochs import MixedEpochs
    from .epochs.plan import PlanSettings
    from .epochs.state import EpochState
    from .errors import (
        CacheDirectoryError,
        DecodeError,
        IndexMismatchError,
        NoShardsError,
        SampleError,
        ShardFormatError,
        ShardOpenError,
        ShardReadError,
        WdsError,
    )
    from .handlers import ignore_and_continue, reraise_exception, warn_and_continue
    from .limits import Limits, get_limits, set_limits
    from .pipes.allocator import keep_freed_memory
    from .pipes.batching import Batcher, collate
    from .pipes.fields import FieldMapper, KeyRenamer, TupleMaker
    from .pipes.mixing import RandomMix
    from .pipes.shuffling import Shuffler
    from .shards.grouping import WebDatasetGrouper, split_key
    from .shards.listing import ShardListBase, ShardLister
    from .shards.openers import open_shard, register_opener
    from .shards.tar_loader import TarLoader
    from .shards.wds_gopen import register_with_webdataset
    from .topology import Topology

# module (relative to the package) -> the public names it holds
_PUBLIC: dict[str, tuple[str, ...]] = {
    "decoding.batch_decoder": ("BatchDecoder",),
    "decoding.decoder": ("Decoder",),
    "decoding.media": ("Audio", "AudioBatch", "AudioSpec", "Video", "VideoSpec", "collate_media"),
    "decoding.vision": ("CenterCrop", "RandomResizedCrop"),
    "epochs.exact_epochs": ("ExactEpochs",),
    "epochs.index": ("ShardIndex", "ShardInfo", "build_index", "scan_shard"),
    "epochs.mixed_epochs": ("MixedEpochs",),
    "epochs.plan": ("PlanSettings",),
    "epochs.state": ("EpochState",),
    "errors": ("CacheDirectoryError", "DecodeError", "IndexMismatchError", "NoShardsError", "SampleError",
               "ShardFormatError", "ShardOpenError", "ShardReadError", "WdsError"),
    "handlers": ("ignore_and_continue", "reraise_exception", "warn_and_continue"),
    "limits": ("Limits", "get_limits", "set_limits"),
    "pipes.allocator": ("keep_freed_memory",),
    "pipes.batching": ("Batcher", "collate"),
    "pipes.fields": ("FieldMapper", "KeyRenamer", "TupleMaker"),
    "pipes.mixing": ("RandomMix",),
    "pipes.shuffling": ("Shuffler",),
    "cache.layer": ("CacheSettings", "CacheStats", "cache_stats", "get_cache", "set_cache", "verify_cache"),
    "shards.grouping": ("WebDatasetGrouper", "split_key"),
    "shards.listing": ("ShardListBase", "ShardLister"),
    "shards.openers": ("open_shard", "register_opener"),
    "shards.tar_loader": ("TarLoader",),
    "shards.wds_gopen": ("register_with_webdataset",),
    "topology": ("Topology",),
    "loaders.hooks": (),  # state_dict, load_state_dict, set_epoch on pipelines of ours
}
_HOME = {name: module for module, names in _PUBLIC.items() for name in names}
_DATAPIPE_BASE = "torch.utils.data.datapipes.datapipe"  # torch's IterDataPipe
_FUNCTIONAL_NAMES = frozenset({"list_shards", "load_tar", "group_by_key", "decode", "decode_batches",
                               "shuffle_samples", "batch_samples", "to_tuple", "rename_keys", "map_fields"})
_TORCH_BASE = f"{__name__}.torch_datapipes"  # every pipe of ours builds on it (and so on torch)
_loading = threading.local()  # per thread: modules of ours being imported (depth), loading the pipes
_pipes_loaded = False


def _load_pipes() -> None:
    """Imports every module of :data:`_PUBLIC`: the functional names and the loaders' hooks get registered."""
    global _pipes_loaded
    if _pipes_loaded or getattr(_loading, "pipes", False):
        return
    _loading.pipes = True
    try:
        for module in _PUBLIC:
            importlib.import_module(f"{__name__}.{module}")
    finally:
        _loading.pipes = False
    _pipes_loaded = True


class _PipesOnTorch(importlib.abc.MetaPathFinder):
    """Loads the pipes once the outermost import of a module of ours finishes with our pipe
    base (and so torch) imported: then no module of ours is half imported in this thread."""

    def find_spec(self, fullname: str, path=None, target=None):
        if _pipes_loaded:
            return None
        wrap: type[_CountingLoader]
        if fullname == _DATAPIPE_BASE:
            wrap = _FunctionalNamesLoader
        elif fullname.startswith(f"{__name__}."):
            wrap = _CountingLoader
        else:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = wrap(spec.loader)
                return spec
        return None


class _CountingLoader(importlib.abc.Loader):
    """A module's own loader, counting how deep the imports of our modules are nested."""

    def __init__(self, loader: importlib.abc.Loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        depth = getattr(_loading, "depth", 0)
        _loading.depth = depth + 1
        try:
            self.loader.exec_module(module)
        finally:
            _loading.depth = depth
        if depth == 0 and _TORCH_BASE in sys.modules:
            _load_pipes()

    def __getattr__(self, name: str):  # get_source, get_resource_reader, ...: the module's own loader's
        return getattr(self.loader, name)


class _FunctionalNamesLoader(_CountingLoader):
    """torch's DataPipe base, imported after us: its attribute lookup loads our pipes the first time
    one of our functional names is asked for (``IterableWrapper(samples).decode()``), so a script
    that imports us before torch and touches no name of ours still finds them."""

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        base = module.IterDataPipe
        plain = base.__getattr__

        def __getattr__(pipe, name: str):
            if name in _FUNCTIONAL_NAMES and name not in base.functions:
                _load_pipes()
            return plain(pipe, name)

        base.__getattr__ = __getattr__


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        if _TORCH_BASE in sys.modules:  # the pipes' modules were imported before (not through the finder)
            _load_pipes()
        globals()[name] = value  # found here directly from now on
        return value
    if name == "MultiProcessingReadingService":
        return _dataloader2.reading_service_class()
    if not name.startswith("_") and name.isidentifier():  # a room or module of ours: wd.decoding.SampleDecoder
        spec = importlib.util.find_spec(f"{__name__}.{name}")
        if spec is not None and spec.origin is not None:  # not a moved path (those warn, on import only)
            return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "Audio",
    "AudioBatch",
    "AudioSpec",
    "BatchDecoder",
    "Batcher",
    "CacheDirectoryError",
    "CacheSettings",
    "CacheStats",
    "CenterCrop",
    "DecodeError",
    "Decoder",
    "EpochState",
    "ExactEpochs",
    "FieldMapper",
    "IndexMismatchError",
    "KeyRenamer",
    "Limits",
    "MixedEpochs",
    "MultiProcessingReadingService",
    "NoShardsError",
    "PlanSettings",
    "RandomMix",
    "RandomResizedCrop",
    "SampleError",
    "ShardFormatError",
    "ShardIndex",
    "ShardInfo",
    "ShardListBase",
    "ShardLister",
    "ShardOpenError",
    "ShardReadError",
    "Shuffler",
    "TarLoader",
    "Topology",
    "TupleMaker",
    "Video",
    "VideoSpec",
    "WdsError",
    "WebDatasetGrouper",
    "build_index",
    "cache_stats",
    "collate",
    "collate_media",
    "get_cache",
    "get_limits",
    "ignore_and_continue",
    "keep_freed_memory",
    "open_shard",
    "register_opener",
    "register_with_webdataset",
    "reraise_exception",
    "scan_shard",
    "set_cache",
    "set_limits",
    "split_key",
    "verify_cache",
    "warn_and_continue",
]

_moved.install()  # the flat layout's module paths (wds_datapipes.tar_reader, ...) keep working
_dataloader2.watch_torchdata()  # torchdata's own DataLoader2 reading service, over our pipes, gets the fixed loop
if not any(isinstance(finder, _PipesOnTorch) for finder in sys.meta_path):
    sys.meta_path.insert(0, _PipesOnTorch())
if "torch" in sys.modules:  # torch first, then us: the functional names as soon as we are imported
    _load_pipes()
