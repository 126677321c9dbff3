"""Prometheus metrics of a run: a collector over every process's record, and a scrape endpoint.

Names follow Prometheus's conventions: the ``wds_datapipes_`` prefix, base units in the name
(``_seconds``, ``_bytes``), counters ending in ``_total``, ratios ending in ``_ratio``. Labels:
``stage``, ``source`` (a shard list, an index or a mixture's source, its secrets redacted),
``scheme``, ``rank`` and ``worker`` (the loader worker's id; ``-1``: the training process
itself; ``-2``: loader workers that told no id, summed). A collector reads the run folder
when scraped, nothing before: stats on without an endpoint cost nothing more.

The counters are each process's totals since ``enable()`` (a worker started again each epoch
adds to its id's); stage seconds of per-sample stages are estimates from timed samples, so
they grow by steps, not by each sample.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from ..recorder import read_records, recorder_for
from ..settings import StatsSettings, current_settings
from ..snapshot import RanksStats, Snapshot, build

__all__ = ["PrometheusEndpoint", "StatsCollector", "serve_prometheus"]

PREFIX = "wds_datapipes"

# (metric name after the prefix, attribute, help): counters, per stage
_STAGE = (
    ("stage_seconds", "seconds", "Time spent in a stage (sampled stages: estimated from timed samples)."),
    ("stage_items", "items", "Items through a stage (URLs, shards, samples, batches: see StageStats)."),
    ("stage_bytes", "bytes", "Bytes read by a stage (as stored: compressed)."),
    ("stage_errors", "errors", "Failures in a stage (raised, or skipped by a handler)."),
    ("stage_retries", "retries", "Retried requests in a stage."),
)
# per source, and per URL scheme (``scheme_*``)
_SOURCE = (
    ("samples", "samples", "Samples taken from it."),
    ("objects", "objects", "Shards opened."),
    ("bytes", "bytes", "Bytes read (as stored)."),
    ("read_seconds", "read_seconds", "Time in its read calls."),
    ("open_seconds", "open_seconds", "Time opening its shards."),
    ("retries", "retries", "Retried requests."),
    ("errors", "errors", "Failed reads and openings."),
    ("cache_hits", "cache_hits", "Shard cache hits (reads along a download in progress included)."),
    ("cache_misses", "cache_misses", "Shard cache misses."),
    ("cache_bytes", "cache_bytes", "Bytes read from the shard cache's disk."),
)
# the training loop's wait (watch), per rank: counters, then gauges
_WAIT_COUNTERS = (
    ("wait_steps", "steps", "Training steps watched (each epoch's first batch apart)."),
    ("wait_ready_steps", "ready_steps", "Steps whose batch was ready (next() returned within ready_s)."),
    ("wait_blocked_seconds", "blocked_seconds", "Time blocked in next() on the loader, over the steps."),
    ("wait_step_seconds", "step_seconds", "Time between handing a batch over and the next call (the steps)."),
    ("wait_first_batch_seconds", "first_seconds", "Waits for each epoch's first batch (workers starting)."),
)
_WAIT_GAUGES = (
    ("wait_readiness_ratio", "readiness", "Share of steps that did not wait for data."),
    ("wait_share_ratio", "wait_share", "Share of the loop's time spent waiting for data."),
    ("wait_stall_seconds", "stall_per_batch", "Mean exposed stall per batch."),
    ("wait_longest_seconds", "longest_seconds", "The longest wait of one step."),
)
_RANK_GAUGES = (
    ("rank_stall_seconds", "stall_per_batch", "A rank's wait per batch over the last gather's interval."),
    ("rank_wait_share_ratio", "wait_share", "A rank's share of time waiting over the last gather's interval."),
    ("rank_batches_per_second", "batches_per_s", "A rank's batches per second over the last gather's interval."),
)


def _snapshots(settings: StatsSettings | None) -> list[tuple[int, int, Snapshot]]:
    """(rank, worker, snapshot of that worker's processes) for each worker of the run."""
    if settings is None:
        return []
    groups: dict[tuple[int, int], list[dict]] = {}
    for record in read_records(settings):
        groups.setdefault((record["rank"], record["worker"]), []).append(record)
    return [(rank, worker, build(records)) for (rank, worker), records in sorted(groups.items())]


class StatsCollector:
    """A Prometheus collector of the current run (register it into a ``CollectorRegistry``, or
    let :func:`serve_prometheus` do it): each scrape reads every process's record.

    Args:
        settings: the run whose folder is read at each scrape (default: the current run then).

    Example:
        >>> from prometheus_client import REGISTRY, start_http_server
        >>> REGISTRY.register(wd.stats.StatsCollector())
        >>> start_http_server(9464)
    """

    def __init__(self, settings: StatsSettings | None = None):
        self._settings = settings

    def describe(self) -> list:
        """Nothing: registering reads no records (a scrape does)."""
        return []

    def collect(self) -> Iterator[Any]:
        """The metric families of a scrape (prometheus_client calls it)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        settings = self._settings if self._settings is not None else current_settings()
        groups = _snapshots(settings)
        yield from _by_worker(groups, CounterMetricFamily, GaugeMetricFamily)
        recorder = recorder_for(settings) if settings is not None else None
        yield from _trainer(groups, recorder.ranks if recorder is not None else None, CounterMetricFamily,
                            GaugeMetricFamily)


def _by_worker(groups: list[tuple[int, int, Snapshot]], counter: Callable, gauge: Callable) -> Iterator[Any]:
    families = {}
    for name, _, text in _STAGE:
        families[name] = counter(f"{PREFIX}_{name}", text, labels=["stage", "rank", "worker"])
    for kind in ("source", "scheme"):
        for name, _, text in _SOURCE:
            families[f"{kind}_{name}"] = counter(f"{PREFIX}_{kind}_{name}", text,
                                                 labels=[kind, "rank", "worker"])
    mixed = counter(f"{PREFIX}_mixture_samples", "Samples drawn from a mixture's source in an epoch.",
                    labels=["mixer", "epoch", "source", "rank", "worker"])
    target = gauge(f"{PREFIX}_mixture_target_ratio", "A mixture source's target weight (normalised).",
                   labels=["mixer", "epoch", "source", "rank"])
    targets = {}
    for rank, worker, numbers in groups:
        where = [str(rank), str(worker)]
        for stage in numbers.stages.values():
            if stage.items or stage.seconds or stage.errors or stage.retries:
                for name, field, _ in _STAGE:
                    families[name].add_metric([stage.name, *where], float(getattr(stage, field)))
        for kind, table in (("source", numbers.sources), ("scheme", numbers.schemes)):
            for label, source in table.items():
                for name, field, _ in _SOURCE:
                    families[f"{kind}_{name}"].add_metric([label, *where], float(getattr(source, field)))
        for mix in numbers.mixtures:
            mixed.add_metric([mix.mixer, str(mix.epoch), mix.source, *where], float(mix.samples))
            targets[(mix.mixer, str(mix.epoch), mix.source, str(rank))] = mix.target
    for key, value in sorted(targets.items()):
        target.add_metric(list(key), value)
    yield from families.values()
    yield mixed
    yield target


def _trainer(groups: list[tuple[int, int, Snapshot]], ranks: RanksStats | None, counter: Callable,
             gauge: Callable) -> Iterator[Any]:
    """The training processes' own numbers (their loop's wait), and the last gather across ranks."""
    waits = [(str(rank), numbers.wait) for rank, _, numbers in groups if numbers.wait is not None]
    for names, kind in ((_WAIT_COUNTERS, counter), (_WAIT_GAUGES, gauge)):
        for name, field, text in names:
            family = kind(f"{PREFIX}_{name}", text, labels=["rank"])
            for rank, wait in waits:
                family.add_metric([rank], float(getattr(wait, field)))
            yield family
    if ranks is not None:
        for name, field, text in _RANK_GAUGES:
            family = gauge(f"{PREFIX}_{name}", text, labels=["rank"])
            for row in ranks.ranks:
                family.add_metric([str(row.rank)], float(getattr(row, field)))
            yield family
        family = gauge(f"{PREFIX}_straggler_rank", "The straggler rank at the last gather (-1: none).")
        family.add_metric([], float(-1 if ranks.straggler is None else ranks.straggler))
        yield family


@dataclasses.dataclass
class PrometheusEndpoint:
    """A running scrape endpoint (:func:`serve_prometheus`): its ``port``, ``url``, and :meth:`close`."""

    server: Any
    thread: Any
    registry: Any
    port: int
    url: str

    def close(self) -> None:
        """Stops serving and frees the port."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve_prometheus(port: int = 9464, addr: str = "127.0.0.1", registry: Any = None) -> PrometheusEndpoint:
    """Serves the current run's metrics for Prometheus to scrape at ``http://addr:port/metrics``
    (a thread of this process); returns the endpoint.

    Args:
        port: the port (0: a free one, see the endpoint's ``port``). One per rank on a node: e.g.
            ``9464 + local_rank``.
        addr: the address to listen on: this machine only by default; ``"0.0.0.0"`` for a
            Prometheus server elsewhere.
        registry: a ``prometheus_client.CollectorRegistry`` to register a :class:`StatsCollector`
            in and serve (default: a new one with ours alone; pass ``prometheus_client.REGISTRY``
            to serve the process's default metrics beside them).

    Example:
        >>> endpoint = wd.stats.serve_prometheus(9464 + rank)
        >>> ...
        >>> endpoint.close()
    """
    from prometheus_client import CollectorRegistry, start_http_server

    registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
    registry.register(StatsCollector())
    server, thread = start_http_server(port, addr=addr, registry=registry)
    bound = server.server_address[1]
    host = addr if addr not in ("0.0.0.0", "::", "") else "127.0.0.1"
    return PrometheusEndpoint(server, thread, registry, bound, f"http://{host}:{bound}/metrics")
