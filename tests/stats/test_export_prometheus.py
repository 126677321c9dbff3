"""The Prometheus endpoint, scraped over HTTP (urllib) and parsed by prometheus_client's own
text parser: the independent oracle of what a Prometheus server reads."""

from __future__ import annotations

import os
import re
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest  # the [prometheus] extra, in [dev]
from prometheus_client.parser import text_string_to_metric_families
from stats_data import fork_loader, write_shards

import wds_datapipes as wd


def _scrape(url: str) -> dict[str, dict[tuple, float]]:
    """Sample name -> {sorted label items: value}, from one scrape."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_a_scrape_equals_the_snapshot_per_stage_source_and_worker(tmp_path, stats_on):
    """Oracles: prometheus_client's parser over an HTTP scrape, the snapshot (summed over the
    workers), the shard files' sizes (os.stat), the samples the loop received, the rank and
    worker ids DataLoader gave."""
    paths = write_shards(tmp_path, 4, 20, size=400)
    dp = wd.ShardLister(paths).load_tar().group_by_key().map_fields({"cls": int}).batch_samples(4)
    received = sum(len(batch["__key__"]) for batch in wd.stats.watch(fork_loader(dp)))
    numbers = wd.stats.snapshot()
    endpoint = wd.stats.serve_prometheus(port=0)
    try:
        scraped = _scrape(endpoint.url)
    finally:
        endpoint.close()
    names = set(scraped)
    assert all(re.fullmatch(r"wds_datapipes_[a-z_]+", name) for name in names)
    assert {"wds_datapipes_stage_seconds_total", "wds_datapipes_stage_bytes_total",
            "wds_datapipes_source_bytes_total", "wds_datapipes_scheme_retries_total",
            "wds_datapipes_wait_blocked_seconds_total", "wds_datapipes_wait_readiness_ratio"} <= names
    read_bytes = scraped["wds_datapipes_stage_bytes_total"]
    by_worker = {dict(labels)["worker"]: value for labels, value in read_bytes.items() if dict(labels)["stage"] == "read"}
    assert set(by_worker) == {"0", "1"} and sum(by_worker.values()) == sum(os.path.getsize(p) for p in paths)
    for name, stage in numbers.stages.items():
        got = [v for labels, v in scraped["wds_datapipes_stage_items_total"].items() if dict(labels)["stage"] == name]
        assert sum(got) == stage.items, name
        seconds = [v for labels, v in scraped["wds_datapipes_stage_seconds_total"].items()
                   if dict(labels)["stage"] == name]
        assert sum(seconds) == pytest.approx(stage.seconds, rel=1e-9, abs=1e-12), name
    samples = scraped["wds_datapipes_source_samples_total"]
    assert sum(samples.values()) == received == 80
    for label, source in numbers.sources.items():
        assert sum(v for labels, v in samples.items() if dict(labels)["source"] == label) == source.samples
    assert {dict(labels)["rank"] for labels in samples} == {"0"}
    wait = numbers.wait
    assert scraped["wds_datapipes_wait_steps_total"] == {(("rank", "0"),): wait.steps}
    assert scraped["wds_datapipes_wait_readiness_ratio"][(("rank", "0"),)] == pytest.approx(wait.readiness)


def test_a_collector_in_a_registry_of_ones_own(tmp_path, stats_on):
    """The collector registered into a user's registry: its exposition parses, and the counter
    of shards opened per scheme is the shards read (oracle: the shard count, parser as above)."""
    paths = write_shards(tmp_path, 3, 5)
    list(wd.ShardLister(paths).load_tar().group_by_key())  # in the training process: worker -1
    registry = CollectorRegistry()
    registry.register(wd.stats.StatsCollector())
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    assert families["wds_datapipes_scheme_objects"].type == "counter"
    [sample] = [s for s in families["wds_datapipes_scheme_objects"].samples if s.name.endswith("_total")]
    assert sample.labels == {"scheme": "file", "rank": "0", "worker": "-1"} and sample.value == 3


def test_stats_off_serve_no_numbers():
    """Stats off: the endpoint answers with no sample of ours (oracle: the parsed scrape)."""
    endpoint = wd.stats.serve_prometheus(port=0)
    try:
        scraped = _scrape(endpoint.url)
    finally:
        endpoint.close()
    assert not any(values for values in scraped.values())
