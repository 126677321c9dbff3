"""The ``group_by_key`` pipe: tar members in, WebDataset samples (dicts) out."""

from __future__ import annotations

import itertools
import re
import warnings
from collections.abc import Iterable, Iterator
from operator import itemgetter

from torch.utils.data import IterDataPipe, functional_datapipe

from .errors import SampleError
from .handlers import Handler, reraise_exception
from .pipe_base import Pipe
from .tar_loader import TarLoader

# webdataset's key rule, used where the fast split below does not apply.
_KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META_RE = re.compile(r"__[^/]*__($|/)")


def split_key(name: str) -> tuple[str, str] | None:
    """(key, suffix) of a member name as webdataset makes them, or None for a skipped name.

    The key runs to the first dot of the last path component, the suffix is the rest,
    lowercased: ``a/b.c.d.JPG`` -> (``a/b``, ``c.d.jpg``). Names without such a dot and
    ``__meta__`` names are skipped.
    """
    if name.startswith("__") and (_META_RE.match(name) or ("/" not in name and name.endswith("__"))):
        return None
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot > slash + 1 and "\n" not in name:  # the common case, same result as the regex
        return name[:dot], name[dot + 1 :].lower()
    match = _KEY_RE.match(name)
    return (match.group(1), match.group(2).lower()) if match else None


@functional_datapipe("group_by_key")
class WebDatasetGrouper(Pipe[dict]):
    """Yields one sample dict per run of members sharing a key (functional name: ``group_by_key``).

    A sample is ``{"__key__": key, "__url__": shard url, suffix: bytes, ...}``, as
    webdataset makes it. Consecutive members with the same key form one sample; a sample
    never spans two shards.

    Over ``load_tar()`` it sees each shard's start; over any other source of tuples a
    shard is a run of members with the same URL, so the same shard read twice in a row
    (``"a.tar::a.tar"``) would join its last and first samples there.

    Args:
        source_datapipe: yields (shard url, member name, bytes), e.g. ``load_tar()``.
        handler: called with a :class:`SampleError` when a suffix repeats within one
            sample; if it returns True, that whole sample is skipped.
        report_split_keys: warn when a key comes back later in the same shard (its
            files are not contiguous, so it becomes two samples).

    Example:
        >>> ShardLister("data/train-{0..3}.tar").load_tar().group_by_key()
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, str, bytes]],
        handler: Handler = reraise_exception,
        report_split_keys: bool = False,
    ):
        self.source_datapipe = source_datapipe
        self.handler = handler
        self.report_split_keys = report_split_keys

    def __iter__(self) -> Iterator[dict]:
        source = self.source_datapipe
        if type(source) is TarLoader:
            # Read the loader's per-shard member iterators directly instead of its
            # per-member pipe hops (benchmarks/bench_pipeline.py, "unfused" row).
            shards = source.shard_members()
        else:
            shards = ((url, ((name, data) for _, name, data in members))
                      for url, members in itertools.groupby(source, key=itemgetter(0)))
        for url, members in shards:
            yield from self._shard_samples(url, members)

    def _shard_samples(self, url: str, members: Iterable[tuple[str, bytes]]) -> Iterator[dict]:
        """The samples of one shard: a sample never spans two shards."""
        sample: dict | None = None
        key = None
        bad = False  # the current sample hit an error the handler chose to skip
        seen: set[str] = set()
        for name, data in members:
            # split_key's common case, inlined: this loop runs once per tar member.
            slash = name.rfind("/")
            dot = name.find(".", slash + 1)
            if dot > slash + 1 and not name.startswith("__") and "\n" not in name:
                member_key, suffix = name[:dot], name[dot + 1 :].lower()
            else:
                split = split_key(name)
                if split is None:
                    continue
                member_key, suffix = split
            if member_key != key:
                if sample is not None and not bad:
                    yield sample
                if self.report_split_keys:
                    self._check_split(url, member_key, name, seen)
                key, bad = member_key, False
                sample = {"__key__": key, "__url__": url}
            elif suffix in sample:
                if not bad:
                    error = SampleError(url, key, f"suffix {suffix!r} repeats within the sample", member=name)
                    if not self.handler(error):
                        raise error
                bad = True
            sample[suffix] = data
        if sample is not None and not bad:
            yield sample

    @staticmethod
    def _check_split(url: str, key: str, name: str, seen: set[str]) -> None:
        if key in seen:
            warnings.warn(
                f"shard {url!r}: key {key!r} comes back at member {name!r} after other keys; "
                "its files form separate samples",
                stacklevel=4,
            )
        seen.add(key)
