"""The tar format, read sequentially: members of plain or compressed tar streams.

A newcomer's path, bottom up: ``sources`` (the shard's bytes and their decompression),
``blocks`` (the one reusable buffer), ``headers`` and ``extended`` (what a header block,
a PAX record or a sparse map says), ``walk`` (the loop over headers: start here) and
``header_kinds`` (every header the loop does not read inline).
"""

from .walk import iter_tar_index, iter_tar_members, iter_tar_places

__all__ = ["iter_tar_index", "iter_tar_members", "iter_tar_places"]
