"""See where the time goes: the training loop's wait on data, per stage, source, worker and rank.

Off by default; when off, the pipes read no clock and count nothing, and no file is made. ::

    import wds_datapipes as wd
    wd.stats.enable()                          # before building the pipeline
    loader = DataLoader(pipeline(), batch_size=None, num_workers=4)
    for batch in wd.stats.watch(loader):       # times next(): the loop's wait
        train_step(batch)
    print(wd.stats.report())                   # what limits, and the setting that would move it
    numbers = wd.stats.snapshot()              # the same as plain numbers (a picklable dataclass)

The modules: :mod:`.settings` (on and off; the run folder), :mod:`.tallies` (the counters
of one process), :mod:`.recorder` (one process's counters, and how loader workers publish
them), :mod:`.probe` (what stage code measures with, and how each stage is timed; the
observer hook for exporters) and :mod:`.meters` (its sampler, timed streams and batch
meter), :mod:`.snapshot` (the numbers), :mod:`.wait` (the loop's wait), :mod:`.ranks` (the
gather across ranks), :mod:`.report` (the rules and the text), :mod:`.watchdog` and
:mod:`.stalls` (the stall watchdog: ``watch(loader, stall_s=...)``). Every stage reports into
this room; it imports none of them.

For exporters (they live at this room's edge; no stage knows them): :func:`snapshot` and
:meth:`Snapshot.since` for counters over an interval (TensorBoard scalars, Prometheus
counters: stage, source, scheme, worker and rank are the snapshot's keys); ``enable(observer=
factory)`` for the timed intervals as they happen, in every process that measures (a trace of
the workers' stages, ``torch.profiler`` ranges: see :mod:`.probe`); :func:`read_records` and
:func:`build` for the raw per-process records; :data:`STAGES` and :data:`ALL_STAGES` for the
stage names. The exporters built on them are in :mod:`.export` (their names are here too):
:func:`to_tensorboard`, :func:`serve_prometheus` and :class:`StatsCollector`,
:class:`ProfilerRanges`, :class:`TraceFile`, :func:`observers`.
"""

from __future__ import annotations

from .export import (
    ProfilerRanges,
    PrometheusEndpoint,
    StatsCollector,
    TraceFile,
    observers,
    serve_prometheus,
    to_tensorboard,
)
from .ranks import gather_ranks, rank_stats
from .recorder import read_records, register_counters
from .report import Diagnosis, diagnose
from .report import report as _report_text
from .settings import StatsSettings, disable, enable, enabled
from .snapshot import (
    MixStats,
    RanksStats,
    RankStats,
    Snapshot,
    SourceStats,
    StageStats,
    WaitStats,
    WorkerStats,
    build,
)
from .snapshot import current as _current
from .tallies import ALL_STAGES, STAGES
from .wait import watch
from .watchdog import stacks


def snapshot() -> Snapshot:
    """What this run measured so far, in this process and its loader workers (an empty,
    ``enabled=False`` snapshot when stats are off). Workers' counts are at most ``interval_s``
    old, and complete once their epoch ended."""
    return _current()


def report(numbers: Snapshot | None = None) -> str:
    """A short text naming what limits the run and the setting that would move it (of
    ``numbers``, or of a snapshot taken now)."""
    return _report_text(numbers if numbers is not None else snapshot())


__all__ = [
    "ALL_STAGES",
    "STAGES",
    "Diagnosis",
    "MixStats",
    "ProfilerRanges",
    "PrometheusEndpoint",
    "RankStats",
    "RanksStats",
    "Snapshot",
    "SourceStats",
    "StageStats",
    "StatsCollector",
    "StatsSettings",
    "TraceFile",
    "WaitStats",
    "WorkerStats",
    "build",
    "diagnose",
    "disable",
    "enable",
    "enabled",
    "gather_ranks",
    "observers",
    "rank_stats",
    "read_records",
    "register_counters",
    "report",
    "serve_prometheus",
    "snapshot",
    "stacks",
    "to_tensorboard",
    "watch",
]
