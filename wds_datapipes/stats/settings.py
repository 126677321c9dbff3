"""Whether stats are on, and the run folder where the processes of one run publish their counters.

Off by default. :func:`enable`, in the training process before the pipeline is built, makes
a :class:`StatsSettings` that every pipe of ours takes when it is built (as it takes
:class:`~wds_datapipes.limits.Limits`) and carries, pickled, into loader workers, forked or
spawned. With stats off the pipes carry ``None`` and measure nothing; no folder is made.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["StatsSettings", "current_settings", "disable", "enable", "enabled"]

_SHM = "/dev/shm"


@dataclass(frozen=True)
class StatsSettings:
    """One run of stats, as the pipes carry it (small; it pickles with them).

    Attributes:
        directory: the run folder. Each process other than the one that called
            :func:`enable` (a loader worker) publishes its counters there, as one small
            JSON file replaced whole; :func:`~wds_datapipes.stats.snapshot` reads them.
        owner: the process id of the process that called :func:`enable` (it keeps its own
            counters in memory, and removes the folder at :func:`disable` or its exit).
        token: this run's id (a worker's counters are this run's when the tokens match).
        interval_s: the most time between two publications of a worker's counters (they are
            also published when a pipe's epoch ends).
        sample_every: per-sample stages time about one sample in this many (a jittered
            gap, so that no period in the data lines up with it); counts are exact.
        observer: a picklable factory ``observer(process: dict) -> object`` made once per
            process that measures, where exporters see each timed interval (see
            :mod:`wds_datapipes.stats.probe`); None: none.
        rank: the process group's rank where the settings were pickled (a spawned worker
            has no process group of its own), or None.
    """

    directory: str
    owner: int
    token: str
    interval_s: float = 0.5
    sample_every: int = 64
    observer: Callable[[dict], Any] | None = None
    rank: int | None = None

    def __reduce__(self):
        from ..topology import distributed_rank_world

        found = distributed_rank_world()
        rank = found[0] if found is not None else self.rank
        return (StatsSettings, (self.directory, self.owner, self.token, self.interval_s, self.sample_every,
                                self.observer, rank))


_settings: StatsSettings | None = None


def enable(*, directory: str | os.PathLike | None = None, interval_s: float = 0.5, sample_every: int = 64,
           observer: Callable[[dict], Any] | None = None) -> StatsSettings:
    """Turn stats on for the pipes built from now on (and their loader workers); returns the settings.

    Call it in the training process before building the pipeline. Each call starts a new
    run, its counts at zero (an earlier run's folder is removed).

    Args:
        directory: where the run folder is made: by default ``/dev/shm`` where it exists
            (memory: publishing touches no disk), else the temp dir.
        interval_s: the most time between two publications of a worker's counters.
        sample_every: per-sample stages time one sample in about this many (1 to 128).
        observer: a picklable factory of an observer per process, for exporters.

    Example:
        >>> wd.stats.enable()
        >>> loader = DataLoader(pipeline(), batch_size=None, num_workers=4)
        >>> for batch in wd.stats.watch(loader): ...
        >>> print(wd.stats.report())
    """
    global _settings
    if not 1 <= int(sample_every) <= 128:  # countdowns stay small ints: no allocation per sample
        raise ValueError(f"sample_every must be 1 to 128, not {sample_every!r}")
    if not interval_s > 0:
        raise ValueError(f"interval_s must be > 0, not {interval_s!r}")
    disable()
    parent = os.fspath(directory) if directory is not None else _default_parent()
    folder = tempfile.mkdtemp(prefix=f"wds-stats-{os.getpid()}-", dir=parent)  # 0700: only this user reads and writes it
    _settings = StatsSettings(folder, os.getpid(), uuid.uuid4().hex[:16], float(interval_s), int(sample_every),
                              observer)
    atexit.register(_remove, folder, os.getpid())
    return _settings


def disable() -> None:
    """Turn stats off for the pipes built from now on, and forget this run (its folder is removed)."""
    global _settings
    settings, _settings = _settings, None
    if settings is not None:  # this process's recorder of the run stops counting: its run is not current
        _remove(settings.directory, settings.owner)


def enabled() -> bool:
    """Whether stats are on in this process (pipes built now will measure)."""
    return _settings is not None


def current_settings() -> StatsSettings | None:
    """What a pipe built now takes (and pickles): the run's settings, or None when stats are off."""
    return _settings


def is_current(settings: StatsSettings) -> bool:
    """Whether ``settings`` (carried by a pipe) belong to a live run in this process: in the process
    that enabled them, the run not disabled or replaced since; in any other process, a run whose
    folder still exists (its owner removes it at the end)."""
    if settings.owner == os.getpid():
        return _settings is not None and _settings.token == settings.token
    return os.path.isdir(settings.directory)


def _default_parent() -> str:
    if os.path.isdir(_SHM) and os.access(_SHM, os.W_OK | os.X_OK):
        return _SHM
    return tempfile.gettempdir()


def _remove(folder: str, owner: int) -> None:
    if os.getpid() == owner:  # a forked child never removes its parent's run
        shutil.rmtree(folder, ignore_errors=True)
