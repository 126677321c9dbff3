"""Opening ``ais://`` objects as sequential streams that ride out dropped connections and node faults.

:class:`AISObjectStream` is what the ``ais`` opener (:mod:`aisio.opener`) reads. It streams
the object body (no temp file, no subprocess) from ``start`` on. When a request or the
body fails (a reset, a timeout, a node that died, a "does not exist" while the cluster
map is changing), the stream asks again from the last byte it returned
(``Range: bytes=N-``), within the retry budget of :mod:`aisio.retry`, so the tar reader
above it sees every byte exactly once. The resume, identity and Range checks are
:class:`~wds_datapipes.storage.resuming.ResumingStream`'s; this module says how to ask.

An ETL travels in the URL: ``ais://bucket/object?etl_name=NAME&etl_args=ARGS`` sends
``etl_name`` / ``etl_args`` with the GET (see :class:`aisio.client.AISUrl`), or, with
``etl_local=``, runs the transform here (see :mod:`aisio.local_etl`).
"""

from __future__ import annotations

import logging
from urllib.parse import quote, urlencode

from wds_datapipes.errors import ShardOpenError
from wds_datapipes.storage.resuming import Opened, ResumingStream, content_range, http_opened

from . import rest
from .client import AISUrl, endpoint
from .errors import BROKEN_STREAM, AISReadError, NoAnswer, NodeAnswer, describe_error
from .nodes import ClusterView, retry_reason, view_of
from .retry import RetryPolicy

logger = logging.getLogger("aisio")


class _Answer(Exception):
    """A node's error answer, in words, and whether another try may fix it."""

    def __init__(self, reason: str, retry: bool):
        super().__init__(reason)
        self.retry = retry


class AISObjectStream(ResumingStream):
    """A read-only, sequential binary stream of one AIS object, from byte ``start``, that
    resumes after dropped connections and node faults.

    The first GET is sent on construction, so a missing bucket, object or ETL raises
    :class:`~wds_datapipes.errors.ShardOpenError` then (within seconds, on a settled
    cluster). A request or body that fails is retried from the next byte to return
    (``Range: bytes=<position>-``) until ``policy.budget_s`` seconds pass without a byte
    (default 60 s; ``$AISIO_RETRY_BUDGET``), or ``max_resume`` resumes (if given); then
    :class:`~aisio.errors.AISReadError` (a :class:`~wds_datapipes.errors.ShardReadError`)
    says where, what was tried and what failed. A resumed object must keep the version and
    checksum it had when it was opened. A cluster that answers a ranged GET with the whole
    object (an ETL's output) has the part before the position skipped.

    Args:
        url: ``ais://bucket/object[?etl_name=..&etl_args=..]``.
        start: the object's byte to start at (0: the beginning).
        policy: the retry policy (default: :meth:`RetryPolicy.from_env`).
        max_resume: at most this many resumes after the first byte (``None``: the budget decides).
    """

    logger = logger

    def __init__(self, url: str, start: int = 0, *, policy: RetryPolicy | None = None,
                 max_resume: int | None = None):
        self.url = url
        self.aurl = AISUrl.parse(url)
        if not self.aurl.object:
            raise ShardOpenError(url, "no object name in the URL (expected ais://bucket/object)")
        self.node: str | None = None  # the node that serves the current body
        self._endpoint = endpoint()
        self._path = f"/v1/objects/{quote(self.aurl.bucket, safe='')}/{quote(self.aurl.object, safe='/')}"
        query = {"provider": "ais"}
        if self.aurl.etl_name and not self.aurl.etl_local:  # local: open_ais_url runs it, not the cluster
            query["etl_name"] = self.aurl.etl_name
            if self.aurl.etl_args is not None:
                query["etl_args"] = self.aurl.etl_args
        self._query = urlencode(query)
        self._view: ClusterView | None = None
        super().__init__(url, start, policy or RetryPolicy.from_env(), max_resumes=max_resume)

    @property
    def max_resume(self) -> int | None:
        """At most this many resumes after the first byte (None: the retry budget decides)."""
        return self.max_resumes

    # -- how to ask (ResumingStream's contract)

    def _request(self, offset: int) -> Opened:
        self._cluster()  # the map as it is now: the targets seen here make later 404s suspect if they go
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        reply = rest.request("GET", f"{self._endpoint}{self._path}?{self._query}", headers=headers,
                             timeouts=self.timeouts())
        self.node = reply.node
        said = reply.headers
        if reply.status in (200, 206):
            identity = (said.get("Ais-Version"), said.get("Ais-Checksum-Value"))
            version = None if identity == (None, None) else "/".join(part or "" for part in identity)
            return http_opened(reply, reply.status, said, version)
        body = rest.read_error_body(reply)
        size = content_range(said.get("Content-Range"))[2]
        if reply.status == 416 and size == offset:
            reply.close()
            return Opened(None, offset, size, None)  # the position is the object's end: an empty rest
        if reply.status == 416 and size is not None:
            raise _Answer(f"byte {offset} is beyond the object's end ({size} bytes)", retry=False)
        answer = NodeAnswer(reply.status, body, self._name(reply.node), f"GET {self.aurl.plain}")
        why = retry_reason(answer, self._cluster(), self._attempts.remaining())
        if why is None:
            raise _Answer(describe_error(answer, self.aurl, self._endpoint), retry=False)
        raise _Answer(f"{answer} ({why})", retry=True)

    def _retryable(self, exn: BaseException) -> bool:
        if isinstance(exn, _Answer):
            return exn.retry
        return isinstance(exn, (NoAnswer, *BROKEN_STREAM))

    def _describe(self, exn: BaseException) -> str:
        if isinstance(exn, _Answer):
            return str(exn)
        if isinstance(exn, NoAnswer):
            return f"no answer from {self._name(exn.node)}: {exn.cause}"
        return f"{type(exn).__name__}: {exn}"

    def _source(self) -> str:
        return f"the body from {self._name(self.node)}"

    def _same_version(self, old: str, new: str) -> bool:
        return "" in new.split("/") or old == new  # a part missing: nothing to compare

    def _read_error(self, reason: str) -> AISReadError:
        return AISReadError(self.url, self._pos, reason)

    def _gave_up(self, why: str) -> str:
        return f"no usable answer from the cluster at {self._endpoint}: {self._attempts.summary()}"

    # -- the cluster

    def _cluster(self) -> ClusterView:
        if self._view is None:
            self._view = view_of(self._endpoint, timeout=min(1.0, max(self._attempts.remaining() / 4, 0.05)))
        return self._view

    def _name(self, node: str | None) -> str:
        return self._cluster().name(node) if node else "the cluster"
