"""The ``load_tar`` pipe: shard URLs in, tar members out."""

from __future__ import annotations

from collections.abc import Iterator

from ..errors import WdsError
from ..handlers import Handler, reraise_exception
from ..limits import Limits, get_limits
from ..pipe_base import Pipe
from ..tar import iter_tar_members
from ..torch_datapipes import IterDataPipe, functional_datapipe
from .cache import log_cache_stats
from .openers import ShardUrl, open_shard


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

    def __init__(self, source_datapipe: IterDataPipe[str], handler: Handler = reraise_exception,
                 limits: Limits | None = None):
        self.source_datapipe = source_datapipe
        self.handler = handler
        self.limits = limits or get_limits()

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
        for url in self.source_datapipe:
            try:
                stream = open_shard(url, limits=self.limits)
            except WdsError as exn:
                if self.handler(exn):
                    continue
                raise
            url = ShardUrl.opened(url)
            try:
                yield url, self._guarded(stream, url)
            finally:
                self._close(stream, url)
        log_cache_stats()  # the shard cache's counters at an epoch's end, where it is on

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
            if not self.handler(error):
                raise error from None
