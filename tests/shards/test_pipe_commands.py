"""``pipe:`` commands that the reader is done with: stopping one is no error, whatever it exits
with then (curl's 23, SIGPIPE, SIGTERM); a command that failed before the reader had what it
needed still is, naming the command."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from shard_server import FaultyShardServer, tarfile_samples

import wds_datapipes as wd
from wds_datapipes import Limits, ShardOpenError
from wds_datapipes.epochs.index import scan_shard

pytestmark = pytest.mark.timeout(120)
CURL = shutil.which("curl")


def read(url: str, limits: Limits | None = None, handler=None) -> list[tuple[str, dict[str, bytes]]]:
    pipe = wd.ShardLister([url]).load_tar(limits=limits, **({"handler": handler} if handler else {})).group_by_key()
    return [(s["__key__"], {k: v for k, v in s.items() if not k.startswith("__")}) for s in pipe]


@pytest.mark.skipif(CURL is None, reason="needs curl")
def test_pipe_curl_whose_tar_padding_comes_late_gives_every_sample_and_no_error(sized_shards, tmp_path):
    """curl is still waiting for the last 512 bytes (the record padding) when the reader, past
    the end-of-archive block, closes the pipe: curl then exits 23 (write error). Oracle:
    tarfile reading the shards' bytes as written."""
    paths = sized_shards([30] * 6, folder=tmp_path / "remote")
    versions = {os.path.basename(p): [Path(p).read_bytes()] for p in paths}
    with FaultyShardServer(versions, lambda name, n: "late-tail", late=0.2) as server:
        for name, (data,) in versions.items():
            url = f"pipe:curl -s {server.url(name)}"
            assert read(url) == tarfile_samples(data), url
            assert scan_shard(url).nsamples == len(tarfile_samples(data))  # index reads headers only, and stops alike


def test_a_break_out_of_a_lingering_command_neither_waits_nor_prints_an_ignored_exception(make_shards, tmp_path,
                                                                                          monkeypatch):
    (shard,) = make_shards(1, 50)
    pid_file = tmp_path / "sleeper.pid"
    url = f"pipe:sleep 30 & echo $! > {pid_file}; cat {shard}; wait"
    ignored = []
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)
    started = time.monotonic()
    samples = iter(wd.ShardLister([url]).load_tar(limits=Limits(pipe_grace=60)).group_by_key())
    for sample in samples:
        break
    samples = None  # the generator is closed here, as after a break out of a for loop
    assert sample["__key__"] == "s-000-000"
    assert time.monotonic() - started < 30, "the break waited for Limits.pipe_grace"
    assert ignored == []
    assert _gone(int(pid_file.read_text())), "what the command started was left running"


def _gone(pid: int, wait: float = 3.0) -> bool:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_a_lingering_command_is_stopped_once_the_tar_ended_without_error(make_shards):
    (shard,) = make_shards(1, 20)
    started = time.monotonic()
    assert [k for k, _ in read(f"pipe:cat {shard}; sleep 120", Limits(pipe_grace=60))] == \
        [k for k, _ in read(shard)]
    assert time.monotonic() - started < 30  # neither the sleep nor Limits.pipe_grace waited for


def test_a_command_failing_after_the_tar_ended_is_an_error_naming_it(make_shards):
    """The reader stops at the end-of-archive block; what the command writes after it (the
    record padding, here late) is still read, so its exit status counts: ``gsutil cat``
    checks its CRC at the end."""
    (shard,) = make_shards(1, 20)
    url = f"pipe:cat {shard}; sleep 0.3; head -c 4096 /dev/zero; exit 3"
    with pytest.raises(ShardOpenError, match="command exited with status 3"):
        read(url)
    assert [k for k, _ in read(f"pipe:cat {shard}; sleep 0.3; head -c 4096 /dev/zero")] == \
        [k for k, _ in read(shard)]


def test_a_command_that_fails_before_the_reader_had_the_shard_is_an_error_naming_it(make_shards):
    (shard,) = make_shards(1, 200)
    url = f"pipe:head -c 20000 {shard}; exit 7"
    with pytest.raises(ShardOpenError, match="command exited with status 7") as caught:
        read(url)
    assert caught.value.url == url


@pytest.mark.skipif(CURL is None, reason="needs curl")
def test_exact_epochs_spans_ending_mid_shard_over_pipe_curl_give_every_sample_once(sized_shards, tmp_path):
    """Shuffled spans of ExactEpochs end inside shards: each such pipe: command is stopped
    mid-transfer (curl exits 23), and that is no error. Oracle: tarfile reading the shards'
    bytes as written (every key once per epoch)."""
    paths = sized_shards([40] * 3, folder=tmp_path / "remote")
    versions = {os.path.basename(p): [Path(p).read_bytes()] for p in paths}
    with FaultyShardServer(versions, lambda name, n: "late-tail", late=0.2) as server:
        urls = [f"pipe:curl -s {server.url(name)}" for name in versions]
        index = wd.ShardIndex.from_scans(wd.build_index(urls, jobs=2))
        index.allow_pipe = True
        pipe = wd.ExactEpochs(index, batch_size=7, lanes=4, block=8, seed=1)
        keys = sorted(s["__key__"] for s in pipe)
    assert keys == sorted(key for data, in versions.values() for key, _ in tarfile_samples(data))
