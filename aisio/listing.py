"""Listing shards in AIStore buckets: the ``list_ais_shards`` pipe."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Iterator

from aistore.sdk.errors import AISError
from torch.utils.data import IterDataPipe, functional_datapipe

from wds_datapipes.errors import ShardOpenError
from wds_datapipes.shard_listing import SHARD_SUFFIXES, ShardListBase, expand_url_spec

from .client import AISUrl, endpoint, get_client
from .streams import _NO_ANSWER, describe_error

_BRACE_OR_GLOB = frozenset("{*?[")
_GLOB_CHARS = frozenset("*?[")


def _literal_prefix(name: str) -> str:
    """The part of an object name pattern before its first brace or glob character."""
    for i, ch in enumerate(name):
        if ch in _BRACE_OR_GLOB:
            return name[:i]
    return name


def list_objects(bucket: str, prefix: str = "", page_size: int = 0) -> list[str]:
    """Names of all objects in ``ais://bucket`` that start with ``prefix``, sorted.

    It reads every page (``page_size`` names each; 0: as many as the cluster gives).
    """
    client = get_client()
    entries = client.bucket(bucket).list_objects_iter(prefix=prefix, props="name", page_size=page_size)
    return sorted(entry.name for entry in entries)


class _AISListing(IterDataPipe[str]):
    """Yields the shard URLs that ``ais://`` specs name, listed in the cluster (sorted per spec)."""

    def __init__(self, specs: list[str], suffixes: tuple[str, ...] | None, etl_name: str | None,
                 etl_args: str | dict | None, page_size: int = 0):
        self.specs = specs
        self.page_size = page_size
        self.suffixes = suffixes
        self.etl_name = etl_name
        self.etl_args = etl_args

    def __iter__(self) -> Iterator[str]:
        for spec in self.specs:
            for aurl in self._expand(spec):
                yield str(aurl.with_etl(self.etl_name, self.etl_args) if self.etl_name else aurl)

    def _expand(self, spec: str) -> list[AISUrl]:
        base = AISUrl.parse(spec)
        if base.etl_name:
            raise ValueError(f"pass the ETL as etl_name=/etl_args=, not in the spec: {spec!r}")
        pattern = base.object
        try:
            listed = list_objects(base.bucket, _literal_prefix(pattern), self.page_size)
        except (AISError, *_NO_ANSWER) as exn:
            raise ShardOpenError(spec, f"cannot list: {describe_error(base, endpoint(), exn)}") from exn
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
        etl_name, etl_args: an ETL that every shard read runs through; it travels in the
            URLs (``?etl_name=..&etl_args=..``), so the opener sends it with each GET.
            ``etl_args`` may be a string or a dict (sent as JSON).
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
    ):
        if (urls is None) == (bucket is None):
            raise ValueError("give either urls ('ais://bucket/prefix') or bucket= (and prefix=)")
        if urls is None:
            specs = [f"ais://{bucket}/{prefix}"]
        else:
            specs = []
            for spec in [urls] if isinstance(urls, str) else list(urls):
                if not isinstance(spec, str):
                    raise TypeError(f"shard specs must be strings, got {type(spec).__name__}: {spec!r}")
                specs.extend(part.strip() for part in spec.split("::") if part.strip())
        for spec in specs:
            AISUrl.parse(spec)  # fail early on a non-ais spec; no I/O
        if etl_args is not None and not etl_name:
            raise ValueError("etl_args given without etl_name")
        self.specs = specs
        self.etl_name = etl_name
        self.etl_args = etl_args
        super().__init__(
            _AISListing(specs, suffixes, etl_name, etl_args, page_size), shuffle=shuffle, seed=seed, allow_empty=allow_empty
        )

    def _describe_source(self) -> str:
        return " :: ".join(self.specs) + " (on " + endpoint() + ")"
