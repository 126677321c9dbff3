"""The ``group_by_key`` pipe: tar members in, WebDataset samples (dicts) out."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator

from ..errors import SampleError  # noqa: F401 - names this module has held (tests/test_old_names.py)
from ..handlers import Handler, reraise_exception
from ..pipe_base import Pipe
from ..stats.probe import probe as stats_probe
from ..stats.settings import current_settings
from ..torch_datapipes import IterDataPipe, functional_datapipe
from .keys import group_members, split_key  # noqa: F401 - the pure key rule (split_key: a name held here)
from .openers import ShardUrl

logger = logging.getLogger("wds_datapipes")


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
        self._stats = current_settings()  # stats on or off travel with the pipe

    _stats = None  # a pipe pickled before stats existed measures nothing

    def __iter__(self) -> Iterator[dict]:
        shard_members = getattr(self.source_datapipe, "shard_members", None)
        shards = shard_members() if callable(shard_members) else _shards_of_tuples(self.source_datapipe)
        probe = stats_probe(self._stats)
        sampler = probe.shared_sampler("tar") if probe is not None else None
        for url, members in shards:
            samples = group_members(url, members, self.handler, self.report_split_keys)
            if sampler is None:
                yield from samples
            else:  # one sample in a gap timed (tar parsing and grouping; the reads in it count apart)
                io = probe.io  # what load_tar opened this shard as: its source counts the samples
                yield from sampler.wrap(samples, io.source if io is not None else None)


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
