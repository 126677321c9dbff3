"""Ranks and workers split the shards exactly once, under every loader and in every setting.

The matrix runs two real rank processes (tests/split_job.py); each lists the same shards
under direct iteration, DataLoader and StatefulDataLoader with 0 and 2 workers, and
DataLoader2 where torchdata has it (with and without a DistributedReadingService), with
neither RANK/WORLD_SIZE nor a process group, RANK/WORLD_SIZE only (as torchrun sets them),
both, and a gloo process group only. Oracle: the set of shards (and of an index's
samples), each read exactly once by the union of the ranks, or by each rank where there
is one rank.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from builders import write_index
from torch.utils.data import DataLoader

from wds_datapipes import ShardLister

JOB = str(Path(__file__).parent.parent / "split_job.py")
TIMEOUT_S = 300
SHARDS = [f"mem://split/shard-{i:02d}.tar" for i in range(8)]  # as in split_job.py
SIZES = [8, 8, 8, 8]  # 32 samples: 2 ranks x 2 workers x batches of 4 leave none out


def _free_ports() -> int:
    """A port P with P + 1 free too (the job's env:// and tcp:// groups)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise RuntimeError("no two consecutive free ports")


def _ranks(tmp_path: Path, world: int, index: str) -> list[dict]:
    port = _free_ports()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    procs, outs = [], []
    for rank in range(world):
        out = tmp_path / f"rank{rank}.json"
        procs.append(subprocess.Popen([sys.executable, JOB, "--rank", str(rank), "--world", str(world), "--port",
                                       str(port), "--out", str(out), "--exact", index], env=env))
        outs.append(out)
    try:
        for proc in procs:
            if proc.wait(timeout=TIMEOUT_S) != 0:
                pytest.fail(f"a rank exited with status {proc.returncode}")
    except subprocess.TimeoutExpired:
        pytest.fail(f"the ranks did not finish within {TIMEOUT_S} s")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [json.loads(out.read_text()) for out in outs]


def _oracle(pipeline: str) -> Counter:
    """Every shard (or every sample of the index) once."""
    if pipeline == "lister":
        return Counter(SHARDS)
    return Counter(f"u{shard}-{i:04d}" for shard, n in enumerate(SIZES) for i in range(n))


def test_every_rank_worker_and_loader_combination_reads_each_shard_exactly_once(tmp_path, sized_shards):
    index = write_index(sized_shards(SIZES), tmp_path / "index.json")
    ranks = _ranks(tmp_path, 2, index)
    assert set(ranks[0]) == set(ranks[1])
    checked = Counter()
    wrong = []
    for key, loaders in ranks[0].items():
        setting, pipeline = key.split("/")
        for loader, epochs in loaders.items():
            for epoch, first in enumerate(epochs):
                second = ranks[1][key][loader][epoch]
                if setting == "neither":  # one rank each: each reads everything
                    ok = Counter(first) == Counter(second) == _oracle(pipeline)
                else:
                    ok = Counter(first) + Counter(second) == _oracle(pipeline) and first and second
                if not ok:
                    wrong.append(f"{key} {loader} epoch {epoch}: rank 0 read {sorted(first)}, rank 1 {sorted(second)}")
                checked[setting] += 1
    assert not wrong, "\n".join(wrong)
    assert set(checked) == {"neither", "env", "both", "group"} and min(checked.values()) >= 2 * 6


# ---------------------------------------------------------------- the two defects, in this process


@pytest.fixture
def rank_one_of_two(monkeypatch):
    """RANK=1 WORLD_SIZE=2 in the environment, and no process group (as before torchrun's init)."""
    assert not (torch.distributed.is_available() and torch.distributed.is_initialized())
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")


def test_dataloader_workers_split_by_rank_from_the_environment_without_a_process_group(rank_one_of_two):
    # DataLoader splits by worker only where no process group exists: the ranks are the lister's to split
    read = list(DataLoader(ShardLister(SHARDS), batch_size=None, num_workers=2))
    assert sorted(read) == SHARDS[1::2]  # rank 1's half: every second shard of the list, from the second


def test_a_pipe_iterated_directly_then_given_to_a_dataloader_splits_the_same(rank_one_of_two):
    dp = ShardLister(SHARDS)
    assert list(dp) == SHARDS[1::2]
    assert sorted(DataLoader(dp, batch_size=None, num_workers=2)) == SHARDS[1::2]
    assert sorted(DataLoader(dp, batch_size=None, num_workers=0)) == SHARDS[1::2]
    assert list(dp) == SHARDS[1::2]


def test_ranks_without_a_shared_loader_seed_need_the_listers_seed(rank_one_of_two):
    with pytest.raises(ValueError, match="pass seed="):
        list(DataLoader(ShardLister(SHARDS, shuffle=True), batch_size=None, num_workers=0))
