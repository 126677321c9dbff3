"""Exporters of the stats, at the room's edge: no stage knows them; they read snapshots and
the observer hook (``enable(observer=...)``, see :mod:`wds_datapipes.stats.probe`).

- :mod:`.tensorboard`: :func:`to_tensorboard`, scalars through a ``SummaryWriter`` (extra
  ``[tensorboard]``);
- :mod:`.prometheus`: :class:`StatsCollector` and :func:`serve_prometheus`, a scrape endpoint
  (extra ``[prometheus]``);
- :mod:`.profiler`: :class:`ProfilerRanges`, ``torch.profiler`` ranges around the stages while
  a profiler records;
- :mod:`.trace`: :class:`TraceFile`, a Chrome / Perfetto trace of every process's stages;
- :mod:`.observers`: :func:`observers`, several observers at once.

The optional libraries are imported when an exporter is used, never at import. The guide:
docs/observability-export.md.
"""

from __future__ import annotations

from .observers import observers
from .profiler import ProfilerRanges
from .prometheus import PrometheusEndpoint, StatsCollector, serve_prometheus
from .tensorboard import to_tensorboard
from .trace import TraceFile

__all__ = [
    "ProfilerRanges",
    "PrometheusEndpoint",
    "StatsCollector",
    "TraceFile",
    "observers",
    "serve_prometheus",
    "to_tensorboard",
]
