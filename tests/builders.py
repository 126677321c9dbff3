"""Helpers the tests share for building datasets (fixtures are in conftest.py)."""

from __future__ import annotations

from pathlib import Path

from wds_datapipes import ShardIndex, build_index


def write_index(shards: list[str], path: Path | str, offsets: bool = True, places: bool = False) -> str:
    """Indexes ``shards`` into ``path`` (with sample offsets unless told not to, with member
    places when told to); returns the path."""
    scans = build_index(shards, places=places)
    ShardIndex.from_scans(scans, relative_to=str(path)).save(str(path), offsets=offsets)
    return str(path)
