"""``python -m wds_datapipes profile``, run as a subprocess on shards the test writes, with one slow
stage injected: it names that stage, counts what the shards hold, and its numbers agree with
the stats API's snapshot of the same pipeline taken in the test's own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from shard_server import ShardServer
from stats_data import decode_seconds, fork_loader, write_jpeg_shards, write_shards

import wds_datapipes as wd
from wds_datapipes.tools.profile import RECIPES

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]


def _profile(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "wds_datapipes", "profile", *args], capture_output=True, text=True,
                          env=env, timeout=240, check=False)


def _members(paths: list[str], suffix: str) -> int:
    """Samples in the shards, as tarfile counts them (members with the suffix)."""
    count = 0
    for path in paths:
        with tarfile.open(path) as tar:
            count += sum(1 for m in tar if m.name.endswith(suffix))
    return count


def _every_run_read_it_all(done: subprocess.CompletedProcess, paths: list[str], stages: list[str]):
    """The command's JSON, checked: it succeeded, counted the shards' samples (tarfile's count of
    their JPEGs) and bytes (os.stat's) in every run, timed ``stages`` alone in order, and the
    pipeline whole with 1 and 2 workers. Returns (the JSON, the samples, the bytes)."""
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    samples, size = _members(paths, ".jpg"), sum(os.path.getsize(p) for p in paths)
    assert found["samples"] == samples and found["bytes"] == size
    assert [r["stage"] for r in found["alone"]] == stages
    assert all(r["bytes"] == size for r in found["alone"] + found["whole"])
    assert [r["workers"] for r in found["whole"]] == [1, 2]
    return found, samples, size


def test_big_images_make_it_name_decoding_and_agree_with_the_api(tmp_path, stats_on):
    """1600x1600 JPEGs through the ``decode`` recipe. Oracles: tarfile's count of the samples and
    os.stat's of the bytes (every run reads them all), the test's own decode of the same image
    (simplejpeg, what ``decode`` uses; the best of five: the decode step cannot cost less than
    half of it a sample), and a snapshot of the same pipeline under a 1-worker DataLoader taken
    with the API here (the same limiting stage; decode's time a sample within a factor of 2)."""
    paths = write_jpeg_shards(tmp_path, 2, 6, side=1600)
    spec = str(tmp_path / "j-{000..001}.tar")
    done = _profile(spec, "--recipe", "decode", "--workers", "2", "--batch-size", "4", "--json")
    found, samples, size = _every_run_read_it_all(done, paths, ["read", "tar", "decode", "batch"])
    assert samples == 12
    assert all(r["samples"] == samples for r in found["alone"][1:] + found["whole"])
    assert found["limiting"]["stage"] == "decode" and found["limiting"]["setting"] == "decode_threads"
    assert found["limiting"]["share"] > found["limiting"]["next_share"]

    jpeg = next(iter(wd.ShardLister(paths[:1]).load_tar().group_by_key()))["jpg"]
    alone_ms = min(decode_seconds(jpeg) for _ in range(5)) * 1e3
    decode_run = found["alone"][2]
    assert decode_run["added_ms_per_sample"] >= 0.5 * alone_ms, (decode_run, alone_ms)
    assert decode_run["ms_per_sample"]["decode"] >= 0.5 * alone_ms

    wd.stats.enable(interval_s=0.2)  # a run of its own: the oracle's read above is not in it
    dp = wd.ShardLister(spec).load_tar()
    for _, _, step in RECIPES["decode"](4):
        dp = step(dp)
    assert sum(1 for _ in wd.stats.watch(fork_loader(dp, workers=1))) == 3
    api = wd.stats.snapshot()
    assert wd.stats.diagnose(api).stage == found["whole"][0]["limiting"] == "decode"
    assert api.stages["read"].bytes == size and api.stages["decode"].items == samples
    ours = api.stages["decode"].seconds / samples * 1e3
    theirs = found["whole"][0]["ms_per_sample"]["decode"]
    assert 0.5 * ours <= theirs <= 2 * ours, (ours, theirs)


def test_a_slow_server_makes_it_name_reading(tmp_path):
    """Shards over HTTP from a server that sends 150 KB/s a connection, the ``raw`` recipe.
    Oracles: the server's own count of the bytes it sent (every run's bytes, five runs) and the
    text's verdict, read as a user reads it."""
    paths = write_shards(tmp_path, 2, 20, size=8000)
    size = sum(os.path.getsize(p) for p in paths)
    with ShardServer(str(tmp_path), rate=150_000) as server:
        done = _profile(server.url("s-{000..001}.tar"), "--recipe", "raw", "--workers", "2")
        sent = server.sent
    assert done.returncode == 0, done.stderr
    assert sent == 5 * size  # load_tar, +group, +batch alone; whole with 1 and 2 workers
    lines = done.stdout.splitlines()
    verdict = next(line for line in lines if line.startswith("limiting stage:"))
    assert verdict.startswith("limiting stage: read,"), done.stdout
    assert "data is the limit" in done.stdout and f"source '{server.url('s-{000..001}.tar')}'" in done.stdout
    assert [line.split()[0] for line in lines[lines.index("each stage alone, in this process (every step up to it):")
                                              + 2:][:3]] == ["read", "tar", "batch"]


def test_the_vision_recipe_names_decoding_for_photos(tmp_path):
    """800x800 JPEGs through the README's ``vision`` recipe (decode_batches to 224x224 crops, then
    tuples). Oracles: tarfile's count of the samples, os.stat's of the bytes, the recipe's own
    steps in order, and the test's own decode of the same image (decoding and cropping cannot
    cost less than half of a decode alone, a sample)."""
    paths = write_jpeg_shards(tmp_path, 2, 8, side=800)
    done = _profile(str(tmp_path / "j-{000..001}.tar"), "--recipe", "vision", "--workers", "2", "--batch-size", "4",
                    "--json")
    found, samples, _ = _every_run_read_it_all(done, paths, ["read", "tar", "decode", "transform"])
    assert samples == 16
    assert found["limiting"]["stage"] == "decode"
    jpeg = next(iter(wd.ShardLister(paths[:1]).load_tar().group_by_key()))["jpg"]
    alone_ms = min(decode_seconds(jpeg) for _ in range(5)) * 1e3
    assert found["alone"][2]["added_ms_per_sample"] >= 0.5 * alone_ms, (found["alone"][2], alone_ms)
