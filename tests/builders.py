"""Helpers the tests share for building datasets (fixtures are in conftest.py)."""

from __future__ import annotations

from pathlib import Path

from wds_datapipes import ShardIndex, build_index


def write_index(shards: list[str], path: Path | str, offsets: bool = True) -> str:
    """Indexes ``shards`` into ``path`` (with sample offsets unless told not to); returns the path."""
    ShardIndex.from_scans(build_index(shards), relative_to=str(path)).save(str(path), offsets=offsets)
    return str(path)
