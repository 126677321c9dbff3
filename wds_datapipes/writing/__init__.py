"""Writing datasets: sample dicts, folders and manifests in, indexed tar shards out.

``plan`` (pure: which sample goes to which shard, which rank writes which shard),
``shard_file`` (one shard: members copied or encoded into ``<name>.part``, then renamed,
its offsets and member places taken in the same pass), ``progress`` (the frozen, tagged
settings and the shards complete, for resuming; joining the ranks' records into the
index), ``writer`` (``write_shards``: start here), ``destination`` (patterns with a
scheme: shards spooled, uploaded, progress and index kept at the destination),
``sources`` (folder trees, ImageFolder, JSONL/CSV manifests and existing shards as samples).
"""

from .progress import WriterSettings, join_index
from .shard_file import FileBytes
from .writer import WriteReport, write_shards

__all__ = ["FileBytes", "WriteReport", "WriterSettings", "join_index", "write_shards"]
