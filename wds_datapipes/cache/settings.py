"""The shard cache's settings: where shards are cached, and how much they may take (see :mod:`.layer`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CacheSettings", "parse_size"]


@dataclass(frozen=True)
class CacheSettings:
    """Where shards are cached, and how much they may take.

    Attributes:
        directory: the cache directory, shared by every worker and rank of the machine (a
            local disk: not a network filesystem).
        limit: bytes the cached shards (complete and downloading) may take at most.
        local: which local paths are cached: ``"network"`` (those on NFS, CIFS, Lustre, FUSE
            mounts, ...; default), ``"all"`` or ``"none"``.
        revalidate: check a cached shard against its source when it is opened (a HEAD
            request for HTTP and AIS, a stat for files): True (default) at every opening,
            False never, a number of seconds: at most once in that long per shard on the
            machine (the time of the last check is in the ledger). ``pipe:`` shards
            cannot be asked: their entry is trusted.
    """

    directory: str
    limit: int
    local: str = "network"
    revalidate: bool | float = True

    def __post_init__(self):
        if self.local not in ("network", "all", "none"):
            raise ValueError(f"CacheSettings.local must be 'network', 'all' or 'none', not {self.local!r}")
        if self.limit < 0:
            raise ValueError(f"CacheSettings.limit must be >= 0, not {self.limit}")
        if not isinstance(self.revalidate, (bool, int, float)) or self.revalidate < 0:
            raise ValueError(f"CacheSettings.revalidate must be True, False or seconds >= 0, not {self.revalidate!r}")

    @property
    def check_after(self) -> float | None:
        """Seconds after its last check that a cached shard is checked again (never if None)."""
        if isinstance(self.revalidate, bool):
            return 0.0 if self.revalidate else None
        return float(self.revalidate)


def parse_size(text: str | int) -> int:
    """Bytes from ``"200GB"``, ``"1.5 TiB"``, ``"500M"`` or a plain number (GB = 10**9, GiB = 2**30)."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9.]+)\s*([kmgtp]?)(i?)b?\s*", str(text).lower())
    if not match:
        raise ValueError(f"not a size: {text!r} (say e.g. '200GB', '500MiB' or a number of bytes)")
    base = 1024 if match[3] else 1000
    return int(float(match[1]) * base ** " kmgtp".index(match[2] or " "))
