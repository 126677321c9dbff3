"""The ``load_tar`` pipe: shard URLs in, tar members out."""

from __future__ import annotations

from collections.abc import Iterator

from ..errors import ShardReadError, WdsError
from ..handlers import Handler, reraise_exception
from ..limits import Limits, get_limits
from ..pipe_base import Pipe
from ..stats.probe import current as current_probe
from ..stats.probe import probe as stats_probe
from ..stats.settings import current_settings
from ..stats.stalls import note_shard
from ..tar import iter_tar_members
from ..torch_datapipes import IterDataPipe, functional_datapipe
from .openers import ShardUrl, open_shard, report_stream_layer, url_scheme


@functional_datapipe("load_tar")
class TarLoader(Pipe[tuple[str, str, bytes]]):
    """Yields (shard url, member name, bytes) for each file in each tar shard (functional name: ``load_tar``).

    Shards are opened through the scheme registry (:mod:`wds_datapipes.shards.openers`) and read
    sequentially, in archive order; gzip, bzip2, xz and zstd shards are recognised by their
    first bytes. Directories, links and other non-files are skipped.

    Args:
        source_datapipe: yields shard URLs (e.g. a :class:`ShardLister`).
        handler: called with the :class:`ShardOpenError` (or :class:`ShardReadError`) or
            :class:`ShardFormatError` of a shard that cannot be opened or read to its end;
            if it returns True, the rest of that shard is skipped (what was read of it
            has been yielded) and loading goes on with the next shard. ``group_by_key``
            then drops the sample it was assembling from that shard, which may lack fields.
        limits: the largest member, HTTP timeouts and retries, ...: by default the
            process's :func:`~wds_datapipes.limits.get_limits` when the pipe is built.

    Example:
        >>> for url, name, data in ShardLister("data/train-{0..3}.tar").load_tar(): ...
    """

    _stats = None  # a pipe pickled before stats existed measures nothing

    def __init__(self, source_datapipe: IterDataPipe[str], handler: Handler = reraise_exception,
                 limits: Limits | None = None):
        self.source_datapipe = source_datapipe
        self.handler = handler
        self.limits = limits or get_limits()
        self._stats = current_settings()  # stats on or off travel with the pipe, as the limits do

    def __iter__(self) -> Iterator[tuple[str, str, bytes]]:
        for url, members in self.shard_members():
            for name, data in members:
                yield url, name, data

    def shard_members(self) -> Iterator[tuple[str, Iterator[tuple[str, bytes]]]]:
        """Yields (shard url, iterator of (member name, bytes)) for each shard.

        The members of a shard must be consumed before the next shard is asked for.
        ``group_by_key`` reads through this directly: it saves two generator hops per
        member (see benchmarks/bench_pipeline.py).
        """
        probe = stats_probe(self._stats)
        label = source_label(self) if probe is not None else ""
        for url in self.source_datapipe if probe is None else probe.listed(self.source_datapipe, label):
            try:
                if probe is None:
                    stream = open_shard(url, limits=self.limits)
                else:  # timed and counted: the opening, then each read call of the stream
                    scheme = url_scheme(url)
                    note = note_shard(url)  # the stall watchdog's: this thread's shard, its offset once open
                    stream = probe.opened(open_shard, probe.target("open", scheme, label), url, limits=self.limits)
                    stream = note.stream = probe.reading(stream, probe.target("read", scheme, label))
            except WdsError as exn:
                if self.handler(exn):
                    continue
                raise
            url = ShardUrl.opened(url)
            try:
                yield url, self._guarded(stream, url)
            finally:
                self._close(stream, url)
        report_stream_layer()  # the shard cache's counters at an epoch's end, where it is on

    def _close(self, stream, url: ShardUrl) -> None:
        try:
            stream.close()  # a pipe: command's exit status is checked here
        except WdsError as exn:
            # Not a cut: the tar was read to its end-of-archive block, its samples are whole.
            if not self.handler(exn):
                raise

    def _guarded(self, stream, url: ShardUrl) -> Iterator[tuple[str, bytes]]:
        try:
            yield from iter_tar_members(stream, url, limits=self.limits)
        except WdsError as exn:
            error = exn
            try:
                stream.close()
            except WdsError as closing:  # a failed pipe: command explains a short stream best
                closing.__context__ = exn
                error = closing
            url.cut = True  # set before the handler, which may raise
            probe = current_probe()
            if probe is not None and not isinstance(error, ShardReadError):  # read errors count where they occur
                probe.stages["tar"].errors += 1
            if not self.handler(error):
                raise error from None


def source_label(pipe: IterDataPipe) -> str:
    """What stats call the source of a reader: its shard lister's spec (the first of several,
    and how many more), else ``"shards"``."""
    for _ in range(8):
        specs = getattr(pipe, "specs", None)
        if isinstance(specs, str):
            return specs
        if isinstance(specs, (list, tuple)) and specs and all(isinstance(s, str) for s in specs):
            return specs[0] if len(specs) == 1 else f"{specs[0]} (+{len(specs) - 1} more)"
        pipe = getattr(pipe, "source_datapipe", None)
        if pipe is None:
            break
    return "shards"
