"""The aistore SDK's source objects (buckets, objects, object groups) as this library's ``ais://`` specs.

``aistore.pytorch`` (SDK 1.x) listed ``ais_sources``; :class:`~aisio.listing.AISSourceLister`
still takes them, through these translations, with a warning that spells the new call.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

from aistore.sdk.bucket import Bucket
from aistore.sdk.multiobj import ObjectGroup
from aistore.sdk.obj.object import Object


class ExactObject(str):
    """An ``ais://bucket/object`` spec that names one object exactly (not a prefix); it must exist."""


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
