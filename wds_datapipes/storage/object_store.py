"""``s3://``, ``gs://`` and ``az://`` shards through obstore: open from a byte, stamp, list, put.

The back-end records :data:`S3`, :data:`GCS` and :data:`AZURE` are registered lazily
through the ``wds_datapipes.backends`` entry points, so DataLoader workers find them with
no import. Each needs the optional ``obstore`` (``pip install 'wds-datapipes[cloud]'``).
Where a store is built, its settings and its credentials: :mod:`.cloud_settings`; how
the calls stay safe across ``fork``: :mod:`.store_calls`.

- ``open``: an :class:`ObjectStream` streams the object from any byte (a Range GET), and
  resumes at the exact byte after a reset, a 5xx or a stall (the shared
  :class:`~wds_datapipes.storage.resuming.ResumingStream`), pinned to the first answer's
  ETag (``If-Match``, and the ETag of every later answer compared): a changed object is
  a :class:`~wds_datapipes.errors.ShardReadError` saying so, never a spliced stream.
- ``stamp``: (size, version) by a HEAD; ``list``: globs and prefixes, page by page, in the
  store's key order, a failed page retried under the same policy from the last key listed; ``put``: a local file uploaded whole or not at all (multipart).

A missing object, a missing bucket, denied access and missing credentials are each a
:class:`~wds_datapipes.errors.ShardOpenError` of their own words, raised when the shard
is opened (before its first sample), never retried and never called a corrupt shard.
"""

from __future__ import annotations

import logging
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

from ..errors import ShardOpenError, ShardWriteError
from ..limits import Limits, get_limits
from .backend import SHARD_SUFFIXES, Backend
from .cloud_settings import (
    ObjectUrl,
    customer_keyed,
    gcs_base_url,
    settings_for,
    stores_of,
    unsigned,
    with_stores,
)
from .resuming import Body, Opened, ResumingStream
from .retry import Attempts, RetryPolicy
from .signed_get import SIGNED_FOR_S, SignedUrl, open_signed, proxied
from .store_calls import (
    CHANGED,
    CONFIG,
    CREDENTIALS,
    DENIED,
    MISSING_BUCKET,
    MISSING_OBJECT,
    PAST_END,
    TRANSIENT,
    StoreFailure,
    Target,
    calls,
    forked_after_runtime,
    not_found,
)

logger = logging.getLogger("wds_datapipes")

LIST_PAGE_SIZE = 1000  # objects per listing request (S3's most)
_GLOB_CHARS = frozenset("*?[")
PRESIGNED_READS = True  # False: obstore's GET carries every body (a forked process's: through its agent)
# The stores whose bodies come by presigned URL in a process that calls obstore itself too: S3 and
# Azure sign locally (no request), and http.client reads a body at less CPU per MB than obstore's
# stream (docs/storage.md, Speed). GCS signs through a service (signBlob) where no key is at hand,
# and fake-gcs-server cannot sign: gs:// keeps obstore's GET in-process.
SIGNED_IN_PROCESS = frozenset({"s3", "az"})
_unsigned: set[tuple[int, Target]] = set()  # (process, store) that could not presign: obstore's GET reads it

_CREDENTIAL_HINTS = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE through a credential_provider)",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS or GOOGLE_SERVICE_ACCOUNT (for an emulator: STORAGE_EMULATOR_HOST)",
    "az": "AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY "
          "(or AZURE_STORAGE_SAS_KEY)",
}


def _target(url: str, obj: ObjectUrl, limits: Limits | None) -> Target:
    """Where calls on ``url`` go: ``url``'s own settings where it carries its pipeline's
    (:class:`~.cloud_settings.StoreUrl`), else the process's."""
    return Target(obj.scheme, obj.bucket, settings_for(url), limits or get_limits())


def explain(failure: StoreFailure, obj: ObjectUrl) -> str:
    """Words for a failed call on ``obj``: what is wrong first, then the server's message."""
    where = f"{obj.scheme}://{obj.bucket}"
    words = {
        MISSING_OBJECT: f"the object {obj.key!r} does not exist in {where}",
        MISSING_BUCKET: f"the bucket {where} does not exist",
        DENIED: f"access denied to {obj} (the credentials lack the permission)",
        CREDENTIALS: f"no usable credentials for {where}: set {_CREDENTIAL_HINTS[obj.scheme]}, or name them in "
                     "StoreSettings (docs/storage.md)",
        CHANGED: f"the object {obj} changed while it was read (its ETag no longer matches)",
        CONFIG: f"the settings for {where} cannot be used{_missing(failure, obj.scheme)}",
    }.get(failure.kind, f"{failure.kind} failure")
    return f"{words} ({failure.message})"


def _missing(failure: StoreFailure, scheme: str) -> str:
    """What the settings lack, where obstore's words (which follow) do not say where to set it."""
    if "account must be specified" in failure.message.lower():
        return f": no storage account is named; set {_CREDENTIAL_HINTS[scheme]}, or name it in StoreSettings"
    return ""


class _Chunks(Body):
    """An obstore GET body (an iterator of buffers) as ``readinto`` / ``read`` / ``close``."""

    def __init__(self, chunks: Iterator):
        self._chunks = chunks
        self._view = memoryview(b"")

    def readinto(self, view: memoryview) -> int:
        if not len(self._view):
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._view = memoryview(chunk).cast("B")
        n = min(len(view), len(self._view))
        view[:n] = self._view[:n]
        self._view = self._view[n:]
        return n

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()


class ObjectStream(ResumingStream):
    """One object of an object store, read sequentially from byte ``start``.

    ``size`` and ``version`` (the ETag, else the store's version or generation) are the
    first answer's; every later request asks ``If-Match`` that ETag and compares it.

    Bodies come by presigned URL (:mod:`.signed_get`) for ``s3://`` and ``az://``, and for
    every scheme in a process forked after obstore started (see :mod:`.store_calls`),
    whose store agent then only signs: each request GETs the URL straight from the server,
    signed (by the same store, of the same settings, as obstore's GET would use) again when
    half its hour is gone or on a 403. Where the store cannot presign (fake-gcs-server; a
    GCS login with no signing key; an anonymous store), a proxy is configured, or a URL
    just signed is denied, obstore's GET carries the bytes instead (in a forked process:
    through its agent), for that store in this process. An unsigned store (anonymous, or
    Google's storage emulator) is not asked to sign at all.
    """

    def __init__(self, url: str, start: int = 0, limits: Limits | None = None):
        self.object = ObjectUrl.parse(url)
        if not self.object.key or self.object.key.endswith("/"):
            raise ShardOpenError(url, "the URL names a bucket or a prefix, not an object")
        self._target = _target(url, self.object, limits)
        self._signed: SignedUrl | None = None
        self._direct = (PRESIGNED_READS and (self.object.scheme in SIGNED_IN_PROCESS or forked_after_runtime())
                        and (os.getpid(), self._target) not in _unsigned
                        and not customer_keyed(self.object.scheme, self._target.settings)
                        and not unsigned(self.object.scheme, self._target.settings))
        super().__init__(url, start, RetryPolicy.for_limits(self._target.limits))

    def _request(self, offset: int) -> Opened:
        if self._size is not None and offset >= self._size:
            return Opened(None, offset, self._size, self._version)
        try:
            if self._direct and (opened := self._signed_request(offset)) is not None:
                return opened
            meta, chunks = calls().get(self._target, self.object.key, offset, self._version)
        except StoreFailure as failure:
            if failure.kind != PAST_END:
                raise
            meta = calls().head(self._target, self.object.key)  # a start at the very end: nothing left
            if offset != meta.get("size"):
                raise ShardOpenError(self.url, f"byte {offset} is past the object's end ({meta.get('size')} bytes)")
            return Opened(None, offset, meta.get("size"), _version(meta))
        first = meta.get("range_start")
        return Opened(_Chunks(chunks), first if first is not None else offset, meta.get("size"), _version(meta),
                      about=f"bytes {first}-")

    def _signed_request(self, offset: int) -> Opened | None:
        """The object from ``offset`` by its presigned URL; None where it cannot be presigned."""
        fresh = self._signed is None or self._signed.stale
        if fresh and not self._sign():
            return None
        while True:
            try:
                return open_signed(self._signed, offset, self._version, self.timeouts())
            except StoreFailure as failure:
                if fresh and (failure.kind == DENIED or failure.status in _HEADER_MISSING):  # the agent asks
                    return self._unsignable(failure)
                if failure.kind != DENIED:
                    raise
            fresh = True  # a 403 to a URL signed earlier: it may have expired, so sign once more
            if not self._sign():
                return None

    def _sign(self) -> bool:
        try:
            signed = SignedUrl(calls().sign(self._target, self.object.key, SIGNED_FOR_S))
            if proxied(signed):
                raise StoreFailure("a proxy is configured", "obstore honours it, http.client does not")
        except StoreFailure as failure:
            if failure.kind == CONFIG:
                raise  # the store cannot be built: obstore's GET could not build it either
            self._unsignable(failure)
            return False
        self._signed = signed
        return True

    def _unsignable(self, failure: StoreFailure) -> None:
        """From now on this process reads this store's objects by obstore's GET (logged once)."""
        _unsigned.add((os.getpid(), self._target))
        self._direct, self._signed = False, None
        logger.info("%s://%s: no presigned reads (%s); bytes come through %s", self.object.scheme, self.object.bucket,
                    failure, "the store agent" if forked_after_runtime() else "obstore's GET")

    def _retryable(self, exn: BaseException) -> bool:
        return isinstance(exn, StoreFailure) and exn.kind == TRANSIENT

    def _describe(self, exn: BaseException) -> str:
        if isinstance(exn, StoreFailure):
            return explain(_refined(exn, self._target, self.object), self.object)
        return super()._describe(exn)

    def _source(self) -> str:
        return f"the {self.object.scheme}:// body"

    def __getstate__(self):
        raise TypeError(f"an open stream of {self.url} cannot be pickled (reopen it in the process that reads it)")


# Beside a denial (401, 403: a header the signature named?), the answers to a URL just signed
# that say a request header was missing: 400 (S3: an SSE-C object read without its key's
# headers), 409 (Azure: the same for a CPK blob). The agent's obstore call sends the headers
# a store's settings ask for, and its answer is the one reported.
_HEADER_MISSING = frozenset({400, 409})


def _refined(failure: StoreFailure, target: Target, obj: ObjectUrl) -> StoreFailure:
    """A missing object told apart from a missing bucket where the server's answer did not
    (fake-gcs-server answers a bare 404 to both): one listing of the key's prefix asks the
    bucket (a 404 to it: the bucket is missing), and where that cannot tell either, an
    emulator's bucket resource (:func:`_bucket_absent`). Only on this error's path, so it
    costs nothing otherwise."""
    if failure.kind != MISSING_OBJECT:
        return failure
    try:
        next(iter(calls().list_pages(target, obj.key.rpartition("/")[0], 1)), None)
        return failure  # the bucket lists: the object is what is missing
    except StoreFailure as listed:
        if not_found(listed) or _bucket_absent(target):
            return StoreFailure(MISSING_BUCKET, failure.message)
    return failure


def _bucket_absent(target: Target) -> bool:
    """Whether an unsigned ``gs://`` store (Google's storage emulator, an anonymous store) says
    the bucket does not exist, asked of the JSON API's bucket resource with one plain GET
    (``/storage/v1/b/BUCKET``: 404), for where its listing cannot say: fake-gcs-server answers
    a listing in a missing bucket with a 500. False for any other store or answer."""
    if target.scheme != "gs" or not unsigned("gs", target.settings):
        return False
    url = f"{gcs_base_url(target.settings)}/storage/v1/b/{urllib.parse.quote(target.bucket, safe='')}"
    try:
        with urllib.request.urlopen(url, timeout=target.limits.http_timeout or 30):
            return False
    except urllib.error.HTTPError as answer:
        return answer.code == 404
    except (OSError, ValueError):
        return False


def _version(meta: dict[str, Any]) -> str | None:
    return meta.get("e_tag") or meta.get("version") or None


def open_object(url: str, start: int = 0, limits: Limits | None = None) -> ObjectStream:
    """``url`` as a stream from byte ``start`` (the back ends' ``open``)."""
    return ObjectStream(url, start, limits)


def stamp_object(url: str, limits: Limits | None = None) -> tuple[int | None, str | None]:
    """(size, version) of the object as the store says now (a HEAD)."""
    obj = ObjectUrl.parse(url)
    try:
        target = _target(url, obj, limits)
        meta = calls().head(target, obj.key)
    except StoreFailure as failure:
        raise ShardOpenError(url, explain(_refined(failure, target, obj), obj)) from None
    return meta.get("size"), _version(meta)


def list_objects(spec: str, limits: Limits | None = None) -> Iterator[str]:
    """The URLs ``spec`` names, lazily, a page at a time, in key order (S3, GCS and Azure list by key).

    A glob (``s3://b/train/shard-*.tar``; ``*``, ``?`` and ``[...]`` stay within one ``/``
    segment, as in a local glob) yields the objects it matches; a prefix ending in ``/``
    (``s3://b/train/``) the shards directly in it (as a local directory does); any other
    URL is itself. Nothing matched raises ShardOpenError naming the spec. The URLs carry the
    pipeline settings ``spec`` carries (:func:`~.cloud_settings.with_stores`)."""
    obj = ObjectUrl.parse(spec)
    stores = stores_of(spec)
    globbed = bool(_GLOB_CHARS.intersection(obj.key))
    if not globbed and obj.key and not obj.key.endswith("/"):
        yield spec
        return
    if globbed:
        fixed = re.split(r"[*?\[]", obj.key, maxsplit=1)[0]
        prefix, pattern = fixed.rpartition("/")[0], _glob_regex(obj.key)
        matches = pattern.fullmatch
    else:
        prefix = obj.key.rstrip("/")

        def matches(key: str) -> bool:
            rest = key[len(obj.key):]
            return key.startswith(obj.key) and "/" not in rest and rest.endswith(SHARD_SUFFIXES)
    found, after = 0, None  # after: the last key listed (a failed page resumes past it)
    target = _target(spec, obj, limits)
    attempts = Attempts(RetryPolicy.for_limits(target.limits))
    while True:
        try:
            for page in calls().list_pages(target, prefix, LIST_PAGE_SIZE, after):
                reached = after
                for meta in page:
                    after = meta["path"]
                    if matches(after):
                        found += 1
                        yield with_stores(f"{obj.scheme}://{obj.bucket}/{after}", stores)
                if after != reached:  # a new key: progress (a page listed again, past keys dropped, is not)
                    attempts.progress()
            break
        except StoreFailure as failure:
            if not_found(failure) or (after is None and _bucket_absent(target)):  # a listing finds no bucket
                failure = StoreFailure(MISSING_BUCKET, failure.message)
            why = explain(failure, obj)
            if failure.kind != TRANSIENT:
                raise ShardOpenError(spec, why) from None
            if not attempts.failed(why):
                raise ShardOpenError(spec, f"listing: {attempts.gave_up(why)}") from None
            logger.warning("%s: listing failed (%s); trying again after key %r", spec, why, after)
    if not found:
        raise ShardOpenError(spec, "no object matches" if globbed else "no shard under this prefix")


def _glob_regex(pattern: str) -> re.Pattern:
    """A glob as a regular expression over keys: ``*``, ``?`` and ``[!...]`` within one ``/``
    segment (``**`` too, as a local glob that is not recursive reads it)."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 2)
            if end < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1:end]
                negated = "^" + body[1:] + "/" if body.startswith("!") else body  # never a "/", as in a local glob
                out.append("[" + negated.replace("\\", "\\\\") + "]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def put_object(path: str, url: str, limits: Limits | None = None) -> str | None:
    """Uploads the local file ``path`` as ``url``, whole or not at all (multipart over 8 MiB);
    returns the version written (its ETag)."""
    obj = ObjectUrl.parse(url)
    try:
        result = calls().put(_target(url, obj, limits), str(path), obj.key)
    except StoreFailure as failure:
        raise ShardWriteError(explain(failure, obj), shard=url) from None
    except OSError as exn:
        raise ShardWriteError(f"cannot read {path}: {exn}", shard=url) from None
    return result.get("e_tag") or result.get("version")


S3 = Backend("s3", open_object, stamp=stamp_object, list=list_objects, put=put_object)
GCS = Backend("gs", open_object, stamp=stamp_object, list=list_objects, put=put_object)
AZURE = Backend("az", open_object, stamp=stamp_object, list=list_objects, put=put_object)
