"""Opening ``ais://`` shards as sequential streams that survive dropped connections.

``open_ais_url`` is the core's opener for the ``ais`` scheme (registered by importing
:mod:`aisio`, or lazily through the ``wds_datapipes.openers`` entry point). It streams
the object body through the SDK's reader: no temp file, no subprocess. When the
connection drops mid-object, the stream asks again from the last byte it returned
(``Range: bytes=N-``), so the tar reader above it sees every byte exactly once.

An ETL travels in the URL: ``ais://bucket/object?etl_name=NAME&etl_args=ARGS`` sends
``etl_name`` / ``etl_args`` with the GET (see :class:`aisio.client.AISUrl`).
"""

from __future__ import annotations

import http.client
import io
import json
import logging
import time

import requests
import urllib3.exceptions
from aistore.sdk.errors import AISError, ErrBckNotFound, ErrETLNotFound, ErrObjNotFound

from wds_datapipes.errors import ShardOpenError

from .client import AISUrl, endpoint, get_client

DEFAULT_MAX_RESUME = 5
_RESUME_BACKOFF_S = 0.2

logger = logging.getLogger("aisio")

# What a body read raises when the connection breaks, times out or ends early.
_BROKEN_STREAM = (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError)
# What the SDK raises when a request cannot be sent or answered at all.
_NO_ANSWER = (requests.exceptions.RequestException, urllib3.exceptions.HTTPError, OSError)


class AISReadError(ShardOpenError):
    """An object's stream broke and could not be resumed (its url, and the byte offset reached)."""

    def __init__(self, url: str, offset: int | None = None, reason: str | None = None):
        self.offset = offset
        super().__init__(url, f"at byte {offset}: {reason}" if reason is not None else None)


def server_message(exn: AISError) -> str:
    """The ``message`` of an AIStore error answer (its JSON body), else the raw text."""
    text = (exn.message or "").strip()
    try:
        return str(json.loads(text)["message"])
    except (ValueError, KeyError, TypeError):
        return text[:500]


def describe_error(aurl: AISUrl, endpoint: str, exn: BaseException) -> str:
    """One line saying what the cluster answered about ``aurl`` (missing bucket, object, ETL...)."""
    if not isinstance(exn, AISError):
        return f"no answer from AIStore at {endpoint}: {type(exn).__name__}: {exn}"
    status, msg = exn.status_code, server_message(exn)
    if isinstance(exn, ErrBckNotFound):
        return f"bucket ais://{aurl.bucket} does not exist on {endpoint} (HTTP {status}: {msg})"
    if aurl.etl_name and (isinstance(exn, ErrETLNotFound) or status in (404, 501)) and not (
        isinstance(exn, ErrObjNotFound) and "etl" not in msg.lower()
    ):
        args = f" with args {aurl.etl_args!r}" if aurl.etl_args is not None else ""
        return (
            f"ETL {aurl.etl_name!r}{args} cannot transform object {aurl.object!r} in bucket "
            f"ais://{aurl.bucket}: the cluster at {endpoint} answered HTTP {status}: {msg} (a cluster "
            "runs ETLs only when deployed on Kubernetes with an aisnode built with the 'etl' tag, "
            "and only ETLs it lists; see aisio.etl.list_etls)"
        )
    if isinstance(exn, ErrObjNotFound) or status == 404:
        return f"object {aurl.object!r} does not exist in bucket ais://{aurl.bucket} on {endpoint} (HTTP {status}: {msg})"
    return f"AIStore at {endpoint} answered HTTP {status}: {msg}"


class AISObjectStream(io.RawIOBase):
    """A read-only, sequential binary stream of one AIS object that resumes after a dropped connection.

    The first GET is sent on construction, so a missing bucket, object or ETL raises
    :class:`~wds_datapipes.errors.ShardOpenError` at once. Reads return the bytes in
    order; when the connection fails mid-object (reset, timeout, early end), the next
    request asks for ``Range: bytes=<offset>-`` and reading goes on, at most
    ``max_resume`` times per stream, then :class:`AISReadError`. A cluster that answers a
    ranged GET with the whole object (an ETL output) has the already-read prefix skipped.
    A resumed object must have the same version and checksum as when it was opened.
    """

    def __init__(self, url: str, max_resume: int = DEFAULT_MAX_RESUME):
        super().__init__()
        self.url = url
        self.aurl = AISUrl.parse(url)
        if not self.aurl.object:
            raise ShardOpenError(url, "no object name in the URL (expected ais://bucket/object)")
        self.max_resume = max_resume
        self.resumes = 0
        self._endpoint = endpoint()
        self._client = get_client(self._endpoint)
        self._object = self._client.bucket(self.aurl.bucket).object(self.aurl.object)
        self._pos = 0
        self._size: int | None = None
        self._identity: tuple[str | None, str | None] | None = None
        self._raw = None
        try:
            self._raw = self._request(0)
        except (AISError, *_NO_ANSWER) as exn:
            raise ShardOpenError(url, describe_error(self.aurl, self._endpoint, exn)) from exn

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
            try:
                n = self._raw.readinto(view)
            except _BROKEN_STREAM as exn:
                self._resume(f"{type(exn).__name__}: {exn}")
                continue
            if n == 0 and self._size is not None and self._pos < self._size:
                self._resume(f"the stream ended at byte {self._pos} of {self._size}")
                continue
            self._pos += n
            return n

    def close(self) -> None:
        if not self.closed and self._raw is not None:
            self._release(self._raw)
            self._raw = None
        super().close()

    @property
    def position(self) -> int:
        """Bytes of the object returned so far."""
        return self._pos

    # -- requests

    def _request(self, offset: int):
        """Send a GET from ``offset`` and return the body stream, positioned at ``offset``."""
        reader = self._object.get_reader(
            etl=self.aurl.etl, byte_range=f"bytes={offset}-" if offset else None
        )
        raw = reader.raw()
        headers = raw.headers
        identity = (headers.get("Ais-Version"), headers.get("Ais-Checksum-Value"))
        if self._identity is None:
            self._identity = identity
        elif identity != self._identity and None not in identity:
            self._release(raw)
            raise AISReadError(self.url, offset, f"the object changed while it was read ({self._identity} -> {identity})")
        if raw.status == 206:
            start = _content_range_start(headers.get("Content-Range"))
            if start != offset:
                self._release(raw)
                raise AISReadError(self.url, offset, f"asked for bytes {offset}-, got {headers.get('Content-Range')!r}")
        elif offset:
            # The whole body again (the server ignored the range): skip what was returned.
            _skip(raw, offset)
        if self._size is None and raw.status == 200 and not headers.get("Content-Encoding"):
            length = headers.get("Content-Length")
            self._size = int(length) if length and length.isdigit() else None
        return raw

    def _resume(self, why: str) -> None:
        self._release(self._raw)
        self._raw = None
        while True:
            if self.resumes >= self.max_resume:
                raise AISReadError(self.url, self._pos, f"connection lost and {self.resumes} resume(s) failed: {why}")
            self.resumes += 1
            logger.warning("%s: %s; resuming at byte %d (resume %d of %d)",
                           self.url, why, self._pos, self.resumes, self.max_resume)
            time.sleep(_RESUME_BACKOFF_S * (self.resumes - 1))
            try:
                self._raw = self._request(self._pos)
                return
            except AISError as exn:
                # The cluster answered (object deleted, ETL gone...): retrying will not help.
                raise AISReadError(self.url, self._pos, describe_error(self.aurl, self._endpoint, exn)) from exn
            except _NO_ANSWER as exn:
                why = f"{type(exn).__name__}: {exn}"

    @staticmethod
    def _release(raw) -> None:
        if raw is None:
            return
        try:
            raw.close()  # a half-read body: drop the connection rather than pool it
            raw.release_conn()
        except Exception as exn:  # noqa: BLE001 - best effort on a connection that already failed
            logger.debug("closing a broken AIS response: %s", exn)


def _content_range_start(value: str | None) -> int | None:
    # "bytes 5-999/1000"
    try:
        return int(value.split()[1].split("-")[0])
    except (AttributeError, IndexError, ValueError):
        return None


def _skip(raw, count: int) -> None:
    while count:
        chunk = raw.read(min(count, 1 << 20))
        if not chunk:
            raise urllib3.exceptions.ProtocolError("the stream ended while skipping the part already read")
        count -= len(chunk)


def open_ais_url(url: str) -> AISObjectStream:
    """Open ``ais://bucket/object[?etl_name=..&etl_args=..]`` for sequential reading (the ``ais`` opener).

    The cluster is ``$AIS_ENDPOINT``. Failures raise
    :class:`~wds_datapipes.errors.ShardOpenError` naming the bucket, object or ETL and
    the cluster's answer; a stream that breaks mid-object resumes from its offset.

    Example:
        >>> with open_ais_url("ais://train/shard-000000.tar") as stream: head = stream.read(512)
    """
    return AISObjectStream(url)
