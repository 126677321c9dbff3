"""Who is reading (rank, world, worker, workers) and which epoch it is: one home for both.

The shard lister, the sample shuffler and the exact-epoch reader all need to know their
rank and worker and to draw a new random order each epoch. The loaders tell them in
different ways, and this module turns all of them into the same answers:

- **Rank and world.** Explicit arguments first; then what a loader applied through
  ``apply_sharding`` (DataLoader2's ``DistributedReadingService``, or the plain
  DataLoader's combined rank-and-worker split, where that split counts more than one
  rank); then ``torch.distributed`` when it is initialised; then what was captured from
  it when the pipe was pickled for a worker process (a spawned worker has no process
  group of its own); then the ``RANK`` / ``WORLD_SIZE`` environment variables that
  ``torchrun`` sets; else rank 0 of 1. DataLoader takes its ranks from a process group
  only: with ``RANK``/``WORLD_SIZE`` and no process group it splits by worker alone, and
  the ranks come from the environment (:meth:`ShardingRecord.loader_splits_ranks` says
  which happened).
- **Worker and workers.** What DataLoader2's ``MultiProcessingReadingService`` applied,
  else the DataLoader's worker info, else worker 0 of 1.
- **Epochs.** :class:`EpochClock` counts them as the loaders start them: a ``set_seed``
  call (DataLoader and DataLoader2 make one per epoch, before iterating) or, for direct
  iteration, a new iterator.
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Mapping
from dataclasses import dataclass

# torch is looked up, not imported: a process that has not imported it has no process group and is
# no DataLoader worker, and the writer (``create``) asks for its rank without paying for torch.


def __getattr__(name: str):
    if name == "SHARDING_PRIORITIES":  # a name this module has held (tests/test_old_names.py)
        from .torch_datapipes import SHARDING_PRIORITIES

        return SHARDING_PRIORITIES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Topology:
    """A reader's place: ``rank`` of ``world`` ranks, ``worker`` of ``workers`` per rank."""

    rank: int = 0
    world: int = 1
    worker: int = 0
    workers: int = 1

    def __post_init__(self):
        if not (0 <= self.rank < self.world and 0 <= self.worker < self.workers):
            raise ValueError(f"impossible topology: rank {self.rank} of {self.world}, "
                             f"worker {self.worker} of {self.workers}")


def distributed_rank_world() -> tuple[int, int] | None:
    """(rank, world) from an initialised ``torch.distributed``, else from ``RANK``/``WORLD_SIZE``."""
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is not None and world is not None:
        try:
            return int(rank), int(world)
        except ValueError:
            raise ValueError(f"RANK={rank!r} / WORLD_SIZE={world!r} are not integers") from None
    return None


def launcher_rank_world() -> tuple[int, int] | None:
    """(rank, world) as a launcher set them: :func:`distributed_rank_world` (torchrun's
    ``RANK``/``WORLD_SIZE``), else SLURM's ``SLURM_PROCID``/``SLURM_NTASKS``; None outside both."""
    found = distributed_rank_world()
    if found is not None:
        return found
    rank, world = os.environ.get("SLURM_PROCID"), os.environ.get("SLURM_NTASKS")
    if rank is not None and world is not None:
        try:
            return int(rank), int(world)
        except ValueError:
            raise ValueError(f"SLURM_PROCID={rank!r} / SLURM_NTASKS={world!r} are not integers") from None
    return None


def loader_worker() -> tuple[int, int] | None:
    """(worker id, number of workers) inside a DataLoader worker process, else None."""
    torch = sys.modules.get("torch")
    info = None if torch is None else torch.utils.data.get_worker_info()
    return (info.id, info.num_workers) if info is not None else None


def worker_and_rank() -> tuple[int, int]:
    """(DataLoader worker id, distributed rank); 0 where there is none."""
    worker = loader_worker()
    ranks = distributed_rank_world()
    return (worker[0] if worker else 0), (ranks[0] if ranks else 0)


def epoch_rng(*parts: object) -> random.Random:
    """A generator seeded from ``parts``; string seeds hash the same in every process."""
    return random.Random("/".join(map(str, parts)))


class ShardingRecord:
    """What the loaders applied to a pipe through ``apply_sharding``, and the rank captured
    when it was pickled; :meth:`resolve` turns it into a :class:`Topology`."""

    def __init__(self, rank: int | None = None, world: int | None = None):
        if (rank is None) != (world is None):
            raise ValueError("give both rank and world_size, or neither")
        self.explicit = None if rank is None or world is None else (rank, world)
        self.distributed: tuple[int, int] | None = None  # (rank, world)
        self.multiprocessing: tuple[int, int] | None = None  # (worker, workers)
        self.combined: tuple[int, int] | None = None  # the plain DataLoader's (instance, instances)
        self.captured: tuple[int, int] | None = None

    def take_groups(self, groups: Mapping) -> None:
        """Takes the loaders' splits from a ShardingFilter's ``groups`` ({group: (instances, instance)})."""
        from .torch_datapipes import SHARDING_PRIORITIES

        found = {group: (instance, instances) for group, (instances, instance) in groups.items()}
        self.distributed = found.get(SHARDING_PRIORITIES.DISTRIBUTED)
        self.multiprocessing = found.get(SHARDING_PRIORITIES.MULTIPROCESSING)
        self.combined = found.get(SHARDING_PRIORITIES.DEFAULT)

    def apply(self, num_instances: int, instance_id: int, group=None) -> None:
        from .torch_datapipes import SHARDING_PRIORITIES

        if group == SHARDING_PRIORITIES.DISTRIBUTED:
            self.distributed = (instance_id, num_instances)
        elif group == SHARDING_PRIORITIES.MULTIPROCESSING:
            self.multiprocessing = (instance_id, num_instances)
        else:
            self.combined = (instance_id, num_instances)

    def capture(self) -> None:
        """Called when the pipe is pickled: keep the process group's rank for spawned workers."""
        found = distributed_rank_world()
        if found is not None:
            self.captured = found

    def resolve(self) -> Topology:
        worker, workers = self.multiprocessing or loader_worker() or (0, 1)
        ranks = self._loader_ranks(workers) or distributed_rank_world() or self.captured or (0, 1)
        if self.explicit is not None:
            if self.distributed is not None and self.distributed != self.explicit:
                raise ValueError(f"rank/world_size given as {self.explicit}, but the loader's "
                                 f"DistributedReadingService says {self.distributed}")
            ranks = self.explicit
        return Topology(ranks[0], ranks[1], worker, workers)

    def loader_splits_ranks(self) -> bool:
        """Whether a loader split by rank (and so gave every rank the same seeds): a
        DistributedReadingService, or a DataLoader that saw a process group."""
        workers = (self.multiprocessing or loader_worker() or (0, 1))[1]
        return self._loader_ranks(workers) is not None

    def _loader_ranks(self, workers: int) -> tuple[int, int] | None:
        """(rank, world) as a loader split them, or None where none split by rank."""
        if self.distributed is not None:
            return self.distributed
        if self.combined is None or self.multiprocessing is not None:
            return None
        # DataLoader splits among world * workers readers, reader worker * world + rank
        instance, instances = self.combined
        world = instances // workers
        if instances % workers or instance // world != (loader_worker() or (0, 1))[0]:
            raise ValueError(f"cannot read rank and worker from the loader's split {instance} of {instances} "
                             f"with {workers} workers")
        # world 1: a DataLoader without a process group split by worker only (RANK/WORLD_SIZE are not its)
        return (instance % world, world) if world > 1 else None

    def __getstate__(self) -> dict:
        self.capture()
        return dict(self.__dict__)


class EpochClock:
    """Counts epochs as the loaders start them, or takes them from ``set_epoch``.

    DataLoader2 calls ``set_seed`` once per epoch in each worker before iterating, and so
    do DataLoader's persistent workers; direct iteration calls nothing. So: a ``set_seed``
    with a new seed starts the next epoch, an iterator that no ``set_seed`` announced
    starts one too, and a repeat of the announced seed (the worker's copy hearing the
    main process's epoch again) changes nothing. ``set_epoch(e)`` (DistributedSampler's
    convention) makes the next start epoch ``e`` whatever seeds come before it: the only
    reliable way where workers are fresh copies of the main process's pipe each epoch
    (DataLoader with ``persistent_workers=False``), whose main process seeds its copy
    twice per epoch.
    """

    def __init__(self) -> None:
        self.epoch = -1
        self.counted = False  # whether the epoch last started was counted, not set
        self._announced: int | None = None  # the seed of a set_seed not yet followed by a start
        self._explicit: int | None = None  # set_epoch's value, for the next start

    def on_set_seed(self, seed: int) -> None:
        if self._explicit is not None or self._announced == seed:
            return
        self._announced = seed
        self.epoch += 1

    def set_epoch(self, epoch: int) -> None:
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._explicit = epoch
        self._announced = None

    def pending(self) -> bool:
        """Whether an epoch was announced (``set_seed``, ``set_epoch``) but has not started."""
        return self._announced is not None or self._explicit is not None

    def next_epoch(self) -> int:
        """The epoch the next iterator reads, if it starts now."""
        if self._explicit is not None:
            return self._explicit
        return self.epoch if self._announced is not None else self.epoch + 1

    def start(self) -> int:
        """The epoch an iterator that starts now reads."""
        self.epoch, self.counted = self.next_epoch(), self._explicit is None
        self._announced = self._explicit = None
        return self.epoch


class EpochSeed:
    """The seed of a random pipe: the user's, the loader's and a fallback, mixed with the epoch.

    ``set_seed`` takes the loader's seed (the loaders call it each epoch). With neither a
    user seed nor a loader seed, a fallback drawn when the pipe is built is used, so
    worker copies of one pipe agree with each other.
    """

    def __init__(self, seed: int | None):
        self.seed = seed
        self.loader_seed: int | None = None
        self._fallback = random.getrandbits(64)
        self.epoch = 0

    def set_seed(self, seed: int) -> None:
        self.loader_seed = seed

    def next_rng(self, *extra: object, user_seed_only: bool = False) -> random.Random:
        """This epoch's generator (``extra`` mixed in), then the next epoch.

        ``user_seed_only`` leaves the loader's seed out: for orders that processes with
        loaders seeded independently (ranks under DataLoader2 without a
        DistributedReadingService) must still agree on.
        """
        loader_seed = None if user_seed_only else self.loader_seed
        fallback = self._fallback if self.seed is None and loader_seed is None else None
        rng = epoch_rng(self.seed, loader_seed, fallback, self.epoch, *extra)
        self.epoch += 1
        return rng
