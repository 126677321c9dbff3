"""Two gloo ranks on CPU, started by the test as real processes, training over exact epochs.

Each rank runs tests/epoch_job.py with torch's env:// variables, 2 loader workers, and an
all_reduce after every batch, as DDP does: a rank with fewer batches than the other would
leave it waiting forever, so every run has a timeout and a hang fails the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from builders import write_index
from server_process import free_port
from stack import needs_dataloader2

UNEVEN = [100, 30, 71, 5, 90, 47, 50]  # 393 samples in 7 shards
JOB = str(Path(__file__).parent.parent / "epoch_job.py")  # the helpers sit in tests/
TIMEOUT_S = 240


def _ranks(tmp_path: Path, name: str, world: int, *args: str) -> list[dict]:
    """Runs ``world`` ranks of the job; returns each rank's output. A hang fails the test."""
    port = free_port()
    procs, outs = [], []
    for rank in range(world):
        out = tmp_path / f"{name}-rank{rank}.json"
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "PYTHONPATH": os.pathsep.join(sys.path)}
        procs.append(subprocess.Popen([sys.executable, JOB, *args, "--out", str(out)], env=env))
        outs.append(out)
    try:
        for proc in procs:
            if proc.wait(timeout=TIMEOUT_S) != 0:
                pytest.fail(f"a rank exited with status {proc.returncode}")
    except subprocess.TimeoutExpired:
        pytest.fail(f"the ranks did not finish within {TIMEOUT_S} s: a rank waits on another (a DDP hang)")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [json.loads(out.read_text()) for out in outs]


def _keys(epoch: list) -> list[str]:
    return [k for batch in epoch for k in batch[0]]


def _pads(epoch: list) -> list[str]:
    return [k for batch in epoch for k, pad in zip(*batch) if pad]


def _all_keys() -> list[str]:
    return [f"u{shard}-{i:04d}" for shard, n in enumerate(UNEVEN) for i in range(n)]


@pytest.fixture
def index(tmp_path, sized_shards) -> str:
    return write_index(sized_shards(UNEVEN), tmp_path / "index.json")


LOADERS = [
    pytest.param("dataloader", "multiprocessing", id="DataLoader"),
    pytest.param("dataloader2", "distributed", id="DataLoader2+DistributedReadingService", marks=needs_dataloader2),
    pytest.param("dataloader2", "multiprocessing", id="DataLoader2-MultiProcessing-only", marks=needs_dataloader2),
]


@pytest.mark.parametrize(("loader", "reading"), LOADERS)
def test_two_ranks_get_equal_batches_and_every_sample_once_per_epoch(tmp_path, index, loader, reading):
    ranks = _ranks(tmp_path, "drop", 2, "--index", index, "--loader", loader, "--reading", reading,
                   "--workers", "2", "--epochs", "2", "--dist")
    for epoch in range(2):
        counts = [len(rank["epochs"][epoch]) for rank in ranks]
        assert counts[0] == counts[1] == ranks[0]["batches_per_epoch"] == 25
        keys = _keys(ranks[0]["epochs"][epoch]) + _keys(ranks[1]["epochs"][epoch])
        assert len(keys) == len(set(keys)) == 392  # 393 samples: one left out to keep ranks equal
        assert set(keys) <= set(_all_keys())
    assert _keys(ranks[0]["epochs"][0]) != _keys(ranks[0]["epochs"][1])


@pytest.mark.parametrize(("loader", "reading"), LOADERS[:2])
def test_pad_mode_gives_every_sample_at_least_once_with_the_repeats_flagged(tmp_path, index, loader, reading):
    ranks = _ranks(tmp_path, "pad", 2, "--index", index, "--loader", loader, "--reading", reading,
                   "--workers", "2", "--epochs", "2", "--mode", "pad", "--dist")
    for epoch in range(2):
        assert len(ranks[0]["epochs"][epoch]) == len(ranks[1]["epochs"][epoch])
        keys = _keys(ranks[0]["epochs"][epoch]) + _keys(ranks[1]["epochs"][epoch])
        pads = _pads(ranks[0]["epochs"][epoch]) + _pads(ranks[1]["epochs"][epoch])
        assert len(keys) == 394 and len(pads) == 1
        assert sorted(set(keys)) == _all_keys()
        repeated = [k for k, n in Counter(keys).items() if n > 1]
        assert repeated == pads


def _single(tmp_path: Path, name: str, *args: str) -> dict:
    out = tmp_path / f"{name}.json"
    subprocess.run([sys.executable, JOB, *args, "--out", str(out)], check=True, timeout=TIMEOUT_S,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    return json.loads(out.read_text())


def test_two_ranks_of_two_workers_resume_on_one_rank_of_three(tmp_path, index):
    state = str(tmp_path / "state.json")
    ranks = _ranks(tmp_path, "head", 2, "--index", index, "--loader", "dataloader", "--workers", "2",
                   "--epochs", "2", "--dist", "--stop-after", "11", "--state-out", state)
    seen = _keys(ranks[0]["epochs"][0]) + _keys(ranks[1]["epochs"][0])
    assert len(seen) == 2 * 11 * 8
    options = ["--index", index, "--loader", "dataloader", "--workers", "3", "--epochs", "2"]
    tail = _single(tmp_path, "tail", *options, "--state-in", state)
    rest = _keys(tail["epochs"][0])
    assert not set(seen) & set(rest)
    assert len(seen) + len(rest) == 392 and len(set(rest)) == len(rest)  # drop mode: once each
    assert tail["epochs"][1] == _single(tmp_path, "plain", *options)["epochs"][1]


@needs_dataloader2
def test_shard_lister_splits_by_rank_under_dataloader2_without_a_distributed_service(tmp_path, sized_shards):
    sized_shards([10, 4, 7, 3, 8, 5], folder=tmp_path / "shards")
    ranks = _ranks(tmp_path, "lister", 2, "--index", str(tmp_path / "shards" / "*.tar"), "--pipeline", "lister",
                   "--loader", "dataloader2", "--workers", "2", "--epochs", "2", "--batch", "4", "--dist")
    for epoch in range(2):
        first, second = (set(_keys(rank["epochs"][epoch])) for rank in ranks)
        assert first and second and not first & second
        assert len(first | second) == 37
