"""aisio's errors, and the one place that turns AIStore and HTTP failures into them.

Listing, reading, uploading, sorting and ETL management all catch :data:`AIS_FAILURES`
and call :func:`describe_error` (through :func:`translating`), so a failure reads the
same wherever it happens: what was asked (bucket, object, ETL), which node answered or
failed to (target id and URL, not the proxy that redirected), and the node's own words.
"""

from __future__ import annotations

import contextlib
import http.client
import json
from collections.abc import Callable, Iterator

import requests
import urllib3.exceptions
from aistore.sdk.errors import AISError, ErrBckNotFound, ErrETLNotFound, ErrObjNotFound

from wds_datapipes.errors import ShardReadError, WdsError

from .client import AISUrl


class NodeAnswer(Exception):
    """An HTTP error answer from one AIStore node: its status, its message, and who sent it.

    Raised by :mod:`aisio.rest`; ``node`` names the node (``target t[ID] at URL``),
    ``tcode`` is AIStore's error code (``ErrNotFound``, ``ErrBckNotFound``...).
    """

    def __init__(self, status: int, body: bytes | str, node: str, request: str):
        self.status = status
        self.node = node
        self.request = request
        self.tcode, self.message = _parse_body(body)
        super().__init__(f"HTTP {status} from {node} for {request}: {self.message}")


class NoAnswer(Exception):
    """A node could not be reached, or did not answer in time (``node`` names it)."""

    def __init__(self, node: str, cause: BaseException | str):
        self.node = node
        self.cause = cause
        why = f"{type(cause).__name__}: {cause}" if isinstance(cause, BaseException) else cause
        super().__init__(f"no answer from {node}: {why}")


class AISReadError(ShardReadError):
    """An object's stream broke and could not be resumed (its url, and the byte offset reached)."""

    def __init__(self, url: str, *where):
        """``AISReadError(url, offset, reason)``, or ShardReadError's ``(url, member, offset, reason)``
        (the tar reader adds the member), or one ready message."""
        member, offset, reason = where[:3] if len(where) >= 3 else (None, *(*where, None, None)[:2])
        if reason is None:  # one ready message
            super().__init__(url)
            return
        super().__init__(url, member, offset, reason)


class UploadError(WdsError):
    """A local shard could not be stored as an object; the local file is kept."""

    def __init__(self, path: str, url: str | None = None, reason: str | None = None):
        if reason is None:  # one ready message (torch re-raises errors as type(message))
            self.path = self.url = self.reason = None
            super().__init__(path)
            return
        self.path, self.url, self.reason = path, url, reason
        super().__init__(f"cannot upload {path!r} to {url!r}: {reason} (the local file is kept)")


class DsortError(WdsError):
    """A dSort job could not start, failed, was aborted or did not finish in time."""


class ETLError(WdsError):
    """The cluster refused or failed an ETL management call, or a local ETL run failed."""


# What a body read raises when the connection breaks, times out or ends early.
BROKEN_STREAM = (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError)
# What is raised when a request cannot be sent or answered at all (SDK or our own client).
NO_ANSWER = (NoAnswer, requests.exceptions.RequestException, urllib3.exceptions.HTTPError,
             http.client.HTTPException, OSError)
# Every failure of a call to AIStore that this library turns into its own errors.
AIS_FAILURES = (AISError, NodeAnswer, *NO_ANSWER)


def _parse_body(body: bytes | str) -> tuple[str, str]:
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else (body or "")
    text = text.strip()
    try:
        parsed = json.loads(text)
        return str(parsed.get("tcode") or ""), str(parsed["message"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return "", text[:500]


def server_message(exn: AISError | NodeAnswer) -> str:
    """The ``message`` of an AIStore error answer (its JSON body), else the raw text."""
    if isinstance(exn, NodeAnswer):
        return exn.message
    return _parse_body(exn.message or "")[1]


def status_of(exn: BaseException) -> int | None:
    """The HTTP status of an error answer; ``None`` when there was no answer."""
    if isinstance(exn, NodeAnswer):
        return exn.status
    if isinstance(exn, AISError):
        return exn.status_code
    return None


def _who(exn: BaseException, cluster: str | None) -> str:
    node = getattr(exn, "node", None)
    if node:
        return node
    url = getattr(exn, "req_url", None)  # the SDK's errors: the URL of the node that answered
    if url:
        return "the node at " + url.split("/v1/", 1)[0]
    return f"the AIStore cluster at {cluster}" if cluster else "the AIStore cluster"


def _blames_the_etl(aurl: AISUrl | None, exn: BaseException, status: int, msg: str) -> bool:
    """Whether an answer to a GET that names an ETL is about the ETL (unknown, unsupported)."""
    if aurl is None or not aurl.etl_name or status not in (404, 501):
        return False
    if isinstance(exn, ErrETLNotFound) or status == 501 or "etl" in msg.lower():
        return True
    return not isinstance(exn, ErrObjNotFound) and getattr(exn, "tcode", "") != "ErrNotFound"


def _bucket_missing(exn: BaseException) -> bool:
    return isinstance(exn, ErrBckNotFound) or getattr(exn, "tcode", "") == "ErrBckNotFound"


def describe_error(exn: BaseException, aurl: AISUrl | None = None, cluster: str | None = None) -> str:
    """One line saying what the cluster (or a node of it) answered about ``aurl``, or that nobody did."""
    where = f" on {cluster}" if cluster else ""
    if not isinstance(exn, (AISError, NodeAnswer)):
        if isinstance(exn, NoAnswer):
            return str(exn)
        return f"no answer from {_who(exn, cluster)}: {type(exn).__name__}: {exn}"
    status, msg, who = status_of(exn), server_message(exn), _who(exn, cluster)
    answer = f"HTTP {status} from {who}: {msg}"
    if aurl is not None and _bucket_missing(exn):
        return f"bucket ais://{aurl.bucket} does not exist{where} ({answer})"
    if _blames_the_etl(aurl, exn, status, msg):
        args = f" with args {aurl.etl_args!r}" if aurl.etl_args is not None else ""
        return (
            f"ETL {aurl.etl_name!r}{args} cannot transform object {aurl.object!r} in bucket "
            f"ais://{aurl.bucket}: {answer} (a cluster runs ETLs only when deployed on Kubernetes "
            "with an aisnode built with the 'etl' tag, and only ETLs it lists, see aisio.etl.list_etls; "
            "or run the transform in the reader: etl_local=)"
        )
    if aurl is not None and aurl.object and status == 404:
        return f"object {aurl.object!r} does not exist in bucket ais://{aurl.bucket}{where} ({answer})"
    return answer


@contextlib.contextmanager
def translating(make_error: Callable[[str], Exception], aurl: AISUrl | None = None, cluster: str | None = None,
                doing: str | None = None, hint: str = "") -> Iterator[None]:
    """Turn any of :data:`AIS_FAILURES` raised inside into ``make_error(reason)``, the reason
    being ``"cannot DOING: "`` (when given), what happened (:func:`describe_error`) and ``hint``.

    Example:
        >>> with translating(DsortError, cluster=endpoint(), doing="start dSort"): job.start(spec)
    """
    try:
        yield
    except AIS_FAILURES as exn:
        reason = (f"cannot {doing}: " if doing else "") + describe_error(exn, aurl, cluster) + hint
        raise make_error(reason) from exn
