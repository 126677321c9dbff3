"""Listing shards in AIStore buckets: the ``list_ais_shards`` pipe."""

from __future__ import annotations

import fnmatch
import json
import logging
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import quote

from aistore.sdk.types import ActionMsg, ListObjectsMsg

from wds_datapipes.errors import ShardOpenError
from wds_datapipes.shards.listing import SHARD_SUFFIXES, ShardListBase, expand_url_spec
from wds_datapipes.torch_datapipes import IterDataPipe, functional_datapipe

from . import rest
from .client import AISUrl, endpoint
from .errors import BROKEN_STREAM, NoAnswer, NodeAnswer, describe_error
from .nodes import retry_reason, view_of
from .retry import Attempts, RetryPolicy
from .sdk_sources import ExactObject, is_sdk_source, specs_of_sources, warn_old_lister_call

_JSON = {"Content-Type": "application/json", "Accept": "application/json"}
logger = logging.getLogger("aisio")

_BRACE_OR_GLOB = frozenset("{*?[")
_GLOB_CHARS = frozenset("*?[")


def _literal_prefix(name: str) -> str:
    """The part of an object name pattern before its first brace or glob character."""
    for i, ch in enumerate(name):
        if ch in _BRACE_OR_GLOB:
            return name[:i]
    return name


def list_objects(bucket: str, prefix: str = "", page_size: int = 0, *, policy: RetryPolicy | None = None) -> list[str]:
    """Names of all objects in ``ais://bucket`` that start with ``prefix``, sorted.

    It reads every page (``page_size`` names each; 0: as many as the cluster gives), each
    page retried within the retry budget (:mod:`aisio.retry`) while nodes fail or the
    cluster map changes. Failures raise :class:`~wds_datapipes.errors.ShardOpenError`
    naming ``ais://bucket/prefix``, the node and its answer, or what was tried.
    """
    return sorted(name for page in object_pages(bucket, prefix, page_size, policy=policy) for name in page)


def object_pages(bucket: str, prefix: str = "", page_size: int = 0, *,
                 policy: RetryPolicy | None = None) -> Iterator[list[str]]:
    """The names of the objects in ``ais://bucket`` that start with ``prefix``, a page at a time
    as the cluster gives them (each page asked for when the one before is used up), each
    page retried as :func:`list_objects` says."""
    policy = policy or RetryPolicy.from_env()
    cluster = endpoint()
    token = uuid = ""
    while True:
        page = _list_page(cluster, AISUrl(bucket, prefix), page_size, token, uuid, policy)
        yield [entry["name"] for entry in page.get("entries") or ()]
        token, uuid = page.get("continuation_token") or "", page.get("uuid") or ""
        if not token:
            return


def list_ais_urls(spec: str, limits: Any = None) -> Iterator[str]:
    """The ``ais`` back end's ``list``: ``ais://bucket/<glob>`` yields the objects the glob
    matches, ``ais://bucket`` or ``ais://bucket/prefix/`` the shard files under the prefix
    (``.tar``, ``.tar.gz``, ...), page by page (sorted in each page), so the first shard can
    open before a long listing ends; any other URL names one object and comes back as it is
    (no request). Query parameters (an ETL) stay on every URL."""
    base = AISUrl.parse(spec)
    pattern = base.object or ""
    globbed = bool(_GLOB_CHARS.intersection(pattern))
    if not globbed and pattern and not pattern.endswith("/"):
        yield spec
        return
    for page in object_pages(base.bucket, _literal_prefix(pattern)):
        for name in sorted(page):
            if fnmatch.fnmatchcase(name, pattern) if globbed else name.endswith(SHARD_SUFFIXES):
                yield str(base.with_object(name))


def _list_page(cluster: str, where: AISUrl, page_size: int, token: str, uuid: str, policy: RetryPolicy) -> dict:
    """One page of a listing (``GET /v1/buckets/<bucket>``), retried within the budget."""
    value = ListObjectsMsg(prefix=where.object, page_size=page_size, uuid=uuid, props="name",
                           continuation_token=token, flags=[], target="").as_dict()
    body = json.dumps(ActionMsg(action="list", value=value).model_dump()).encode()
    url = f"{cluster}/v1/buckets/{quote(where.bucket, safe='')}?provider=ais"
    spec = f"ais://{where.bucket}/{where.object}"
    attempts = Attempts(policy)
    view = view_of(cluster, timeout=min(1.0, policy.budget_s / 4))  # the map now: see aisio.nodes
    while True:
        try:
            reply = rest.request("GET", url, headers=_JSON, body=body, timeouts=attempts.timeouts())
            answer = rest.read_error_body(reply) if reply.status != 200 else None
            if answer is None:
                with reply:
                    return json.loads(reply.read())
            failure = NodeAnswer(reply.status, answer, view.name(reply.node), f"list {spec}")
            why = retry_reason(failure, view, attempts.remaining())
            if why is None:
                raise ShardOpenError(spec, f"cannot list: {describe_error(failure, where.with_object(''), cluster)}")
            failure = f"{failure} ({why})"
        except NoAnswer as exn:
            failure = f"no answer from {view.name(exn.node)}: {exn.cause}"
        except (*BROKEN_STREAM, ValueError) as exn:  # a page cut short or garbled
            failure = f"the listing from {cluster} broke: {type(exn).__name__}: {exn}"
        if not attempts.failed(failure):
            raise ShardOpenError(spec, f"cannot list: no usable answer from the cluster at {cluster}: "
                                       f"{attempts.summary()}")
        logger.warning("listing %s: %s; trying again", spec, failure)


class _AISListing(IterDataPipe[str]):
    """Yields the shard URLs that ``ais://`` specs name, listed in the cluster (sorted per spec)."""

    def __init__(self, specs: list[str], suffixes: tuple[str, ...] | None, etl_name: str | None,
                 etl_args: str | dict | None, page_size: int = 0, etl_local: str | None = None):
        self.specs = specs
        self.page_size = page_size
        self.suffixes = suffixes
        self.etl_name = etl_name
        self.etl_args = etl_args
        self.etl_local = etl_local

    def __iter__(self) -> Iterator[str]:
        for spec in self.specs:
            for aurl in self._expand(spec):
                yield str(aurl.with_etl(self.etl_name, self.etl_args, self.etl_local) if self.etl_name else aurl)

    def _expand(self, spec: str) -> list[AISUrl]:
        base = AISUrl.parse(spec)
        if base.etl_name:
            raise ValueError(f"pass the ETL as etl_name=/etl_args=, not in the spec: {spec!r}")
        pattern = base.object
        if isinstance(spec, ExactObject):
            if pattern not in list_objects(base.bucket, pattern, self.page_size):
                raise ShardOpenError(spec, f"object {pattern!r} is not in bucket ais://{base.bucket}")
            return [base]
        listed = list_objects(base.bucket, _literal_prefix(pattern), self.page_size)
        if "{" in pattern:
            # A brace template names exact shards: all must exist.
            wanted = [AISUrl.parse(u).object for u in expand_url_spec(f"ais://{base.bucket}/{pattern}")]
            present = set(listed)
            missing = [n for n in wanted if n not in present]
            if missing:
                shown = ", ".join(repr(n) for n in missing[:5]) + (" ..." if len(missing) > 5 else "")
                raise ShardOpenError(
                    spec, f"{len(missing)} of {len(wanted)} shards are not in bucket ais://{base.bucket}: {shown}"
                )
            names = sorted(set(wanted))
        elif _GLOB_CHARS.intersection(pattern):
            names = [n for n in listed if fnmatch.fnmatchcase(n, pattern)]
        else:
            names = [n for n in listed if self.suffixes is None or n.endswith(self.suffixes)]
        return [base.with_object(n) for n in names]


@functional_datapipe("list_ais_shards")
class AISSourceLister(ShardListBase):
    """Yields ``ais://`` shard URLs listed in the cluster, sorted, optionally shuffled per epoch, this worker's share (functional name: ``list_ais_shards``).

    Args:
        urls: an ``ais://bucket/prefix`` spec (the shards whose names start with the
            prefix and end with ``suffixes``), a brace template
            (``ais://bkt/train-{000..099}.tar``: every named shard must exist), a glob
            (``ais://bkt/train-*.tar``), ``::``-joined specs, or a list of them.
            Or leave it out and give ``bucket`` (and ``prefix``).
        bucket, prefix: the same as ``urls="ais://BUCKET/PREFIX"``.
        ais_sources: deprecated, the aistore SDK's removed ``AISSourceLister``'s argument:
            SDK buckets, objects or object groups (or bucket names), ``prefix`` applying to
            each bucket; every object is kept, as there. A :class:`DeprecationWarning`
            shows the new spelling (see :mod:`aisio.compat`).
        etl_name, etl_args: an ETL that every shard read runs through; it travels in the
            URLs (``?etl_name=..&etl_args=..``), so the opener sends it with each GET and
            the cluster runs it. ``etl_args`` may be a string or a dict (sent as JSON).
        etl_local: run the ETL here instead, in each reading worker: an ETL server class
            (an ``aistore.sdk.etl.webserver`` ``ETLServer`` subclass, the same class the
            cluster would run) or its ``"module:Class"`` path. ``etl_name`` then only names
            it (default: the class name). See :mod:`aisio.local_etl`.
        suffixes: object name endings kept when listing a prefix (default: .tar, .tar.gz,
            .tgz); ``None`` keeps every object.
        page_size: names per listing request (0: as many as the cluster gives); the
            listing always reads every page.
        shuffle, seed, allow_empty: as for :class:`wds_datapipes.ShardLister`: the order
            is reshuffled each epoch, identically in every worker and rank, and each worker
            and rank reads whole, distinct shards.

    The cluster is ``$AIS_ENDPOINT`` (see :func:`aisio.set_endpoint`). Listing happens
    when iteration starts (in each worker), through the SDK, every page.

    Example:
        >>> dp = AISSourceLister("ais://train/shard-", shuffle=True, seed=0).load_tar().group_by_key()
    """

    def __init__(
        self,
        urls: str | Iterable[str] | None = None,
        *,
        bucket: str | None = None,
        prefix: str = "",
        etl_name: str | None = None,
        etl_args: str | dict | None = None,
        suffixes: tuple[str, ...] | None = SHARD_SUFFIXES,
        page_size: int = 0,
        shuffle: bool = False,
        seed: int | None = None,
        allow_empty: bool = False,
        ais_sources: Iterable[Any] | None = None,
        etl_local: type | str | None = None,
    ):
        if urls is not None and not isinstance(urls, str):
            urls = list(urls)
            if urls and all(is_sdk_source(u) for u in urls):
                urls, ais_sources = None, urls  # the old SDK's positional ais_sources
        if ais_sources is not None:
            if urls is not None or bucket is not None:
                raise ValueError("give ais_sources (the old spelling) or urls / bucket=, not both")
            specs = specs_of_sources(ais_sources, prefix)
            if suffixes == SHARD_SUFFIXES:
                suffixes = None  # the old lister listed every object
            warn_old_lister_call(specs, {"etl_name": etl_name, "etl_args": etl_args}, stacklevel=3)
        elif (urls is None) == (bucket is None):
            raise ValueError("give either urls ('ais://bucket/prefix') or bucket= (and prefix=)")
        elif urls is None:
            specs = [f"ais://{bucket}/{prefix}"]
        else:
            specs = []
            for spec in [urls] if isinstance(urls, str) else urls:
                if not isinstance(spec, str):
                    raise TypeError(f"shard specs must be strings, got {type(spec).__name__}: {spec!r}")
                if isinstance(spec, ExactObject):
                    specs.append(spec)
                    continue
                specs.extend(part.strip() for part in spec.split("::") if part.strip())
        for spec in specs:
            AISUrl.parse(spec)  # fail early on a non-ais spec; no I/O
        if etl_local is not None:
            from .local_etl import class_path  # only for this case: it loads the SDK's ETL server

            etl_local = class_path(etl_local)
            etl_name = etl_name or etl_local.rpartition(":")[2].rpartition(".")[2]
        if etl_args is not None and not etl_name:
            raise ValueError("etl_args given without etl_name")
        self.specs = specs
        self.etl_name = etl_name
        self.etl_args = etl_args
        self.etl_local = etl_local
        super().__init__(
            _AISListing(specs, suffixes, etl_name, etl_args, page_size, etl_local),
            shuffle=shuffle, seed=seed, allow_empty=allow_empty,
        )

    def _describe_source(self) -> str:
        return " :: ".join(self.specs) + " (on " + endpoint() + ")"
