"""What ``ExactEpochs`` and ``MixedEpochs`` share: epochs as the loaders start them, the loaders'
hooks, where each reader starts (fresh, resumed, or resumed on another topology), and the state.

A subclass says what an epoch's plan is (``_plan``: one dataset's, or a mixture's) and how
a reader reads its part of it (``_read``); the plan answers ``split`` (how many samples
each worker of every rank reads) and ``reader(rank, worker)``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

from ..limits import Limits, get_limits
from ..pipe_base import Pipe
from ..stats.probe import probe as stats_probe
from ..stats.settings import current_settings
from ..topology import EpochClock, ShardingRecord, Topology, loader_worker
from ..torch_datapipes import HAVE_TORCH_DATAPIPES
from .plan import Segment
from .state import EpochState, ResumePoint, epoch_finished, resume_point

logger = logging.getLogger("wds_datapipes")


class EpochPipe(Pipe[dict]):
    """The base of the exact-epoch source pipes (see the module's description)."""

    def __init__(self, settings, rank: int | None, world_size: int | None, limits: Limits | None, views: bool):
        self.settings = settings
        self._where = ShardingRecord(rank, world_size)
        self.limits = limits or get_limits()
        self.views = views
        self._clock = EpochClock()
        self._resume: EpochState | None = None
        self._run: Run | None = None
        self._stats = current_settings()  # stats on or off travel with the pipe

    _stats = None  # a pipe pickled before stats existed measures nothing

    # ------------------------------------------------------------ what a subclass says

    def _plan(self, epoch: int, world: int, workers: int, history: tuple[Segment, ...] = (),
              state: EpochState | None = None):
        """The plan of ``epoch`` on ``world`` x ``workers`` after ``history``; ``state``: the
        state it resumes (its own settings may hold for its epoch)."""
        raise NotImplementedError

    def _read(self, run: Run) -> Iterator[dict]:
        raise NotImplementedError

    def _accept(self, state: EpochState) -> None:
        """Raises ValueError where ``state`` cannot be resumed by this pipe."""

    def _adopt(self, state: EpochState, finished: bool) -> None:
        """Takes what a loaded ``state`` says about the epochs after its own."""

    def _state_fields(self, run: Run) -> dict:
        """The fields of a state that say which plan ``run`` follows (its settings)."""
        return {"settings": self.settings}

    # ------------------------------------------------------------ the settings

    @property
    def batch_size(self) -> int:
        return self.settings.batch_size

    @property
    def mode(self) -> str:
        return self.settings.mode

    @property
    def seed(self) -> int:
        return self.settings.seed

    @property
    def samples_per_epoch(self) -> int | None:
        return self.settings.samples_per_epoch

    @property
    def lanes(self) -> int:
        return self.settings.lanes

    @property
    def block(self) -> int:
        return self.settings.block

    # ------------------------------------------------------------ the loaders' hooks

    def apply_sharding(self, num_instances: int, instance_id: int, sharding_group=None) -> None:
        self._where.apply(num_instances, instance_id, sharding_group)

    def set_seed(self, seed: int) -> EpochPipe:
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
        plan = self._plan(state.epoch, state.world, state.workers, state.history, state)
        return state.taken[0] >= plan.split.worker_sizes[state.worker]

    def set_epoch(self, epoch: int) -> EpochPipe:
        """The next epoch to read (DistributedSampler's convention); call it before each epoch."""
        self._clock.set_epoch(epoch)
        return self

    # ------------------------------------------------------------ reading

    def __iter__(self) -> Iterator[dict]:
        run = self._start()
        self._run = run
        probe = stats_probe(self._stats)
        if probe is None:
            yield from self._read(run)
            return
        where = run.topology  # the readers below measure through this thread's probe
        probe.place(where.rank, where.world, where.worker, where.workers)
        try:
            yield from self._read(run)
        finally:
            probe.ended()

    def _start(self) -> Run:
        fresh_copy = self._run is None
        epoch = self._clock.start()
        # A DataLoader worker's copy that is new this epoch: the count it got from the main
        # process is wrong (seeded twice per epoch there), or missing (no DataPipes in torch).
        unreliable = epoch > 0 or not HAVE_TORCH_DATAPIPES
        if fresh_copy and self._clock.counted and unreliable and loader_worker() is not None:
            raise RuntimeError(
                f"{type(self).__name__} cannot count epochs in DataLoader workers that are new copies each epoch "
                "(persistent_workers=False): call dp.set_epoch(epoch) before each epoch, as with "
                "DistributedSampler, or pass persistent_workers=True"
            )
        state, self._resume = self._resume, None
        if state is not None and state.epoch > epoch:
            self._resume = state  # for a later start (this copy's clock is behind the state's epoch)
        run = self._run_of(epoch, state if state is not None and state.epoch == epoch else None)
        split, where = run.plan.split, run.topology
        if where.rank == 0 and where.worker == 0 and (split.dropped or split.padded):
            logger.info("exact epoch %d: %d samples dropped, %d repeated as pads, to give %d ranks %d samples each",
                        epoch, split.dropped, split.padded, where.world, split.rank_samples)
        return run

    def _run_of(self, epoch: int, state: EpochState | None) -> Run:
        """The run of ``epoch`` for this reader, resuming ``state`` (of that epoch) if given."""
        where = self._where.resolve()
        point = ResumePoint((), 0)
        if state is not None:
            point = resume_point(state, self._plan_of(state), self.settings.batch_size, where.world, where.workers,
                                 where.rank, where.worker)
        return Run(epoch, where, self._plan(epoch, where.world, where.workers, point.history, state), point)

    def _plan_of(self, state: EpochState):
        return lambda world, workers: self._plan(state.epoch, world, workers, state.history, state)

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
        epoch = self._clock.next_epoch()
        state = self._resume if self._resume is not None and self._resume.epoch == epoch else None
        return self._plan(epoch, where.world, 1, (), state).split

    # ------------------------------------------------------------ state

    def state_dict(self) -> dict:
        """The position after the samples this pipe has yielded (when it is the last pipe;
        a pipe built on it answers for the items it yielded, see
        :func:`~wds_datapipes.loaders.hooks.pipeline_state_dict`)."""
        return self.state_at(self._number_of_samples_yielded).to_dict()

    def load_state_dict(self, state: Mapping | EpochState) -> None:
        """Resume at ``state`` when the next epoch starts (see :class:`EpochState`)."""
        state = EpochState.from_dict(state)
        self._accept(state)
        finished = epoch_finished(state, self._plan_of(state), self._where.resolve().world)
        self._adopt(state, finished)
        if finished:
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
            epoch = self._clock.next_epoch()
            pending = self._resume if self._resume is not None and self._resume.epoch == epoch else None
            run = self._run_of(epoch, pending)
            samples = 0
        where = run.topology
        share = run.plan.split.worker_sizes[run.plan_worker]
        return EpochState(epoch=run.epoch, taken=(min(run.point.taken + samples, share),), world=where.world,
                          workers=where.workers, rank=where.rank, worker=run.plan_worker,
                          rotation=run.point.rotation, history=run.point.history, **self._state_fields(run))


class Run:
    """The epoch a reader is reading: its plan, its place, and where it started."""

    def __init__(self, epoch: int, topology: Topology, plan, point: ResumePoint):
        self.epoch, self.topology, self.plan, self.point = epoch, topology, plan, point
        self.plan_worker = (topology.worker + point.rotation) % topology.workers

    @property
    def start(self) -> int:
        return self.point.taken

    def reader(self):
        """This reader's part of the plan."""
        return self.plan.reader(self.topology.rank, self.plan_worker)
