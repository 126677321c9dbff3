"""The ``group_by_key`` pipe: tar members in, WebDataset samples (dicts) out."""

from __future__ import annotations

import itertools
import logging
import re
import warnings
from collections.abc import Iterable, Iterator

from ..errors import SampleError
from ..handlers import Handler, reraise_exception
from ..pipe_base import Pipe
from ..torch_datapipes import IterDataPipe, functional_datapipe
from .openers import ShardUrl, plain_url

# webdataset's key rule, used where the fast split below does not apply.
_KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META_RE = re.compile(r"__[^/]*__($|/)")

logger = logging.getLogger("wds_datapipes")


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
    webdataset makes it (without its ``__local_path__``: see docs/security.md). Consecutive
    members with the same key form one sample; a sample never spans two shards. When ``load_tar``'s handler skipped the rest of a shard after an error (a
    cut stream, a corrupt member), the sample being assembled is dropped too, and logged:
    it may lack fields.

    Shard boundaries: a source that offers ``shard_members()`` (``load_tar()`` does: it
    yields (url, iterator of (name, bytes)) per opened shard) is read through it, which
    saves two generator hops per member. Over any other source of (url, name, bytes)
    tuples, a shard is a run of members from one opening of a shard: ``load_tar`` marks
    each opening with its own :class:`~wds_datapipes.shards.openers.ShardUrl`, so a pipe
    placed in between keeps the boundaries, even for a shard read twice in a row
    (``"a.tar::a.tar"``). For plain string URLs, a run of equal URLs is one shard.

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
        shard_members = getattr(self.source_datapipe, "shard_members", None)
        shards = shard_members() if callable(shard_members) else _shards_of_tuples(self.source_datapipe)
        for url, members in shards:
            yield from group_members(url, members, self.handler, self.report_split_keys)


def _opening(member: tuple) -> object:
    """What tells one opening of a shard from the next: the ShardUrl object, else the URL."""
    url = member[0]
    return id(url) if isinstance(url, ShardUrl) else url


def _shards_of_tuples(source: Iterable[tuple[str, str, bytes]]) -> Iterator[tuple[str, Iterator]]:
    for _, run in itertools.groupby(source, key=_opening):
        first = next(run)
        yield first[0], _names_and_data(first, run)  # noqa: B031 - the run is read once, after its first


def _names_and_data(first: tuple, rest: Iterable[tuple]) -> Iterator[tuple[str, bytes]]:
    yield first[1], first[2]
    for _, name, data in rest:
        yield name, data


def group_members(url: str, members: Iterable[tuple[str, bytes]], handler: Handler = reraise_exception,
                  report_split_keys: bool = False) -> Iterator[dict]:
    """The samples of one shard's (name, bytes) members: runs of one key, never past the shard.

    When ``url`` is a :class:`ShardUrl` whose reading was cut (``url.cut``), the last
    sample is dropped: the members that would have completed it never came.
    """
    sample: dict | None = None
    key = None
    skipping = False  # the current sample hit an error the handler chose to skip
    seen: set[str] = set()
    plain = plain_url(url)  # samples carry a plain str, as webdataset's do; ``url`` keeps the opening
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
            if sample is not None and not skipping:
                yield sample
            if report_split_keys:
                _check_split(url, member_key, name, seen)
            key, skipping = member_key, False
            sample = {"__key__": key, "__url__": plain}
        elif suffix in sample:
            if not skipping:
                error = SampleError(url, key, f"suffix {suffix!r} repeats within the sample", member=name)
                if not handler(error):
                    raise error
            skipping = True
        sample[suffix] = data
    if sample is not None and not skipping:
        if getattr(url, "cut", False):
            logger.warning("shard %r: sample %r dropped: the shard ended in an error before the sample was "
                           "known to be whole", str(url), key)
            return
        yield sample


def _check_split(url: str, key: str, name: str, seen: set[str]) -> None:
    if key in seen:
        warnings.warn(
            f"shard {url!r}: key {key!r} comes back at member {name!r} after other keys; "
            "its files form separate samples",
            stacklevel=2,
        )
    seen.add(key)
