"""The record a storage back end registers for one URL scheme.

Every place shards live (local disk, HTTP, ``pipe:``, ``ais://``, object stores) gives the
library the same four things, each optional except ``open``:

- ``open(url, start=0, limits=None)`` -> a binary stream from byte ``start``. Streams of
  remote objects carry ``size`` and ``version`` attributes (ETag, generation, ...), which
  the cache and the index stamp them with.
- ``stamp(url, limits)`` -> ``(size, version)`` of the object as its source says now, or
  None where it cannot tell (the cache revalidates by it; ``index --places`` records it).
- ``list(spec, limits)`` -> the URLs a spec names (a glob, a prefix), lazily, page by page,
  so the first shard can open before a large listing ends. None: the spec is one URL.
- ``put(path, url, limits)`` -> the version written: a local file uploaded so that the
  object appears whole under ``url`` or not at all.

:func:`wds_datapipes.shards.openers.register_backend` registers one; packages do it lazily
through the ``wds_datapipes.backends`` entry-point group (a :class:`Backend` object), so
DataLoader workers find a scheme without an import in user code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

Open = Callable[..., BinaryIO]
Stamp = Callable[..., "tuple[int | None, str | None] | None"]
List = Callable[..., Iterator[str]]
Put = Callable[..., "str | None"]

# What a shard's name ends with: a directory or a prefix lists these.
SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst", ".tzst")


@dataclass(frozen=True)
class Backend:
    """What one URL scheme's back end offers (see the module's docstring for each call)."""

    scheme: str
    open: Open
    stamp: Stamp | None = None
    list: List | None = None
    put: Put | None = None

    def __post_init__(self):
        if not self.scheme or self.scheme != self.scheme.lower():
            raise ValueError(f"a back end's scheme is a lowercase name, got {self.scheme!r}")
        if not callable(self.open):
            raise TypeError(f"the {self.scheme!r} back end's open is not callable: {self.open!r}")
