"""Exceptions raised by wds_datapipes; each names the shard, the member and the offset."""

from __future__ import annotations


class WdsError(Exception):
    """Base class of every error this library raises about data or configuration."""


class ShardOpenError(WdsError):
    """A shard URL could not be opened (missing file, unknown scheme, failed command)."""

    def __init__(self, url: str, reason: str):
        self.url = url
        self.reason = reason
        super().__init__(f"cannot open shard {url!r}: {reason}")


class ShardFormatError(WdsError):
    """A shard's bytes are not a valid (possibly gzipped) tar archive: truncated or corrupt."""

    def __init__(self, url: str, member: str | None, offset: int, reason: str):
        self.url = url
        self.member = member
        self.offset = offset
        self.reason = reason
        where = f", member {member!r}," if member is not None else ""
        super().__init__(f"shard {url!r}{where} at byte {offset}: {reason}")


class SampleError(WdsError):
    """A sample cannot be assembled or converted (e.g. a suffix repeated within one key)."""

    def __init__(self, url: str, key: str, reason: str, member: str | None = None):
        self.url = url
        self.key = key
        self.member = member
        self.reason = reason
        where = f", member {member!r}" if member is not None else ""
        super().__init__(f"shard {url!r}, sample {key!r}{where}: {reason}")


class DecodeError(SampleError):
    """A field of a sample could not be decoded."""

    def __init__(self, url: str, key: str, field: str, reason: str):
        self.field = field
        super().__init__(url, key, f"field {field!r}: {reason}")


class NoShardsError(WdsError):
    """A shard list, or one worker's or rank's part of it, is empty."""
