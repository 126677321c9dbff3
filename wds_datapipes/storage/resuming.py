"""One resuming stream for every remote object: byte-exact resume, identity, Range checks, stall timeout.

:class:`ResumingStream` reads one object sequentially from byte ``start``. When a request
or the body fails in a way the back end calls retryable (a reset, a timeout, a body that
ends before the object's size, a 5xx), it asks again from the next byte to return, within
the :class:`~wds_datapipes.storage.retry.RetryPolicy`, so the reader above sees every byte
once or a clear error. The HTTP (``shards/http_stream.py``), AIS (``aisio/streams.py``)
and object-store streams are subclasses; each supplies only how to ask.
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from time import monotonic
from typing import Any

from ..errors import ShardOpenError, ShardReadError
from .retry import Attempts, RetryPolicy

logger = logging.getLogger("wds_datapipes")

_SKIP_CHUNK = 1 << 20


@dataclass
class Opened:
    """What one request gave: the body and what the answer said of the object.

    Attributes:
        body: the open body: ``readinto(view) -> int`` (or what the stream's ``_read_body``
            reads), ``read(n)``, ``close()``; None when the object ends exactly at the
            offset asked for (an empty rest).
        first: the object's byte the body starts at as the answer says it (a Content-Range's
            first byte); None when the body is the whole object (the server ignored the Range).
        size: the whole object's size in bytes, or None where the answer does not tell.
        version: the object's version (ETag, generation, ...), or None.
        about: how the answer described its range, for errors (the Content-Range header).
    """

    body: Any
    first: int | None
    size: int | None
    version: str | None
    about: str | None = None


class Body:
    """A response body read with ``readinto`` (subclasses give it); ``read`` is made from it."""

    def readinto(self, view: memoryview) -> int:
        raise NotImplementedError

    def read(self, size: int) -> bytes:
        buffer = bytearray(size)
        n = self.readinto(memoryview(buffer))
        return bytes(buffer[:n])


class BodyCut(ConnectionError):
    """A body that ended before the bytes it had to give: retried like any dropped connection."""


class ResumingStream(io.RawIOBase):
    """A read-only, sequential binary stream of one remote object, from byte ``start``, that
    resumes at the exact byte after a dropped connection, a retryable answer or a stall.

    The first request is sent on construction, so a missing object raises
    :class:`~wds_datapipes.errors.ShardOpenError` at once (a failure the subclass calls
    retryable is retried first). Later failures raise :class:`ShardReadError` naming the
    URL, the byte reached, what failed and how often it was tried.

    What the base does, for every subclass:

    - **resume**: a body that raises a retryable error, or ends (``0`` bytes) before the
      object's known size, is asked for again from :attr:`position`;
    - **retry**: one :class:`~wds_datapipes.storage.retry.Attempts` loop per stream; bytes
      that arrived since the last failure restart its budget;
    - **identity**: the first answer's ``size`` and ``version`` are the object's; an answer
      whose size or version differs (both known) is :class:`ShardReadError` "the object
      changed while it was read", never a spliced stream;
    - **range**: an answer that starts at another byte than asked for is an error; one that
      sends the whole object (the server ignored the Range) has the bytes before the
      position read and dropped;
    - **stall**: :meth:`timeouts` gives the (connect, read) timeouts a request must use; a
      body read that stalls past the read timeout must raise a retryable error.

    The contract of a subclass:

    - set its own attributes, then call ``super().__init__(url, start, policy)`` (it sends
      the first request);
    - ``_request(offset) -> Opened``: ask for the object from byte ``offset`` (a Range
      request when ``offset > 0``) and return the body with what the answer says of the
      object (:class:`Opened`). Raise for a failed answer: anything :meth:`_retryable`
      accepts is retried, anything else ends the stream with :meth:`_describe`'s words; a
      :class:`~wds_datapipes.errors.ShardOpenError` (or subclass) is raised as it is.
    - ``_retryable(exn) -> bool``: whether a request or body failure may be retried;
    - optionally ``_describe(exn)`` (words for a failure), ``_read_body(body, view)`` (one
      read of at most ``len(view)`` bytes, returning what one network read gave; default
      ``body.readinto(view)``), ``_same_version(old, new)``, ``_retry_after(exn)`` (the
      seconds a failed answer's ``Retry-After`` asked for; default its ``retry_after``
      attribute), ``_source()`` (who served the
      body, for messages), ``_read_error(reason)`` (the error type), ``_gave_up(why)``.

    A body may carry ``stalled_at`` (a ``time.monotonic()`` value): the time its last bytes
    really came, where a read returned them late; the budget counts from then.

    Args:
        url: the object's URL (errors name it).
        start: the first byte to read.
        policy: the retry policy (default: :meth:`RetryPolicy.for_limits`).
        max_resumes: at most this many resumes after the first answer (None: the policy decides).
    """

    _opened: Opened | None = None
    logger = logger  # where resumes and retries are logged (a back end may use its own logger)

    def __init__(self, url: str, start: int = 0, policy: RetryPolicy | None = None, *,
                 max_resumes: int | None = None):
        super().__init__()
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise ShardOpenError(url, f"start must be a byte offset >= 0, got {start!r}")
        self.url = url
        self.start = start
        self.policy = policy or RetryPolicy.for_limits()
        self.max_resumes = max_resumes
        self.resumes = 0
        self._pos = start
        self._size: int | None = None
        self._version: str | None = None
        self._identified = False
        self._attempts = Attempts(self.policy)
        self._last_byte_at = monotonic()
        self._progress_mark = start
        self._opened = self._connect(opening=True)

    # -- what a subclass supplies

    def _request(self, offset: int) -> Opened:
        raise NotImplementedError

    def _retryable(self, exn: BaseException) -> bool:
        raise NotImplementedError

    def _describe(self, exn: BaseException) -> str:
        return f"{type(exn).__name__}: {exn}"

    def _read_body(self, body: Any, view: memoryview) -> int:
        return body.readinto(view)

    def _same_version(self, old: str, new: str) -> bool:
        return old == new

    def _retry_after(self, exn: BaseException) -> float | None:
        """The seconds a failed answer asked to wait before the next try (its ``Retry-After``), or None."""
        value = getattr(exn, "retry_after", None)
        return value if isinstance(value, (int, float)) else None

    def _source(self) -> str:
        return "the body"

    def _read_error(self, reason: str) -> ShardReadError:
        return ShardReadError(self.url, None, self._pos, reason)

    def _gave_up(self, why: str) -> str:
        return self._attempts.gave_up(why)

    # -- io.RawIOBase

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.closed:
            raise ValueError(f"I/O operation on a closed stream of {self.url}")
        view = memoryview(buffer).cast("B")
        if not len(view):
            return 0
        while True:
            if self._opened is None or self._opened.body is None:  # the object ended at the position
                return 0
            body = self._opened.body
            try:
                n = self._read_body(body, view)
            except Exception as exn:
                if not (isinstance(exn, BodyCut) or self._retryable(exn)):
                    raise
                self._resume(f"{self._source()} broke: {self._describe(exn)}")
                continue
            n = n or 0
            if n == 0 and self._size is not None and self._pos < self._size:
                self._resume(f"{self._source()} ended at byte {self._pos} of {self._size}")
                continue
            self._pos += n
            # The budget counts from the last byte's arrival (~50 ns per call of up to 1 MiB).
            self._last_byte_at = getattr(body, "stalled_at", None) or monotonic()
            return n

    def close(self) -> None:
        if not self.closed:
            self._release()
        super().close()

    @property
    def position(self) -> int:
        """The object's byte offset of the next byte to return (``start`` + bytes returned)."""
        return self._pos

    @property
    def size(self) -> int | None:
        """The whole object's size in bytes as the source said it (``stream_size`` reads it), or None."""
        return self._size

    @property
    def version(self) -> str | None:
        """The object's version as the first answer gave it (the shard cache and the index stamp by it), or None."""
        return self._version

    def timeouts(self) -> tuple[float, float]:
        """(connect, read) timeouts the next request must use: the policy's, cut to the budget
        left (``inf``: none); the read timeout is the stall timeout of the body."""
        return self._attempts.timeouts()

    # -- requests

    def _resume(self, why: str) -> None:
        self._release()
        if self._pos > self._progress_mark:
            self._attempts.progress(self._last_byte_at)  # bytes arrived since the last failure
        self._progress_mark = self._pos
        if self.max_resumes is not None and self.resumes >= self.max_resumes:
            raise self._read_error(f"connection lost and {self.resumes} resume(s) failed: {why}")
        self.resumes += 1
        self.logger.warning("%s: %s; resuming at byte %d", self.url, why, self._pos)
        if not self._attempts.failed(why):
            raise self._read_error(self._gave_up(why))
        self._opened = self._connect(opening=False)

    def _connect(self, opening: bool) -> Opened:
        """An answer whose body starts at the position, retrying what a retry may fix."""
        self._progress_mark = self._pos
        while True:
            try:
                return self._positioned(self._request(self._pos))
            except ShardOpenError:
                raise
            except Exception as exn:
                why, asked = self._describe(exn), self._retry_after(exn)
                if not (isinstance(exn, BodyCut) or self._retryable(exn)):
                    raise self._error(opening, why) from exn
            if not self._attempts.failed(why, asked):
                raise self._error(opening, self._gave_up(why))
            self.logger.warning("%s: %s; trying again from byte %d", self.url, why, self._pos)

    def _positioned(self, opened: Opened) -> Opened:
        """Check that ``opened``'s body is this object from the position, skipping what the
        server sent before it."""
        offset = self._pos
        try:
            self._check_identity(opened)
            if opened.body is None:
                return opened
            if opened.first is not None and opened.first != offset:
                raise self._read_error(f"asked for bytes {offset}-, got {opened.about or f'bytes {opened.first}-'!r}")
            if opened.first is None and offset:  # the whole object again: the Range was ignored
                missing = skip(opened.body, offset)
                if missing:
                    raise BodyCut(f"the body ended {missing} bytes before byte {offset} to resume at")
        except BaseException:
            _close(opened.body)
            raise
        return opened

    def _check_identity(self, opened: Opened) -> None:
        if not self._identified:
            self._identified = True
            self._size, self._version = opened.size, opened.version
            return
        changed = []
        if self._size is not None and opened.size is not None and opened.size != self._size:
            changed.append(f"size {self._size} -> {opened.size}")
        if (self._version is not None and opened.version is not None
                and not self._same_version(self._version, opened.version)):
            changed.append(f"version {self._version} -> {opened.version}")
        if changed:
            raise self._read_error(f"the object changed while it was read ({', '.join(changed)})")
        if self._size is None:
            self._size = opened.size

    def _error(self, opening: bool, reason: str) -> ShardOpenError:
        if opening and self._pos == self.start:
            return ShardOpenError(self.url, reason)
        return self._read_error(reason)

    def _release(self) -> None:
        opened, self._opened = self._opened, None
        if opened is not None:
            _close(opened.body)


def skip(stream: Any, count: int) -> int:
    """Read and drop ``count`` bytes of ``stream``; returns how many were missing (0: all were there)."""
    while count > 0:
        chunk = stream.read(min(count, _SKIP_CHUNK))
        if not chunk:
            return count
        count -= len(chunk)
    return 0


def http_opened(body: Any, status: int, headers, version: str | None) -> Opened:
    """What an HTTP answer of ``status`` 200 or 206 says of its body: a 206 where its
    Content-Range starts and the whole size; a 200 the whole object, its size the
    Content-Length (unless the body is encoded: then the length is not the object's)."""
    if status == 206:
        first, _, total = content_range(headers.get("Content-Range"))
        return Opened(body, -1 if first is None else first, total, version, headers.get("Content-Range"))
    length = headers.get("Content-Length")
    size = int(length) if length and length.isdigit() and not headers.get("Content-Encoding") else None
    return Opened(body, None, size, version)


def content_range(value: str | None) -> tuple[int | None, int | None, int | None]:
    """(first, last, total) of a ``Content-Range`` value (``bytes 5-999/1000``, ``bytes */1000``),
    each None where it is absent or unreadable."""
    if not value:
        return None, None, None
    unit, _, rest = value.strip().partition(" ")
    if unit.lower() != "bytes":
        return None, None, None
    span, _, whole = rest.strip().partition("/")
    first, _, last = span.partition("-")
    return _number(first), _number(last), _number(whole)


def _number(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def _close(body: Any) -> None:
    if body is None:
        return
    try:
        body.close()
    except Exception as exn:  # noqa: BLE001 - best effort on a connection that already failed
        logger.debug("closing a broken body: %s", exn)
