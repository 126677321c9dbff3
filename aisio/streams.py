"""Opening ``ais://`` objects as sequential streams that ride out dropped connections and node faults.

:class:`AISObjectStream` is what the ``ais`` opener (:mod:`aisio.opener`) reads. It streams
the object body (no temp file, no subprocess) from ``start`` on. When a request or the
body fails (a reset, a timeout, a node that died, a "does not exist" while the cluster
map is changing), the stream asks again from the last byte it returned
(``Range: bytes=N-``), within the retry budget of :mod:`aisio.retry`, so the tar reader
above it sees every byte exactly once.

An ETL travels in the URL: ``ais://bucket/object?etl_name=NAME&etl_args=ARGS`` sends
``etl_name`` / ``etl_args`` with the GET (see :class:`aisio.client.AISUrl`), or, with
``etl_local=``, runs the transform here (see :mod:`aisio.local_etl`).
"""

from __future__ import annotations

import io
import logging
from time import monotonic
from urllib.parse import quote, urlencode

from wds_datapipes.errors import ShardOpenError

from . import rest
from .client import AISUrl, endpoint
from .errors import BROKEN_STREAM, AISReadError, NoAnswer, NodeAnswer, describe_error
from .nodes import ClusterView, retry_reason, view_of
from .retry import Attempts, RetryPolicy

logger = logging.getLogger("aisio")


class AISObjectStream(io.RawIOBase):
    """A read-only, sequential binary stream of one AIS object, from byte ``start``, that
    resumes after dropped connections and node faults.

    The first GET is sent on construction, so a missing bucket, object or ETL raises
    :class:`~wds_datapipes.errors.ShardOpenError` then (within seconds, on a settled
    cluster). A request or body that fails is retried from the next byte to return
    (``Range: bytes=<position>-``) until ``policy.budget_s`` seconds pass without a byte
    (default 60 s; ``$AISIO_RETRY_BUDGET``), or ``max_resume`` resumes (if given); then
    :class:`~aisio.errors.AISReadError` says where, what was tried and what failed. A
    resumed object must keep the version and checksum it had when it was opened. A
    cluster that answers a ranged GET with the whole object (an ETL's output) has the
    part before the position skipped.

    Args:
        url: ``ais://bucket/object[?etl_name=..&etl_args=..]``.
        start: the object's byte to start at (0: the beginning).
        policy: the retry policy (default: :meth:`RetryPolicy.from_env`).
        max_resume: at most this many resumes after the first byte (``None``: the budget decides).
    """

    def __init__(self, url: str, start: int = 0, *, policy: RetryPolicy | None = None,
                 max_resume: int | None = None):
        super().__init__()
        self.url = url
        self.aurl = AISUrl.parse(url)
        if not self.aurl.object:
            raise ShardOpenError(url, "no object name in the URL (expected ais://bucket/object)")
        if not isinstance(start, int) or start < 0:
            raise ShardOpenError(url, f"start must be a byte offset >= 0, got {start!r}")
        self.start = start
        self.policy = policy or RetryPolicy.from_env()
        self.max_resume = max_resume
        self.resumes = 0
        self.node: str | None = None  # the node that serves the current body
        self._endpoint = endpoint()
        self._path = f"/v1/objects/{quote(self.aurl.bucket, safe='')}/{quote(self.aurl.object, safe='/')}"
        query = {"provider": "ais"}
        if self.aurl.etl_name and not self.aurl.etl_local:  # local: open_ais_url runs it, not the cluster
            query["etl_name"] = self.aurl.etl_name
            if self.aurl.etl_args is not None:
                query["etl_args"] = self.aurl.etl_args
        self._query = urlencode(query)
        self._pos = start
        self._size: int | None = None
        self._identity: tuple[str | None, str | None] | None = None
        self._reply: rest.Reply | None = None
        self._attempts = Attempts(self.policy)
        self._last_byte_at = monotonic()
        self._view: ClusterView | None = None
        self._cluster()  # the map as it is now: the targets seen here make later 404s suspect if they go
        self._reply = self._request(opening=True)

    # -- io.RawIOBase

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.closed:
            raise ValueError("I/O operation on a closed AIS stream")
        view = memoryview(buffer).cast("B")
        if not len(view):
            return 0
        while True:
            if self._reply is None:  # the object ended exactly at `start`
                return 0
            try:
                n = self._reply.readinto(view)
            except BROKEN_STREAM as exn:
                self._resume(f"the body from {self._name(self.node)} broke: {type(exn).__name__}: {exn}")
                continue
            if n == 0 and self._size is not None and self._pos < self._size:
                self._resume(f"the body from {self._name(self.node)} ended at byte {self._pos} of {self._size}")
                continue
            self._pos += n
            # ~50 ns per call of up to 1 MiB: the budget counts from the last byte's arrival
            self._last_byte_at = self._reply.stalled_at or monotonic()
            return n

    def close(self) -> None:
        if not self.closed and self._reply is not None:
            self._reply.close()
            self._reply = None
        super().close()

    @property
    def version(self) -> str | None:
        """The object's version and checksum as the cluster gave them (the shard cache keys its
        copy by them), or None."""
        if self._identity is None or self._identity == (None, None):
            return None
        return "/".join(part or "" for part in self._identity)

    @property
    def size(self) -> int | None:
        """The whole object's size in bytes as the cluster said it (``stream_size`` reads it), or None."""
        return self._size

    @property
    def position(self) -> int:
        """The object's byte offset of the next byte to return (``start`` + bytes returned)."""
        return self._pos

    # -- requests

    def _resume(self, why: str) -> None:
        self._reply.close()
        self._reply = None
        if self._pos > self._progress_mark:
            self._attempts.progress(self._last_byte_at)  # bytes arrived since the last failure
        self._progress_mark = self._pos
        if self.max_resume is not None and self.resumes >= self.max_resume:
            raise AISReadError(self.url, self._pos, f"connection lost and {self.resumes} resume(s) failed: {why}")
        self.resumes += 1
        logger.warning("%s: %s; resuming at byte %d", self.url, why, self._pos)
        if not self._attempts.failed(why):
            raise AISReadError(self.url, self._pos, self._gave_up())
        self._reply = self._request(opening=False)

    def _request(self, opening: bool) -> rest.Reply | None:
        """GET from the current position, retrying within the budget; the reply's body starts there."""
        self._progress_mark = self._pos
        while True:
            headers = {"Range": f"bytes={self._pos}-"} if self._pos else {}
            try:
                reply = rest.request("GET", f"{self._endpoint}{self._path}?{self._query}", headers=headers,
                                     timeouts=self._attempts.timeouts())
                self.node = reply.node
                if reply.status in (200, 206):
                    return self._positioned(reply)
                body = rest.read_error_body(reply)
                size = _content_range_total(reply.headers.get("Content-Range"))
                if reply.status == 416 and size == self._pos:
                    return None  # the position is the object's end: an empty stream
                if reply.status == 416 and size is not None:
                    raise self._error(opening, f"byte {self._pos} is beyond the object's end ({size} bytes)")
                answer = NodeAnswer(reply.status, body, self._name(reply.node), f"GET {self.aurl.plain}")
                why = retry_reason(answer, self._cluster(), self._attempts.remaining())
                if why is None:
                    raise self._error(opening, describe_error(answer, self.aurl, self._endpoint))
                failure = f"{answer} ({why})"
            except NoAnswer as exn:
                failure = f"no answer from {self._name(exn.node)}: {exn.cause}"
            except BROKEN_STREAM as exn:  # while skipping to the position in a whole body
                failure = f"the body from {self._name(self.node)} broke: {type(exn).__name__}: {exn}"
            if not self._attempts.failed(failure):
                raise self._error(opening, self._gave_up())
            logger.warning("%s: %s; trying again", self.url, failure)

    def _positioned(self, reply: rest.Reply) -> rest.Reply:
        """Check that ``reply``'s body is this object from the current position, skipping what the
        server sent before it."""
        self._check_identity(reply)
        if reply.status == 206:
            start = _content_range_start(reply.headers.get("Content-Range"))
            if start != self._pos:
                got = reply.headers.get("Content-Range")
                reply.close()
                raise AISReadError(self.url, self._pos, f"asked for bytes {self._pos}-, got {got!r}")
            if self._size is None:
                self._size = _content_range_total(reply.headers.get("Content-Range"))
        else:
            if self._size is None and not reply.headers.get("Content-Encoding"):
                length = reply.headers.get("Content-Length")
                self._size = int(length) if length and length.isdigit() else None
            if self._pos:
                _skip(reply, self._pos)  # the whole body again (the range was ignored)
        return reply

    def _check_identity(self, reply: rest.Reply) -> None:
        identity = (reply.headers.get("Ais-Version"), reply.headers.get("Ais-Checksum-Value"))
        if self._identity is None:
            self._identity = identity
        elif identity != self._identity and None not in identity:
            reply.close()
            raise AISReadError(self.url, self._pos, f"the object changed while it was read ({self._identity} -> {identity})")

    def _cluster(self) -> ClusterView:
        if self._view is None:
            self._view = view_of(self._endpoint, timeout=min(1.0, max(self._attempts.remaining() / 4, 0.05)))
        return self._view

    def _name(self, node: str | None) -> str:
        return self._cluster().name(node) if node else "the cluster"

    def _gave_up(self) -> str:
        return f"no usable answer from the cluster at {self._endpoint}: {self._attempts.summary()}"

    def _error(self, opening: bool, reason: str) -> ShardOpenError:
        if opening and self._pos == self.start:
            return ShardOpenError(self.url, reason)
        return AISReadError(self.url, self._pos, reason)


def _content_range_start(value: str | None) -> int | None:
    # "bytes 5-999/1000"
    try:
        return int(value.split()[1].split("-")[0])
    except (AttributeError, IndexError, ValueError):
        return None


def _content_range_total(value: str | None) -> int | None:
    # "bytes 5-999/1000" or "bytes */1000"
    try:
        total = value.rsplit("/", 1)[1]
        return int(total) if total.isdigit() else None
    except (AttributeError, IndexError):
        return None


def _skip(reply: rest.Reply, count: int) -> None:
    while count:
        chunk = reply.read(min(count, 1 << 20))
        if not chunk:
            raise ConnectionError(f"the body ended {count} bytes before the position to resume at")
        count -= len(chunk)
