"""Reading ``http(s)://`` shards as sequential streams that survive dropped, reset and stalled connections.

:class:`HttpStream` is a :class:`~wds_datapipes.storage.resuming.ResumingStream`: a
connection that breaks mid-body (a reset, a chunked body cut mid-chunk, a body that ends
before its Content-Length, a read that stalls past ``Limits.http_timeout``) is asked for
again from the last byte returned (``Range: bytes=N-``), up to ``Limits.http_retries``
times in a row without a byte arriving, with growing waits, so the tar reader above sees
every byte exactly once. A server that ignores the Range header has the part already read
skipped; an object that changed in between (another ETag or Last-Modified, another size)
is an error, never a spliced stream.
"""

from __future__ import annotations

import http.client
import logging
import math
import urllib.error
import urllib.request

from ..errors import STREAM_FAILURES, ShardOpenError, ShardReadError  # noqa: F401 - names kept for old imports
from ..limits import Limits, get_limits
from ..storage.resuming import Opened, ResumingStream, http_opened
from ..storage.retry import RetryPolicy, retry_after

logger = logging.getLogger("wds_datapipes")

_BACKOFF_S = 0.5  # the first wait; each later one doubles, up to _MAX_BACKOFF_S
_MAX_BACKOFF_S = 8.0
_RETRIED_STATUSES = frozenset({408, 429, 500, 502, 503, 504})  # a busy or restarting server


class HttpStream(ResumingStream):
    """A read-only, sequential binary stream of one HTTP(S) object, from byte ``start``.

    The first request is sent on construction: a missing object raises
    :class:`~wds_datapipes.errors.ShardOpenError` at once (HTTP 4xx are not retried).
    ``headers`` are the first response's; ``size`` and ``version`` (the ETag, else the
    Last-Modified) are the object's.

    Args:
        url: the object's URL.
        start: the first byte to read (a Range request).
        limits: ``http_timeout`` (seconds a connect or read may stall) and ``http_retries``
            (reconnections in a row without a byte arriving before :class:`ShardReadError`).
    """

    def __init__(self, url: str, start: int = 0, limits: Limits | None = None):
        self.headers: http.client.HTTPMessage | None = None
        policy = RetryPolicy.for_limits(limits or get_limits(), first_wait_s=_BACKOFF_S, max_wait_s=_MAX_BACKOFF_S)
        super().__init__(url, start, policy)

    def _request(self, offset: int) -> Opened:
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        timeout = self.timeouts()[1]
        response = urllib.request.urlopen(urllib.request.Request(self.url, headers=headers),
                                          timeout=timeout if math.isfinite(timeout) else None)
        said = response.headers
        if self.headers is None:
            self.headers = said
        return http_opened(response, response.status, said, said.get("ETag") or said.get("Last-Modified"))

    def _read_body(self, body: http.client.HTTPResponse, view: memoryview) -> int:
        # One socket read at most: readinto() would wait to fill the whole buffer, and lose
        # what it had read when the connection then fails.
        data = body.read1(len(view))
        view[: len(data)] = data
        return len(data)

    def _retryable(self, exn: BaseException) -> bool:
        if isinstance(exn, urllib.error.HTTPError):
            return exn.code in _RETRIED_STATUSES
        return isinstance(exn, STREAM_FAILURES)  # refused, reset, timed out (URLError is an OSError)

    def _retry_after(self, exn: BaseException) -> float | None:
        if isinstance(exn, urllib.error.HTTPError) and exn.headers is not None:
            return retry_after(exn.headers.get("Retry-After"))
        return None

    def _describe(self, exn: BaseException) -> str:
        if isinstance(exn, urllib.error.HTTPError):
            return f"HTTP {exn.code} {exn.reason}"
        return super()._describe(exn)
