"""Stream WebDataset tar shards into PyTorch through registered DataPipes.

Importing this package registers the functional names: ``list_shards``, ``load_tar``,
``group_by_key``, ``decode``, ``decode_batches``, ``shuffle_samples``, ``batch_samples``, ``to_tuple``,
``rename_keys``, ``map_fields``.
"""

from . import dataloader2_fix
from .batch_decoding import BatchDecoder
from .batching import Batcher, collate
from .decoding import Decoder
from .errors import (
    DecodeError,
    NoShardsError,
    SampleError,
    ShardFormatError,
    ShardOpenError,
    WdsError,
)
from .fields import FieldMapper, KeyRenamer, TupleMaker
from .grouping import WebDatasetGrouper, split_key
from .handlers import ignore_and_continue, reraise_exception, warn_and_continue
from .openers import open_shard, register_opener
from .shard_listing import ShardListBase, ShardLister
from .shuffling import Shuffler
from .tar_loader import TarLoader

dataloader2_fix.install()

__all__ = [
    "BatchDecoder",
    "Batcher",
    "DecodeError",
    "Decoder",
    "FieldMapper",
    "KeyRenamer",
    "NoShardsError",
    "SampleError",
    "ShardFormatError",
    "ShardListBase",
    "ShardLister",
    "ShardOpenError",
    "Shuffler",
    "TarLoader",
    "TupleMaker",
    "WdsError",
    "WebDatasetGrouper",
    "collate",
    "ignore_and_continue",
    "open_shard",
    "register_opener",
    "reraise_exception",
    "split_key",
    "warn_and_continue",
]
