"""Storage as the stats see it: the shard cache's hits, misses and bytes (cold, then warm) are the
cache's own, and a server that fails has its retries counted per source and scheme."""

from __future__ import annotations

import dataclasses
import os

from fault_proxy import FaultProxy, Request
from shard_server import ShardServer
from stats_data import fork_loader, write_shards

import wds_datapipes as wd

_FIELDS = ("hits", "read_along", "misses", "source_bytes", "disk_bytes")


def _ledger() -> dict[str, int]:
    return dataclasses.asdict(wd.cache_stats(shared=True))


def test_cold_and_warm_cache_counts_are_the_caches_own(tmp_path, stats_on):
    """Two epochs of HTTP shards through the shard cache, under two workers. Oracles: the cache's
    own ledger (every process's counters, kept by the cache in its directory), the server's count
    of GETs and the shards' sizes."""
    paths = write_shards(tmp_path / "data", 4, 10, size=3000)
    size = sum(os.path.getsize(p) for p in paths)
    with ShardServer(str(tmp_path / "data")) as server:
        wd.set_cache(tmp_path / "cache", "1GB")
        try:
            spec = server.url("s-{000..003}.tar")
            dp = wd.ShardLister(spec).load_tar().group_by_key().batch_samples(5)
            before = _ledger()
            list(wd.stats.watch(fork_loader(dp)))
            cold, after_cold, cold_gets = wd.stats.snapshot(), _ledger(), sum(server.gets.values())
            list(wd.stats.watch(fork_loader(dp)))
            warm, after_warm = wd.stats.snapshot().since(cold), _ledger()
            warm_gets = sum(server.gets.values()) - cold_gets
        finally:
            wd.set_cache(None)
    for snapshot, start, end in ((cold, before, after_cold), (warm, after_cold, after_warm)):
        assert {k: snapshot.cache.get(k, 0) for k in _FIELDS} == {k: end[k] - start[k] for k in _FIELDS}
    source = cold.sources[spec]
    assert (source.cache_misses, source.cache_hits, cold_gets, cold.cache["source_bytes"]) == (4, 0, 4, size)
    source = warm.sources[spec]
    assert (source.cache_hits, source.cache_misses, warm_gets) == (4, 0, 0)
    assert source.cache_bytes == warm.cache["disk_bytes"] == size == source.bytes
    assert warm.schemes["http"].cache_hits == 4


def _one_fault_each(request: Request) -> str:
    """The first GET of shard 0 answered 503 (a retry at the opening); the first of shard 1 cut
    (a resume while reading)."""
    if request.method != "GET" or request.number:
        return "ok"
    return {"/s-000.tar": "503", "/s-001.tar": "cut"}.get(request.path, "ok")


def test_retries_are_counted_per_source_stage_and_scheme(tmp_path, stats_on):
    """A proxy that fails one request of each shard in front of the shard server. Oracle: the
    proxy's own count of the faults its clients met."""
    write_shards(tmp_path, 2, 10, size=20000)
    with ShardServer(str(tmp_path)) as server, FaultProxy(server.url("").rstrip("/"), _one_fault_each) as proxy:
        spec = f"{proxy.url}/s-{{000..001}}.tar"
        dp = wd.ShardLister(spec).load_tar().group_by_key().batch_samples(5)
        batches = list(wd.stats.watch(fork_loader(dp)))
        faults = proxy.faults
    s = wd.stats.snapshot()
    assert sum(len(b["__key__"]) for b in batches) == 20 and faults == 2
    assert s.sources[spec].retries == s.schemes["http"].retries == faults
    assert (s.stages["open"].retries, s.stages["read"].retries) == (1, 1)
    assert s.sources[spec].errors == 0
