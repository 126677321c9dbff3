"""The report is right on injected bottlenecks: slow storage, slow decoding, a slow per-sample
transform (ours, and a user's .map), one slow source in a mixture. Each test injects one cause
under a real DataLoader with two workers and names its independent measure of the truth."""

from __future__ import annotations

import collections
import os
import time

import torch
from shard_server import ShardServer
from stats_data import decode_seconds, fork_loader, write_jpeg_shards, write_shards

import wds_datapipes as wd

RATE = 150_000  # bytes a second a connection: the slow server's


def _read_all(loader) -> list:
    return list(wd.stats.watch(loader))


def test_slow_storage_names_reading_and_the_source(tmp_path, stats_on):
    """Shards over HTTP from a server that sends 150 KB/s a connection. Oracles: the server's
    own count of the bytes it sent, and its pacing (it sends each answer's first 64 KiB at
    once, then holds the rate): the reads cannot have taken less than that."""
    write_shards(tmp_path, 4, 10, size=8000)
    with ShardServer(str(tmp_path), rate=RATE) as server:
        spec = server.url("s-{000..003}.tar")
        dp = wd.ShardLister(spec).load_tar().group_by_key().batch_samples(5)
        batches = _read_all(fork_loader(dp))
        sent = server.sent
    s = wd.stats.snapshot()
    d = wd.stats.diagnose(s)
    assert len(batches) == 8 and d.data_limits and d.stage == "read" and d.source == spec, wd.stats.report(s)
    assert d.setting == "cache"  # remote shards read every epoch, the shard cache off
    assert s.stages["read"].bytes == sent == s.sources[spec].bytes == s.schemes["http"].bytes
    assert s.sources[spec].read_seconds + s.sources[spec].open_seconds >= 0.9 * (sent - 4 * (64 << 10)) / RATE
    assert f"source {spec!r}" in wd.stats.report(s)


def test_slow_decoding_names_decoding_and_decode_threads(tmp_path, stats_on):
    """Large JPEGs decoded one at a time in each worker. Oracle: the test's own decode of the same
    image with simplejpeg (what ``decode`` uses for JPEGs; Pillow where it is missing), the best
    of five here: the decode stage took at least half of that for each image."""
    paths = write_jpeg_shards(tmp_path, 2, 8, side=1600)
    jpeg = next(iter(wd.ShardLister(paths[:1]).load_tar().group_by_key()))["jpg"]
    alone = min(decode_seconds(jpeg) for _ in range(5))
    dp = wd.ShardLister(paths).load_tar().group_by_key().decode("rgb8").batch_samples(4)
    batches = _read_all(fork_loader(dp))
    s = wd.stats.snapshot()
    d = wd.stats.diagnose(s)
    assert len(batches) == 4 and d.data_limits and d.stage == "decode", wd.stats.report(s)
    assert d.setting == "decode_threads" and s.stages["decode"].items == 16
    assert s.stages["decode"].seconds >= 0.5 * 16 * alone


def slow_label(value: bytes) -> int:
    time.sleep(0.005)  # the injected cost of each sample
    return int(value)


def slow_sample(sample: dict) -> dict:
    time.sleep(0.005)
    return sample


def test_a_slow_transform_is_named_ours_and_a_users_map(tmp_path, stats_on):
    """A map_fields function and a user's .map (torch's pipe, which we do not see), each
    sleeping 5 ms a sample. Oracle: the injected sleep, a lower bound of each sample's time."""
    paths = write_shards(tmp_path, 2, 12)
    ours = wd.ShardLister(paths).load_tar().group_by_key().map_fields({"cls": slow_label}).batch_samples(4)
    _read_all(fork_loader(ours))
    first = wd.stats.snapshot()
    d = wd.stats.diagnose(first)
    assert d.data_limits and d.stage == "transform" and d.setting == "transform", wd.stats.report(first)
    assert first.stages["transform"].seconds >= 24 * 0.005

    users = wd.ShardLister(paths).load_tar().group_by_key().map(slow_sample).batch_samples(4)
    _read_all(fork_loader(users))
    second = wd.stats.snapshot().since(first)
    d = wd.stats.diagnose(second)
    assert d.data_limits and d.stage == "other" and d.setting == "transform", wd.stats.report(second)
    assert second.stages["other"].seconds >= 0.8 * 24 * 0.005 and second.stages["transform"].items == 0


def test_one_slow_source_of_a_mixture_is_named_with_its_weights(tmp_path, stats_on):
    """A RandomMix of local shards and shards from the slow HTTP server. Oracles: the server's
    rate against the local disk's, and the samples' own ``__source__`` for the realized weights."""
    write_shards(tmp_path / "slow", 2, 10, size=6000, prefix="r")
    local = write_shards(tmp_path / "fast", 2, 10, size=6000, prefix="l")
    with ShardServer(str(tmp_path / "slow"), rate=RATE) as server:
        mix = wd.RandomMix({"fast": wd.ShardLister(local).load_tar().group_by_key(),
                            "slow": wd.ShardLister(server.url("r-{000..001}.tar")).load_tar().group_by_key()},
                           weights={"fast": 1, "slow": 1}, stop="all_exhausted", seed=0)
        samples = [s for batch in _read_all(fork_loader(mix.batch_samples(4))) for s in batch["__source__"]]
    s = wd.stats.snapshot()
    d = wd.stats.diagnose(s)
    assert d.data_limits and d.stage == "read" and d.source == "slow" and d.setting == "source", wd.stats.report(s)
    drawn = collections.Counter(samples)
    mixes = {m.source: m for m in s.mixtures}
    assert {name: sum(m.samples for m in s.mixtures if m.source == name) for name in mixes} == drawn
    assert mixes["slow"].target == mixes["fast"].target == 0.5
    report = wd.stats.report(s)
    assert "source 'slow' is slow" in report and "target 0.500" in report
    assert s.sources["slow"].read_rate * 10 < s.sources["fast"].read_rate
    assert s.sources["slow"].bytes == sum(os.path.getsize(p) for p in
                                          [str(tmp_path / "slow" / f"r-{i:03d}.tar") for i in range(2)])
    assert torch is not None
