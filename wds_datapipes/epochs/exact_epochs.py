"""``ExactEpochs``: a shard index in, this rank's and worker's samples of each epoch out.

Each epoch follows the plan of :mod:`wds_datapipes.epochs.plan`: every rank yields the same
number of batches, every sample comes once (``drop``) or at least once with the repeats
flagged (``pad``), and a stopped run resumes exactly where it stopped, on the same or
another topology. This module keeps the epochs, the loaders' hooks and the state; :mod:`.reading` reads
what the plan says.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

from ..limits import Limits, get_limits
from ..pipe_base import Pipe
from ..topology import EpochClock, ShardingRecord, Topology, loader_worker
from ..torch_datapipes import HAVE_TORCH_DATAPIPES
from .index import ShardIndex
from .plan import EpochPlan, PlanSettings, plan_epoch
from .reading import read_share
from .state import EpochState, ResumePoint, check_settings, epoch_finished, resume_point

logger = logging.getLogger("wds_datapipes")


class ExactEpochs(Pipe[dict]):
    """Yields this rank's and worker's raw samples of each epoch, by an exact, resumable plan.

    A source pipe: it takes a :class:`~wds_datapipes.epochs.index.ShardIndex` (or its
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
    :class:`~wds_datapipes.epochs.state.EpochState`.

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
        a pipe built on it answers for the items it yielded, see :func:`~wds_datapipes.loaders.hooks.pipeline_state_dict`)."""
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
