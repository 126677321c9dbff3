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

from wds_datapipes.torch_datapipes import IterDataPipe

from .client import ENDPOINT_ENV, endpoint, set_endpoint
from .listing import AISSourceLister
from .opener import open_ais_url


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
