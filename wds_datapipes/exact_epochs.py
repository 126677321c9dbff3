"""``ExactEpochs``: a shard index in, this rank's and worker's samples of each epoch out.

Each epoch follows the plan of :mod:`wds_datapipes.epoch_plan`: every rank yields the same
number of batches, every sample comes once (``drop``) or at least once with the repeats
flagged (``pad``), and a stopped run resumes exactly where it stopped, on the same or
another topology. This module only reads what the plan says: spans of shards, each
entered at its first sample with one seek or Range request where the index has offsets.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator, Mapping

from .epoch_plan import EpochPlan, PlanSettings, ReaderPlan, Span, SpanList, plan_epoch
from .epoch_state import EpochState, ResumePoint, check_settings, epoch_finished, resume_point
from .errors import IndexMismatchError
from .grouping import group_members, split_key
from .handlers import EXACT_EPOCH_FLAG
from .limits import Limits, get_limits
from .member_places import read_placed
from .openers import ShardUrl, open_shard, stream_size
from .pipe_base import Pipe
from .placed_shuffle import shuffled_by_places
from .shard_index import ShardIndex
from .tar_reader import iter_tar_members
from .topology import EpochClock, ShardingRecord, Topology, loader_worker
from .torch_datapipes import HAVE_TORCH_DATAPIPES, IterDataPipe, traverse_dps

logger = logging.getLogger("wds_datapipes")

PAD_KEY = EXACT_EPOCH_FLAG


class ExactEpochs(Pipe[dict]):
    """Yields this rank's and worker's raw samples of each epoch, by an exact, resumable plan.

    A source pipe: it takes a :class:`~wds_datapipes.shard_index.ShardIndex` (or its
    location) and yields sample dicts like ``group_by_key()``'s, each with a ``__pad__``
    flag (True for the repeats of ``pad`` mode). Every rank yields the same number of
    batches of ``batch_size`` in every epoch, so DDP never waits on a rank that ran out.
    Ranks and workers read contiguous runs of the epoch's sequence, starting and ending
    anywhere inside a shard.

    Args:
        index: a ShardIndex, or the location of its JSON file.
        batch_size: the batch size of the pipeline (``batch_samples(n)``,
            ``decode_batches(..., batch_size=n)`` or the DataLoader's ``batch_size``):
            worker shares are cut in whole batches.
        mode: ``"drop"``: every sample at most once, the few that do not divide evenly
            between ranks are left out (and logged); ``"pad"``: every sample at least once,
            a few repeated to fill, flagged ``__pad__``.
        shuffle: a new shard order and sample order each epoch, drawn from ``seed`` and the
            epoch: the same on every rank and worker, and in a resumed run.
        seed: the seed of every shuffle (loaders' seeds are not used: every rank must agree).
        samples_per_epoch: epochs of this many samples (over all ranks) instead of one pass
            over the data: consecutive windows over passes in new orders.
        rank, world_size: this process's place; by default the loader's
            DistributedReadingService, ``torch.distributed``, or ``RANK``/``WORLD_SIZE``.
        lanes, block: the shuffle's shape: each reader reads ``lanes`` runs of its share side
            by side and yields blocks of ``block`` samples in a random order (the memory
            held is one block of raw samples).
        allow_pipe: with an index location, let its shard URLs be ``pipe:`` commands.
        limits: the largest member, HTTP timeouts, ...: by default the process's
            :func:`~wds_datapipes.limits.get_limits` when the pipe is built.
        views: fields as read-only ``memoryview``s instead of ``bytes``. Where the index
            has member places, they are slices of the read (up to a megabyte) around them:
            one copy per member (page cache to that read) instead of two, and a sample
            keeps its read alive. ``decode_batches`` decodes images from them; ``decode``
            copies each field into ``bytes`` first; other code may need ``bytes(field)``.
            A memoryview cannot be pickled: decode in the DataLoader worker, not after.

    Epochs are counted as the loaders start them; ``set_epoch(e)`` sets the next one, as
    ``DistributedSampler.set_epoch`` does. ``state_dict()`` / ``load_state_dict()`` (also on
    the last pipe of a pipeline built on this one) save and restore the position; see
    :class:`~wds_datapipes.epoch_state.EpochState`.

    Example:
        >>> dp = ExactEpochs("data/index.json", batch_size=64, seed=0).decode("torchrgb8").batch_samples(64)
    """

    def __init__(
        self,
        index: ShardIndex | str,
        *,
        batch_size: int,
        mode: str = "drop",
        shuffle: bool = True,
        seed: int = 0,
        samples_per_epoch: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        lanes: int = 16,
        block: int = 512,
        allow_pipe: bool = False,
        limits: Limits | None = None,
        views: bool = False,
    ):
        self.index = index if isinstance(index, ShardIndex) else ShardIndex.load(index, allow_pipe=allow_pipe)
        self.settings = PlanSettings(seed=seed, batch_size=batch_size, mode=mode, shuffle=shuffle,
                                     samples_per_epoch=samples_per_epoch, lanes=lanes, block=block)
        self._where = ShardingRecord(rank, world_size)
        self.limits = limits or get_limits()
        self.views = views
        self._clock = EpochClock()
        self._resume: EpochState | None = None
        self._run: _Run | None = None

    @property
    def batch_size(self) -> int:
        return self.settings.batch_size

    @property
    def mode(self) -> str:
        return self.settings.mode

    @property
    def seed(self) -> int:
        return self.settings.seed

    # ------------------------------------------------------------ the loaders' hooks

    def apply_sharding(self, num_instances: int, instance_id: int, sharding_group=None) -> None:
        self._where.apply(num_instances, instance_id, sharding_group)

    def set_seed(self, seed: int) -> ExactEpochs:
        """Called by the loaders once per epoch: it marks the epoch's start (the seed is not used)."""
        if self._resume is not None and self._resume.worker is not None and self._worker_state_at_end():
            # A StatefulDataLoader whose saved iterator had finished drops it and starts a new
            # one (a new epoch): the new seed comes between our load_state_dict and the start.
            self._clock.set_epoch(self._resume.epoch + 1)
            self._resume = None
        self._clock.on_set_seed(seed)
        return self

    def _worker_state_at_end(self) -> bool:
        state = self._resume
        plan = plan_epoch(self.index.sizes, self.settings, state.epoch, state.world, state.workers, state.history)
        return state.taken[0] >= plan.split.worker_sizes[state.worker]

    def set_epoch(self, epoch: int) -> ExactEpochs:
        """The next epoch to read (DistributedSampler's convention); call it before each epoch."""
        self._clock.set_epoch(epoch)
        return self

    # ------------------------------------------------------------ reading

    def __iter__(self) -> Iterator[dict]:
        run = self._start()
        self._run = run
        rank, worker = run.topology.rank, run.plan_worker
        yield from read_share(self.index, run.plan.reader(rank, worker), run.plan.reader_spans(rank, worker),
                              run.start, self.limits, self.views)


    def _start(self) -> _Run:
        fresh_copy = self._run is None
        epoch = self._clock.start()
        # A DataLoader worker's copy that is new this epoch: the count it got from the main
        # process is wrong (seeded twice per epoch there), or missing (no DataPipes in torch).
        unreliable = epoch > 0 or not HAVE_TORCH_DATAPIPES
        if fresh_copy and self._clock.counted and unreliable and loader_worker() is not None:
            raise RuntimeError(
                "ExactEpochs cannot count epochs in DataLoader workers that are new copies each epoch "
                "(persistent_workers=False): call dp.set_epoch(epoch) before each epoch, as with "
                "DistributedSampler, or pass persistent_workers=True"
            )
        where = self._where.resolve()
        point = ResumePoint((), 0)
        state, self._resume = self._resume, None
        if state is not None and state.epoch == epoch:
            point = resume_point(state, self.index.sizes, self.settings, where.world, where.workers,
                                 where.rank, where.worker)
        elif state is not None and state.epoch > epoch:
            self._resume = state  # for a later start (this copy's clock is behind the state's epoch)
        plan = plan_epoch(self.index.sizes, self.settings, epoch, where.world, where.workers, point.history)
        if where.rank == 0 and where.worker == 0 and (plan.split.dropped or plan.split.padded):
            logger.info("exact epoch %d: %d samples dropped, %d repeated as pads, to give %d ranks %d samples each",
                        epoch, plan.split.dropped, plan.split.padded, where.world, plan.split.rank_samples)
        return _Run(epoch, where, plan, point)

    def __len__(self) -> int:
        """Samples this rank yields in an epoch (one that is not resumed)."""
        return self._rank_split().rank_samples

    @property
    def batches_per_epoch(self) -> int:
        """Batches of ``batch_size`` this rank yields in an epoch (one that is not resumed), the
        same on every rank and for any number of workers: the steps of a training epoch."""
        return self._rank_split().rank_batches

    def _rank_split(self):
        where = self._where.resolve()
        return plan_epoch(self.index.sizes, self.settings, self._clock.next_epoch(), where.world, 1).split

    # ------------------------------------------------------------ state

    def state_dict(self) -> dict:
        """The position after the samples this pipe has yielded (when it is the last pipe;
        a pipe built on it answers for the items it yielded, see :func:`pipeline_state_dict`)."""
        return self.state_at(self._number_of_samples_yielded).to_dict()

    def load_state_dict(self, state: Mapping | EpochState) -> None:
        """Resume at ``state`` when the next epoch starts (see :class:`EpochState`)."""
        state = EpochState.from_dict(state)
        check_settings(state, self.settings)
        if epoch_finished(state, self.index.sizes, self.settings, self._where.resolve().world):
            self._resume = None
            self._clock.set_epoch(state.epoch + 1)
        else:
            self._resume = state
            self._clock.set_epoch(state.epoch)

    def state_at(self, samples: int) -> EpochState:
        """This reader's state once ``samples`` of its current epoch's samples were consumed
        (counted from where this epoch's iteration started)."""
        run = self._run
        if run is None or self._clock.pending():  # between epochs: the next one, from its start
            run = self._next_run()
            samples = 0
        where = run.topology
        share = run.plan.split.worker_sizes[run.plan_worker]
        return EpochState(epoch=run.epoch, taken=(min(run.point.taken + samples, share),), world=where.world,
                          workers=where.workers, rank=where.rank, worker=run.plan_worker,
                          rotation=run.point.rotation, history=run.point.history, settings=self.settings)

    def _next_run(self) -> _Run:
        """The run the next start would begin (without starting it)."""
        where = self._where.resolve()
        epoch = self._clock.next_epoch()
        point = ResumePoint((), 0)
        if self._resume is not None and self._resume.epoch == epoch:
            point = resume_point(self._resume, self.index.sizes, self.settings, where.world, where.workers,
                                 where.rank, where.worker)
        plan = plan_epoch(self.index.sizes, self.settings, epoch, where.world, where.workers, point.history)
        return _Run(epoch, where, plan, point)


class _Run:
    """The epoch a reader is reading: its plan, its place, and where it started."""

    def __init__(self, epoch: int, topology: Topology, plan: EpochPlan, point: ResumePoint):
        self.epoch, self.topology, self.plan, self.point = epoch, topology, plan, point
        self.plan_worker = (topology.worker + point.rotation) % topology.workers

    @property
    def start(self) -> int:
        return self.point.taken


# ------------------------------------------------------------ reading a share


def read_share(index: ShardIndex, reader: ReaderPlan, spans: SpanList, start: int,
               limits: Limits | None = None, views: bool = False) -> Iterator[dict]:
    """The samples of one reader's share, from output position ``start``, in the plan's order."""
    if start >= reader.length:
        return
    if not reader.shuffle:
        for span in spans.slice(start, reader.length):  # not through _lane_samples: a generator less per sample
            yield from span_samples(index, span, limits, views)
    elif index.places is not None:  # each sample at its place, the lanes from where a shard has none
        yield from shuffled_by_places(index, reader, spans, start, limits or get_limits(), views,
                                      lambda at: _shuffled_lanes(index, reader, spans, at, limits, views))
    else:
        yield from _shuffled_lanes(index, reader, spans, start, limits, views)


def _shuffled_lanes(index: ShardIndex, reader: ReaderPlan, spans: SpanList, start: int, limits: Limits | None,
                    views: bool) -> Iterator[dict]:
    """A shuffled share read lane by lane in shard order, each block held and yielded in its order."""
    if start >= reader.length:
        return
    first_block = start // reader.block_size
    taken = reader.taken_per_lane(start)
    lanes = [_lane_samples(index, spans.slice(a + t, b), limits, views)
             for (a, b), t in zip(reader.lane_bounds(), taken)]
    try:
        for q in range(first_block, reader.blocks):
            members = reader.block_rows(q)
            by_lane: dict[int, list[dict]] = {}
            for lane, _ in members:
                by_lane.setdefault(lane, []).append(next(lanes[lane]))
            seen = dict.fromkeys(by_lane, 0)
            samples = []
            for lane, _ in members:
                samples.append(by_lane[lane][seen[lane]])
                seen[lane] += 1
            order = reader.block_order(q, len(samples))
            skip = start - q * reader.block_size if q == first_block else 0
            for i in order[skip:].tolist():
                yield samples[i]
    finally:
        for lane in lanes:
            lane.close()


def _lane_samples(index: ShardIndex, spans: SpanList, limits: Limits | None, views: bool) -> Iterator[dict]:
    for span in spans:
        yield from span_samples(index, span, limits, views)


def span_samples(index: ShardIndex, span: Span, limits: Limits | None = None, views: bool = False) -> Iterator[dict]:
    """The samples ``span.start`` .. ``span.stop - 1`` of one shard, each with its ``__pad__`` flag.

    By the shard's member places where it has them (their reader is returned as it is: a
    generator less per sample). Otherwise, with offsets in the index, the shard is opened at
    the span's first sample; without, the samples before it are passed over reading headers
    only. A shard that has fewer samples, or more, or another size than the index says is an
    :class:`IndexMismatchError`.
    """
    if index.places is not None:
        info = index.shards[span.shard]
        samples = read_placed(index.places, span.shard, index.url(span.shard), span.start, span.stop,
                              info.filesize, limits or get_limits(), {PAD_KEY: span.pad}, views)
        if samples is not None:
            return samples  # read_placed checked that its places hold the span's samples
    return _scanned_span_samples(index, span, limits, views)


def _scanned_span_samples(index: ShardIndex, span: Span, limits: Limits | None, views: bool) -> Iterator[dict]:
    """:func:`span_samples` read by the shard's headers."""
    url = index.url(span.shard)
    info = index.shards[span.shard]
    offset = index.sample_offset(span.shard, span.start) if span.start else 0
    skip = span.start if offset is None else 0
    to_end = span.stop == info.nsamples  # read to the end of the archive: the count is checked whole
    stream = open_shard(url, start=offset or 0, limits=limits)
    try:
        size = stream_size(stream)
        if info.filesize is not None and size is not None and size != info.filesize:
            raise IndexMismatchError(f"shard {url!r} has {size} bytes, the index says {info.filesize}: "
                                     "it changed since it was indexed; index it again")
        opened = ShardUrl.opened(url)
        skipper = _SampleSkipper(skip) if skip else None
        members = iter_tar_members(stream, opened, start=offset or 0, skip_data=skipper, limits=limits)
        taken = 0
        for sample in group_members(opened, _kept(members) if skipper else members):
            if taken == len(span):
                if to_end:
                    raise IndexMismatchError(f"shard {url!r} has more than {info.nsamples} samples, the index "
                                             f"says {info.nsamples}: it changed since it was indexed; index it again")
                return  # the next sample's first member was read; the rest of the shard is not
            sample[PAD_KEY] = span.pad
            if views:
                for field, value in sample.items():
                    if isinstance(value, bytes):
                        sample[field] = memoryview(value)
            yield sample
            taken += 1
        skipped = min(skipper.samples, skip) if skipper else 0
        if taken < len(span) or skipped < skip:
            raise IndexMismatchError(f"shard {url!r} ends after {span.start - skip + skipped + taken} samples, "
                                     f"the index says {info.nsamples}: it changed since it was indexed; index it again")
    finally:
        stream.close()


def _kept(members: Iterator[tuple[str, bytes | None]]) -> Iterator[tuple[str, bytes]]:
    """The members after the skipped ones (whose bytes are None)."""
    for name, data in members:
        if data is not None:
            yield name, data


class _SampleSkipper:
    """``skip_data`` for the tar reader: True for the members of the first ``count`` samples."""

    def __init__(self, count: int):
        self.count = count
        self.samples = 0  # samples passed over so far
        self.key: str | None = None

    def __call__(self, name: str) -> bool:
        if self.samples > self.count:
            return False
        split = split_key(name)
        if split is None:
            return True
        if split[0] != self.key:
            self.key = split[0]
            self.samples += 1
        return self.samples <= self.count


# ------------------------------------------------------------ state through a pipeline

_SOURCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _exact_source(pipe: IterDataPipe) -> tuple[ExactEpochs, int] | None:
    """The ExactEpochs upstream of ``pipe`` and the samples in each item ``pipe`` yields.

    StatefulDataLoader asks for every batch, so the answer is kept per pipe (weakly).
    """
    if isinstance(pipe, ExactEpochs):
        return pipe, 1
    if pipe in _SOURCES:
        source, unit = _SOURCES[pipe]
        return None if source is None else (source(), unit)
    found = _find_source(pipe, traverse_dps(pipe))
    _SOURCES[pipe] = (None, 0) if found is None else (weakref.ref(found[0]), found[1])
    return found


def _find_source(pipe: IterDataPipe, graph: dict) -> tuple[ExactEpochs, int] | None:
    """Walks down from ``pipe``; each batching pipe on the way multiplies the unit."""
    for node, children in graph.values():
        if isinstance(node, ExactEpochs):
            return node, 1
        below = _find_source(node, children)
        if below is None:
            continue
        source, unit = below
        size = getattr(node, "batch_size", None)
        if isinstance(size, int) and not isinstance(node, ExactEpochs):
            if size != source.settings.batch_size:
                raise ValueError(f"{type(node).__name__} batches by {size}, but ExactEpochs was built with "
                                 f"batch_size={source.settings.batch_size}: they must agree")
            unit *= size
        return source, unit
    return None


def _unwrapped(pipe: IterDataPipe) -> IterDataPipe:
    """The pipe inside the serialization wrapper that DataLoader puts around a DataPipe."""
    return getattr(pipe, "_datapipe", pipe)


def pipeline_state_dict(pipe: IterDataPipe) -> dict | None:
    """The exact epoch's position after what ``pipe`` has yielded; None without an ExactEpochs upstream.

    Registered as ``state_dict`` on every IterDataPipe (and so on the wrapper the
    DataLoaders put around one), which makes StatefulDataLoader save it with its own
    checkpoints. For other pipelines it returns None, and StatefulDataLoader does what
    it did before (replays the epoch's start).
    """
    pipe = _unwrapped(pipe)
    found = _exact_source(pipe)
    if found is None:
        return None
    source, unit = found
    return source.state_at(pipe._number_of_samples_yielded * unit).to_dict()


def pipeline_load_state_dict(pipe: IterDataPipe, state: Mapping | EpochState) -> None:
    """Loads an exact-epoch state into the ExactEpochs upstream of ``pipe``."""
    found = _exact_source(_unwrapped(pipe))
    if found is None:
        raise ValueError(f"{type(pipe).__name__}: an exact-epoch state can only be loaded into a pipeline "
                         "built on ExactEpochs")
    source = found[0]
    source.load_state_dict(state)
    for other in _epoch_aware(_unwrapped(pipe)):  # e.g. a random transform's draws: the same epoch
        if other is not source:
            other.set_epoch(source._clock.next_epoch())


def pipeline_set_epoch(pipe: IterDataPipe, epoch: int) -> None:
    """Sets the next epoch of every pipe upstream of ``pipe`` that draws per-epoch orders
    (:class:`ExactEpochs`, the shard listers' and ``shuffle_samples``' seeds)."""
    targets = _epoch_aware(_unwrapped(pipe))
    if not targets:
        raise AttributeError(f"{type(pipe).__name__} has no set_epoch: nothing upstream draws per-epoch orders")
    for target in targets:
        target.set_epoch(epoch)


def _epoch_aware(pipe: IterDataPipe) -> list:
    """The pipes of ``pipe``'s graph that draw per-epoch orders (they define ``set_epoch``)."""
    return [p for p in _all_pipes(traverse_dps(pipe)) if "set_epoch" in vars(type(p))]


def _all_pipes(graph: dict) -> list:
    pipes = []
    for node, children in graph.values():
        pipes.append(node)
        pipes.extend(_all_pipes(children))
    return pipes


# On every IterDataPipe, and so on the wrapper DataLoader puts around one
# (``loader.dataset.set_epoch(e)`` works as it does for a DistributedSampler).
IterDataPipe.register_function("state_dict", pipeline_state_dict)
IterDataPipe.register_function("load_state_dict", pipeline_load_state_dict)
IterDataPipe.register_function("set_epoch", pipeline_set_epoch)
