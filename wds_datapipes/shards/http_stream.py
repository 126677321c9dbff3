"""Reading ``http(s)://`` shards as sequential streams that survive dropped, reset and stalled connections.

A connection that breaks mid-body (a reset, a chunked body cut mid-chunk, a body that
ends before its Content-Length, a read that stalls past the timeout) is asked for again
from the last byte returned (``Range: bytes=N-``), a bounded number of times with
growing waits, so the tar reader above sees every byte exactly once. A server that
ignores the Range header has the part already read skipped; an object that changed in
between (another ETag or Last-Modified) is an error, never a spliced stream.
"""

from __future__ import annotations

import http.client
import io
import logging
import time
import urllib.error
import urllib.request

from ..errors import STREAM_FAILURES, ShardOpenError, ShardReadError
from ..limits import Limits, get_limits

logger = logging.getLogger("wds_datapipes")

_BACKOFF_S = 0.5  # the first wait; each later one doubles, up to _MAX_BACKOFF_S
_MAX_BACKOFF_S = 8.0
_RETRIED_STATUSES = frozenset({408, 429, 500, 502, 503, 504})  # a busy or restarting server


class HttpStream(io.RawIOBase):
    """A read-only, sequential binary stream of one HTTP(S) object, from byte ``start``.

    The first request is sent on construction: a missing object raises
    :class:`~wds_datapipes.errors.ShardOpenError` at once (HTTP 4xx are not retried).
    ``headers`` are the first response's (``stream_size`` reads the size there).

    Args:
        url: the object's URL.
        start: the first byte to read (a Range request).
        limits: ``http_timeout`` (seconds a connect or read may stall) and
            ``http_retries`` (reconnections per stream before :class:`ShardReadError`).
    """

    def __init__(self, url: str, start: int = 0, limits: Limits | None = None):
        super().__init__()
        limits = limits or get_limits()
        self.url = url
        self.timeout = limits.http_timeout or None
        self.max_retries = limits.http_retries
        self.retries = 0
        self._pos = start
        self._size: int | None = None  # the whole object's size, where the server says it
        self._identity: tuple[str | None, str | None] | None = None
        self._response = self._connect(start, opening=True)
        self.headers = self._response.headers

    # -- io.RawIOBase

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        if not len(view):
            return 0
        while True:
            try:
                # One socket read at most: readinto() would wait to fill the whole buffer, and
                # lose what it had read when the connection then fails.
                data = self._response.read1(len(view))
            except STREAM_FAILURES as exn:  # reset, stalled past the timeout, chunked body cut
                self._reconnect(f"{type(exn).__name__}: {exn}")
                continue
            n = len(data)
            if n == 0 and self._size is not None and self._pos < self._size:
                self._reconnect(f"the body ended at byte {self._pos} of {self._size}")
                continue
            view[:n] = data
            self._pos += n
            return n

    def close(self) -> None:
        if not self.closed:
            _release(self._response)
        super().close()

    @property
    def position(self) -> int:
        """Bytes of the object passed so far (``start`` included)."""
        return self._pos

    # -- requests

    def _connect(self, offset: int, opening: bool = False) -> http.client.HTTPResponse:
        """A response whose body starts at byte ``offset``, retrying what a retry may fix."""
        while True:
            try:
                return self._request(offset)
            except (ShardOpenError, ShardReadError):
                raise
            except urllib.error.HTTPError as exn:
                if exn.code not in _RETRIED_STATUSES:
                    raise self._failure(opening, offset, f"HTTP {exn.code} {exn.reason}") from exn
                why = f"HTTP {exn.code} {exn.reason}"
            except STREAM_FAILURES as exn:  # refused, reset, timed out (URLError is an OSError)
                why = f"{type(exn).__name__}: {exn}"
            self._wait_before_retry(why, offset, opening)

    def _request(self, offset: int) -> http.client.HTTPResponse:
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        response = urllib.request.urlopen(urllib.request.Request(self.url, headers=headers), timeout=self.timeout)
        identity = (response.headers.get("ETag"), response.headers.get("Last-Modified"))
        if self._identity is None:
            self._identity = identity
        elif any(old is not None and new is not None and old != new for old, new in zip(self._identity, identity)):
            _release(response)
            raise ShardReadError(self.url, None, offset, f"the object changed while it was read "
                                                         f"(ETag, Last-Modified: {self._identity} -> {identity})")
        if response.status == 206:
            content_range = response.headers.get("Content-Range") or ""
            first, _, whole = content_range.removeprefix("bytes ").partition("/")
            if first.partition("-")[0] != str(offset):
                _release(response)
                raise ShardReadError(self.url, None, offset, f"asked for bytes {offset}-, got {content_range!r}")
            if self._size is None and whole.isdigit():
                self._size = int(whole)
        else:
            if self._size is None and not response.headers.get("Content-Encoding"):
                length = response.headers.get("Content-Length")
                self._size = int(length) if length and length.isdigit() else None
            if offset:  # the server ignored the Range header: skip what was read before
                _skip(response, offset)
        return response

    def _reconnect(self, why: str) -> None:
        _release(self._response)
        self._wait_before_retry(why, self._pos, opening=False)
        self._response = self._connect(self._pos)

    def _wait_before_retry(self, why: str, offset: int, opening: bool) -> None:
        if self.retries >= self.max_retries:
            reason = f"{why} (gave up after {self.retries} retries; Limits.http_retries)"
            raise self._failure(opening, offset, reason)
        self.retries += 1
        wait = min(_MAX_BACKOFF_S, _BACKOFF_S * 2 ** (self.retries - 1))
        logger.warning("%s: %s; retrying from byte %d in %.1f s (retry %d of %d)",
                       self.url, why, offset, wait, self.retries, self.max_retries)
        time.sleep(wait)

    def _failure(self, opening: bool, offset: int, reason: str) -> ShardOpenError:
        if opening and not offset:
            return ShardOpenError(self.url, reason)
        return ShardReadError(self.url, None, offset, reason)


def _skip(response: http.client.HTTPResponse, count: int) -> None:
    while count:
        chunk = response.read(min(count, 1 << 20))
        if not chunk:
            raise http.client.IncompleteRead(b"", count)  # retried like any cut
        count -= len(chunk)


def _release(response) -> None:
    try:
        response.close()
    except Exception as exn:  # noqa: BLE001 - best effort on a connection that already failed
        logger.debug("closing a broken HTTP response: %s", exn)
