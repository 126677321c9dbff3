"""The aistore SDK's removed DataPipes, by their old names and argument names, with a way out.

``aistore.pytorch`` (SDK 1.x) had ``AISSourceLister(ais_sources, prefix, etl_name)``,
``AISFileLister(source_datapipe, url, length)`` and ``AISFileLoader(source_datapipe, url,
length)``; the published AIStore + WebDataset workflow is written against them. Here they
keep working, each with a :class:`DeprecationWarning` that spells the call in this
library's terms (see the migration table in ``aisio/README.md``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from typing import Any

from aistore.sdk.bucket import Bucket
from aistore.sdk.multiobj import ObjectGroup
from aistore.sdk.obj.object import Object

from wds_datapipes.torch_datapipes import IterDataPipe

from .client import ENDPOINT_ENV, endpoint, set_endpoint
from .listing import AISSourceLister, ExactObject
from .streams import open_ais_url


def is_sdk_source(value: Any) -> bool:
    """Whether ``value`` is one of the SDK's ``AISSource`` objects (a bucket, an object, a group)."""
    return isinstance(value, (Bucket, Object, ObjectGroup))


def specs_of_sources(ais_sources: Iterable[Any], prefix: str = "") -> list[str]:
    """This library's specs for the old ``ais_sources`` list: SDK buckets, objects and object
    groups, bucket names, or ``ais://`` URLs; ``prefix`` applies to buckets."""
    if isinstance(ais_sources, (str, Bucket, Object, ObjectGroup)):
        ais_sources = [ais_sources]
    specs: list[str] = []
    for source in ais_sources:
        if isinstance(source, Bucket):
            _check_ais(source.provider, source.name)
            specs.append(f"ais://{source.name}/{prefix}")
        elif isinstance(source, Object):
            _check_ais(source.bucket_provider, source.bucket_name)
            specs.append(ExactObject(f"ais://{source.bucket_name}/{source.name}"))
        elif isinstance(source, ObjectGroup):
            _check_ais(source.bck.provider, source.bck.name)
            specs.extend(ExactObject(f"ais://{source.bck.name}/{n}") for n in source.list_names()
                         if n.startswith(prefix))
        elif isinstance(source, str):
            specs.append(source + prefix if source.startswith("ais://") else f"ais://{source}/{prefix}")
        else:
            raise TypeError(
                f"ais_sources takes the SDK's buckets, objects and object groups, bucket names or "
                f"ais:// URLs, got {type(source).__name__}: {source!r}"
            )
    return specs


def _check_ais(provider: Any, bucket: str) -> None:
    name = getattr(provider, "value", provider)
    if name not in ("ais", None):
        raise ValueError(
            f"bucket {name}://{bucket}: aisio reads ais:// buckets only (AIStore can front a "
            f"{name} bucket as an ais bucket, e.g. through a remote backend)"
        )


def warn_old_lister_call(specs: list[str], kwargs: dict[str, Any], stacklevel: int) -> None:
    """Warn that ``AISSourceLister(ais_sources=...)`` is the old spelling, showing the new one."""
    shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if v not in (None, ""))
    warnings.warn(
        f"AISSourceLister(ais_sources=[...]{', prefix=...' if kwargs.get('prefix') else ''}) is the aistore "
        f"SDK's removed DataPipe's spelling; write AISSourceLister({[str(s) for s in specs]!r}, suffixes=None"
        f"{', ' + shown if shown else ''}) (suffixes=None keeps every object, as the old lister did; "
        "the default keeps .tar/.tgz/.tar.gz shards)",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def _take_endpoint(url: str | None, old: str) -> None:
    if url and url.rstrip("/") != endpoint():
        set_endpoint(url)
    warnings.warn(
        f"{old} is the aistore SDK's removed DataPipe; the cluster is now ${ENDPOINT_ENV} "
        f"(aisio.set_endpoint({url or endpoint()!r}), done for you)",
        DeprecationWarning,
        stacklevel=4,
    )


class AISFileLister(IterDataPipe[str]):
    """Deprecated: yields the ``ais://`` URL of every object under each prefix URL of
    ``source_datapipe`` (the SDK's removed ``AISFileLister``).

    New spelling: ``aisio.set_endpoint(url); AISSourceLister(list(prefixes), suffixes=None)``.
    """

    def __init__(self, source_datapipe: Iterable[str], url: str | None = None, length: int = -1):
        _take_endpoint(url, "AISFileLister(source_datapipe, url=...)")
        self.source_datapipe = source_datapipe
        self.length = length

    def __iter__(self) -> Iterator[str]:
        for prefix in self.source_datapipe:
            yield from AISSourceLister(prefix, suffixes=None)

    def __len__(self) -> int:
        if self.length < 0:
            raise TypeError(f"{type(self).__name__} has no length unless given one")
        return self.length


class AISFileLoader(IterDataPipe[tuple[str, Any]]):
    """Deprecated: yields ``(url, stream)`` for each ``ais://`` URL of ``source_datapipe`` (the
    SDK's removed ``AISFileLoader``).

    New spelling: ``aisio.set_endpoint(url)``, then ``.load_tar()`` for shards, or
    ``aisio.open_ais_url(u)`` for one object's stream.
    """

    def __init__(self, source_datapipe: Iterable[str], url: str | None = None, length: int = -1):
        _take_endpoint(url, "AISFileLoader(source_datapipe, url=...)")
        self.source_datapipe = source_datapipe
        self.length = length

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for url in self.source_datapipe:
            yield url, open_ais_url(url)

    def __len__(self) -> int:
        if self.length < 0:
            raise TypeError(f"{type(self).__name__} has no length unless given one")
        return self.length
