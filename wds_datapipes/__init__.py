"""Stream WebDataset tar shards into PyTorch through registered DataPipes.

Importing this package registers the functional names: ``list_shards``, ``load_tar``,
``group_by_key``, ``decode``, ``decode_batches``, ``shuffle_samples``, ``batch_samples``, ``to_tuple``,
``rename_keys``, ``map_fields``; and, on every pipeline holding a pipe of ours that draws per-epoch
orders (and on no other), ``state_dict``, ``load_state_dict`` and ``set_epoch``, which reach an
:class:`ExactEpochs` or :class:`MixedEpochs` (or the shuffles) upstream. It imports no torchdata:
``wds_datapipes.MultiProcessingReadingService`` (DataLoader2's, with a fixed worker loop) imports
it when first used, and torchdata's own service is given the same loop for graphs of our
pipes when it is imported (:mod:`wds_datapipes.loaders.dataloader2`).
"""

from . import _moved
from .allocator import keep_freed_memory
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
from .loaders import dataloader2 as _dataloader2
from .loaders import hooks  # noqa: F401 - state_dict, load_state_dict, set_epoch on pipelines of ours
from .pipes.batching import Batcher, collate
from .pipes.fields import FieldMapper, KeyRenamer, TupleMaker
from .pipes.mixing import RandomMix
from .pipes.shuffling import Shuffler
from .shards.cache import CacheSettings, CacheStats, cache_stats, get_cache, set_cache, verify_cache
from .shards.grouping import WebDatasetGrouper, split_key
from .shards.listing import ShardListBase, ShardLister
from .shards.openers import open_shard, register_opener
from .shards.tar_loader import TarLoader
from .shards.wds_gopen import register_with_webdataset
from .topology import Topology

_moved.install()  # the flat layout's module paths (wds_datapipes.tar_reader, ...) keep working
_dataloader2.watch_torchdata()  # torchdata's own DataLoader2 reading service, over our pipes, gets the fixed loop


def __getattr__(name: str):
    if name == "MultiProcessingReadingService":
        from .loaders.dataloader2 import reading_service_class

        return reading_service_class()
    raise AttributeError(f"module 'wds_datapipes' has no attribute {name!r}")


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
