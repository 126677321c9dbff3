"""Exceptions raised by wds_datapipes; each names the shard, the member or sample, and the offset.

Each one pickles with its attributes (errors cross process boundaries under DataLoader2),
and each can be built from one ready message: torch's loaders re-raise a worker's error
as ``type(message)``, and this keeps it our type there (its attributes are then None).
"""

from __future__ import annotations

import http.client
import logging
import re
from typing import Any

# What a URL or a command line carries that must not be shown: a password in its user part
# (``https://user:pw@host``), the signature, credential and token parameters of presigned
# URLs (S3's X-Amz-*, GCS's X-Goog-*, Azure SAS ``sig``), and an Authorization header value.
_USER_PASSWORD = re.compile(r"(://[^/@\s:'\"]+:)[^/@\s'\"]+@")
_SECRET_PARAMETER = re.compile(  # a whole parameter name, or its last part after - _ . (X-Amz-Security-Token)
    r"([?&;](?:[^=&\s'\"]*[-_.])?(?:signature|credential|token|secret|password|sig|key|apikey)=)[^&\s'\"]+",
    re.IGNORECASE)
_AUTHORIZATION = re.compile(r"(authorization:\s*)(?:\w+\s+)?[^\s'\"]+", re.IGNORECASE)
# A customer-provided encryption key (S3 SSE-C, Azure CPK) as a header or a store option.
_CUSTOMER_KEY = re.compile(
    r"((?:server-side-encryption-customer-key|x-ms-encryption-key|sse_customer_key_base64|encryption_key)"
    r"(?:-md5|-sha256)?['\"]?\s*[:=]\s*['\"]?)[^\s'\",}]+", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with the secrets a URL or command line may carry replaced by ``***``:
    passwords in URLs, presigned URLs' signatures, credentials and tokens, Authorization
    header values, customer-provided encryption keys (SSE-C, CPK). Every message of our
    errors and of our logger goes through it."""
    text = _USER_PASSWORD.sub(r"\1***@", text)
    text = _SECRET_PARAMETER.sub(r"\1***", text)
    text = _CUSTOMER_KEY.sub(r"\1***", text)
    return _AUTHORIZATION.sub(r"\1***", text)


class _Redacting(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        shown = redact(message)
        if shown != message:
            record.msg, record.args = shown, ()
        return True


for _name in ("wds_datapipes", "aisio"):  # our loggers (a filter is not inherited by child loggers)
    logging.getLogger(_name).addFilter(_Redacting())


class WdsError(Exception):
    """Base class of every error this library raises about data or configuration; its
    message never shows a secret of the URL or command it names (``errors.redact``)."""

    def __init__(self, *args: Any):
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))

    def __reduce__(self) -> tuple[Any, ...]:
        return _restore, (type(self), self.args, self.__dict__)


def _restore(cls: type[WdsError], args: tuple, state: dict) -> WdsError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class ShardOpenError(WdsError):
    """A shard URL could not be opened (missing file, unknown scheme, failed command)."""

    def __init__(self, url: str, reason: str | None = None):
        self.url = url if reason is not None else None
        self.reason = reason
        super().__init__(f"cannot open shard {url!r}: {reason}" if reason is not None else url)


class ShardFormatError(WdsError):
    """A shard's bytes are not a valid (possibly gzipped) tar archive: truncated or corrupt."""

    def __init__(self, url: str, member: str | None = None, offset: int | None = None, reason: str | None = None):
        if reason is None:  # one ready message
            self.url = self.member = self.offset = None
            self.reason = None
            super().__init__(url)
            return
        self.url, self.member, self.offset, self.reason = url, member, offset, reason
        where = f", member {member!r}," if member is not None else ""
        super().__init__(f"shard {url!r}{where} at byte {offset}: {reason}")


class ShardReadError(ShardOpenError):
    """A shard's stream broke while it was read (reset, stalled, cut short) and could not be resumed."""

    def __init__(self, url: str, member: str | None = None, offset: int | None = None, reason: str | None = None):
        if reason is None:  # one ready message
            self.url = self.member = self.offset = self.reason = None
            WdsError.__init__(self, url)
            return
        self.url, self.member, self.offset, self.reason = url, member, offset, reason
        where = f", member {member!r}," if member is not None else ""
        WdsError.__init__(self, f"cannot read shard {url!r}{where} at byte {offset}: {reason}")


# What reading a stream raises when the connection or the command behind it fails.
STREAM_FAILURES = (OSError, EOFError, http.client.HTTPException)


def shard_error(exn: BaseException, url: str, member: str | None = None, offset: int | None = None, *,
                as_format: str | None = None) -> WdsError:
    """The library's own error for ``exn``, raised while opening or reading shard ``url``.

    The one place where foreign exceptions become ours: an I/O failure (a reset, a timeout,
    ``http.client.IncompleteRead``, ...) becomes :class:`ShardReadError`; anything else
    (``MemoryError``, ``OverflowError``, ...) a :class:`ShardFormatError`. Both name the
    shard, the member being read and the offset. ``as_format`` names the data being
    decoded (``"gzip stream"``) where any failure means that data is truncated or corrupt,
    whatever its type (the stdlib's decompressors raise OSError and EOFError for those).
    Our own errors come back unchanged.
    """
    if isinstance(exn, WdsError):
        return exn
    reason = f"{type(exn).__name__}: {exn}"
    if as_format is not None:
        return ShardFormatError(url, member, offset, f"truncated or corrupt {as_format} ({reason})")
    if isinstance(exn, STREAM_FAILURES):
        return ShardReadError(url, member, offset, reason)
    return ShardFormatError(url, member, offset, reason)


class SampleError(WdsError):
    """A sample cannot be assembled or converted (e.g. a suffix repeated within one key)."""

    def __init__(self, url: str, key: str | None = None, reason: str | None = None, member: str | None = None):
        if reason is None:  # one ready message
            self.url = self.key = self.member = self.reason = None
            super().__init__(url)
            return
        self.url, self.key, self.member, self.reason = url, key, member, reason
        where = f", member {member!r}" if member is not None else ""
        super().__init__(f"shard {url!r}, sample {key!r}{where}: {reason}")


class DecodeError(SampleError):
    """A field of a sample could not be decoded."""

    def __init__(self, url: str, key: str | None = None, field: str | None = None, reason: str | None = None):
        self.field = field
        if reason is None:  # one ready message
            super().__init__(url)
            return
        super().__init__(url, key, f"field {field!r}: {reason}")


class IndexMismatchError(ShardFormatError):
    """A shard no longer matches its shard index (another number of samples or bytes)."""

    def __init__(self, message: str):
        self.url = self.member = self.offset = self.reason = None
        WdsError.__init__(self, message)


class ShardWriteError(WdsError):
    """A shard cannot be written, or an input cannot go into one: names the shard, the
    sample's key and the input (a file, a manifest line) where they are known."""

    def __init__(self, reason: str, *, shard: str | None = None, key: str | None = None, source: str | None = None):
        self.reason, self.shard, self.key, self.source = reason, shard, key, source
        where = ", ".join(f"{what} {value!r}" for what, value in (("shard", shard), ("sample", key),
                                                                  ("input", source)) if value is not None)
        super().__init__(f"{where}: {reason}" if where else reason)


class NoShardsError(WdsError):
    """A shard list, or one worker's or rank's part of it, is empty."""


class CacheDirectoryError(WdsError):
    """The shard cache's directory cannot be trusted or used: missing (where it must exist),
    not a directory, owned by another user, or writable by others."""

    def __init__(self, directory: str, reason: str | None = None):
        self.directory = directory if reason is not None else None
        self.reason = reason
        super().__init__(f"shard cache directory {directory!r}: {reason}" if reason is not None else directory)
