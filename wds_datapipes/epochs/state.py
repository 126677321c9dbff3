"""The resumable state of an exact epoch: small, plain, and enough to restart anywhere.

A state says which epoch, how far each reader got in it, on which topology, and which
topologies came before within that epoch. With the plan's settings (the seed above all)
and the shard sizes, :mod:`wds_datapipes.epochs.plan` recomputes every reader's order,
so the state never grows with the data: a few integers per worker.

Three forms, one class:

- **A rank's state from the training loop's step count**, for DataLoader and DataLoader2:
  ``EpochState(epoch=3, batches=120)`` (this rank took 120 batches of epoch 3). Add
  ``world=`` / ``workers=`` when the run that saved it had another topology.
- **A worker's state**, what :class:`~wds_datapipes.ExactEpochs` reports from inside a
  worker (StatefulDataLoader saves one per worker with its own checkpoint):
  ``worker=w`` and ``taken=(samples,)``.
- **A rank's state from per-worker counts**: ``taken=(n0, n1, ...)``;
  :meth:`EpochState.from_loader_state` builds it from a StatefulDataLoader checkpoint,
  to resume on another number of workers or ranks.

A mixture's state (:class:`~wds_datapipes.MixedEpochs`) also says, per source, its window of
the epoch and its size (:class:`SourceWindow`), and holds the mixture's settings, so that
the epoch finishes as it was planned whatever the resumed pipe's weights.

Ranks are assumed to step together (DDP does: every step all-reduces), so one rank's
counts stand for every rank's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field

from .mixture import MixSettings
from .plan import PlanSettings, Segment, next_worker, worker_batches

FORMAT = "wds_datapipes.epoch_state/1"
PlanFor = Callable[[int, int], object]  # (world, workers) -> the plan of a state's epoch on that topology


@dataclass(frozen=True)
class EpochState:
    """How far an exact epoch got; see the module docstring for the three forms."""

    epoch: int
    batches: int | None = None
    taken: tuple[int, ...] | None = None
    world: int | None = None
    workers: int | None = None
    rank: int | None = None
    worker: int | None = None
    rotation: int = 0
    history: tuple[Segment, ...] = ()
    settings: PlanSettings | MixSettings | None = field(default=None, compare=False)
    mixture: tuple[SourceWindow, ...] | None = None  # a mixture's epoch: each source's window

    def __post_init__(self):
        if self.epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {self.epoch}")
        if (self.batches is None) == (self.taken is None):
            raise ValueError("an EpochState gives either batches (a rank's step count) or taken (samples per worker)")
        if self.batches is not None and self.batches < 0:
            raise ValueError(f"batches must be >= 0, got {self.batches}")
        if self.worker is not None and (self.taken is None or len(self.taken) != 1):
            raise ValueError("a worker's state gives taken=(samples,) for that worker")

    def epoch_label(self) -> str:
        """How the state reads in a message: ``EpochState(epoch=3, batches=120)``."""
        fields = {"epoch": self.epoch, "batches": self.batches, "taken": self.taken, "world": self.world,
                  "workers": self.workers}
        return "EpochState(" + ", ".join(f"{k}={v}" for k, v in fields.items() if v is not None) + ")"

    # ------------------------------------------------------------ plain dicts (checkpoints)

    def to_dict(self) -> dict:
        """The state as plain values (ints, lists, strings) for a checkpoint; :meth:`from_dict` reads it back."""
        out = {"format": FORMAT, "epoch": self.epoch}
        for name in ("batches", "world", "workers", "rank", "worker", "rotation"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.taken is not None:
            out["taken"] = list(self.taken)
        out["history"] = [[s.world, s.workers, list(s.taken)] for s in self.history]
        if isinstance(self.settings, MixSettings):
            out["settings"] = self.settings.to_dict()
        elif self.settings is not None:
            out["settings"] = asdict(self.settings)
        if self.mixture is not None:
            out["mixture"] = [[w.name, w.start, w.count, w.samples, w.shards, w.skip_pass, w.skip]
                              for w in self.mixture]
        return out

    @classmethod
    def from_dict(cls, data: Mapping) -> EpochState:
        """The state that :meth:`to_dict` gave (an EpochState passes through); raises ValueError for a
        dict of another format."""
        if isinstance(data, EpochState):
            return data
        if data.get("format") != FORMAT:
            raise ValueError(f"not an exact-epoch state (format {data.get('format')!r}, expected {FORMAT!r})")
        settings, mixture = data.get("settings"), data.get("mixture")
        if settings:
            settings = MixSettings.from_dict(settings) if mixture is not None else PlanSettings(**settings)
        return cls(
            epoch=int(data["epoch"]),
            batches=data.get("batches"),
            taken=None if data.get("taken") is None else tuple(int(n) for n in data["taken"]),
            world=data.get("world"), workers=data.get("workers"),
            rank=data.get("rank"), worker=data.get("worker"), rotation=int(data.get("rotation", 0)),
            history=tuple(Segment(int(w), int(k), tuple(int(n) for n in t)) for w, k, t in data.get("history", [])),
            settings=settings or None,
            mixture=None if mixture is None else tuple(SourceWindow(str(w[0]), *(int(x) for x in w[1:]))
                                                       for w in mixture),
        )

    @classmethod
    def from_loader_state(cls, loader_state: Mapping) -> EpochState:
        """The rank's state inside a ``StatefulDataLoader.state_dict()``: its workers' counts
        joined, so that it can be loaded on another number of workers or ranks."""
        found = list(_worker_states(loader_state))
        if not found:
            raise ValueError("no exact-epoch state in this loader state: was the dataset built on ExactEpochs?")
        states = [cls.from_dict(s) for s in found]
        if any(s.worker is None for s in states):
            return states[0]  # a single-process loader: the dataset's own state is the rank's
        first = states[0]
        by_worker = {s.worker: s for s in states}
        if len(by_worker) != first.workers or any(s.epoch != first.epoch for s in states):
            raise ValueError("the loader state holds workers of different epochs or is missing workers")
        return cls(epoch=first.epoch, taken=tuple(by_worker[w].taken[0] for w in range(first.workers)),
                   world=first.world, workers=first.workers, history=first.history, settings=first.settings,
                   mixture=first.mixture)


@dataclass(frozen=True)
class SourceWindow:
    """A mixture's source in a saved epoch: its window (``start``, ``count``, ``skip_pass``,
    ``skip``: ``mixture.Window``) of its run of passes, and its index's ``samples`` and
    ``shards`` (to see that it is the same data)."""

    name: str
    start: int
    count: int
    samples: int
    shards: int
    skip_pass: int = 0
    skip: int = 0


def _worker_states(value: object):
    """Every exact-epoch state dict nested anywhere in ``value``."""
    if isinstance(value, Mapping):
        if value.get("format") == FORMAT:
            yield value
            return
        for item in value.values():
            yield from _worker_states(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _worker_states(item)


def epoch_finished(state: EpochState, plan_for: PlanFor, world: int) -> bool:
    """Whether ``state`` is at the end of its epoch (the next epoch then starts afresh);
    ``plan_for(world, workers)`` is the plan of the state's epoch on that topology.

    It does not depend on the number of workers of the run that loads it: a rank's batches
    per epoch are the same for any number of workers.
    """
    world = world if state.world is None else state.world
    if state.worker is not None:
        # One worker's state (StatefulDataLoader's): a loader resumed there first finishes
        # that epoch, with nothing if the worker had read all of its share.
        return False
    if state.batches is not None:
        return state.batches >= plan_for(world, 1).split.rank_batches
    plan = plan_for(world, len(state.taken))
    return all(t >= n for t, n in zip(state.taken, plan.split.worker_sizes))


@dataclass(frozen=True)
class ResumePoint:
    """Where a reader starts an epoch: the earlier segments, and the samples its share had
    given. ``rotation``: loader worker ``w`` reads the plan's worker ``(w + rotation) % workers``,
    so that a loader, which always starts its round robin at worker 0, takes the batches in
    the order the stopped run would have."""

    history: tuple[Segment, ...]
    taken: int
    rotation: int = 0


def resume_point(state: EpochState, plan_for: PlanFor, batch_size: int, world: int, workers: int,
                 rank: int, worker: int) -> ResumePoint:
    """Where loader worker ``worker`` of rank ``rank`` (on ``world`` x ``workers``) resumes
    ``state``'s epoch, which has not finished (see :func:`epoch_finished`)."""
    old_world = world if state.world is None else state.world
    old_workers = workers if state.workers is None else state.workers
    if state.worker is not None:  # one worker's own state (StatefulDataLoader): it resumes only itself
        if (old_world, old_workers) != (world, workers) or (worker + state.rotation) % workers != state.worker:
            raise ValueError(f"this state belongs to worker {state.worker} of {old_workers} on {old_world} ranks; "
                             "to resume on another topology, join the workers' states with "
                             "EpochState.from_loader_state(loader.state_dict())")
        return ResumePoint(state.history, state.taken[0], state.rotation)  # a finished worker yields no more
    old = plan_for(old_world, old_workers)
    b = batch_size
    if state.batches is not None:
        per_worker = worker_batches(state.batches, old.split.worker_sizes, b)
        taken = tuple(min(n * b, size) for n, size in zip(per_worker, old.split.worker_sizes))
        batches = state.batches
    else:
        taken = state.taken
        if len(taken) != old_workers:
            raise ValueError(f"taken has {len(taken)} counts for {old_workers} workers")
        batches = sum(-(-t // b) for t in taken)
    if (old_world, old_workers) == (world, workers):
        rotation = next_worker(batches, old.split.worker_sizes, b)
        return ResumePoint(state.history, taken[(worker + rotation) % workers], rotation)
    return ResumePoint(state.history + (Segment(old_world, old_workers, taken),), 0)
