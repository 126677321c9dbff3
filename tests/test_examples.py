"""The examples run as the README says, and do what they claim."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from server_process import free_port

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _torchrun(tmp_path: Path, *args: str) -> str:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
               str(EXAMPLES / "ddp_exact_epochs.py"), "--data", str(tmp_path / "data"),
               "--checkpoint", str(tmp_path / "ckpt.pt"), *args]
    run = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def test_ddp_example_trains_on_equal_batches_and_resumes_exactly(tmp_path):
    whole = _torchrun(tmp_path, "--epochs", "2", "--log-keys", str(tmp_path / "whole.json"))
    assert "epoch 0: 29 steps so far, 1796 samples on 2 ranks" in whole
    os.remove(tmp_path / "ckpt.pt")
    head = _torchrun(tmp_path, "--epochs", "2", "--stop-after", "37", "--log-keys", str(tmp_path / "head.json"))
    assert "stopped after step 37 (epoch 1)" in head
    tail = _torchrun(tmp_path, "--epochs", "2", "--log-keys", str(tmp_path / "tail.json"))
    assert "resumed at epoch 1, step 37" in tail
    logs = [json.loads((tmp_path / f"{name}.json").read_text()) for name in ("whole", "head", "tail")]
    assert logs[1] + logs[2] == logs[0]
    assert whole.splitlines()[-1].split("loss")[1] == tail.splitlines()[-1].split("loss")[1]  # same model
