"""examples/pets_to_ais.py, the seed workflow, runs end to end against the test cluster."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from aisio.client import ENDPOINT_ENV, get_client

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_pets_example_creates_indexed_shards_in_a_bucket_dsorts_them_and_trains_with_falling_loss(ais_endpoint):
    prefix = f"test-pets-{uuid.uuid4().hex[:8]}"
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "pets_to_ais.py"), "--bucket", prefix,
                          "--per-breed", "40", "--maxcount", "32"],
                         capture_output=True, text=True, timeout=240, check=False, cwd=ROOT,
                         env={**os.environ, ENDPOINT_ENV: ais_endpoint, "OMP_NUM_THREADS": "1"})
    try:
        assert run.returncode == 0, run.stdout + run.stderr[-3000:]
        out = run.stdout
        assert "1. drew 160 pets" in out
        assert f"2. create wrote 5 shards and ais://{prefix}-raw/index.json" in out
        assert re.search(rf"3\. dSort shuffled them into \d+ shards in ais://{prefix}-shuffled", out)
        assert out.count("steps of 16") == 3  # 160 samples: 10 full batches an epoch
        first, last = map(float, re.search(r"mean loss ([\d.]+) -> ([\d.]+)", out).groups())
        assert last < first
        assert "read 160 samples: wrote 160, skipped 0" in run.stderr
    finally:
        for name in (f"{prefix}-raw", f"{prefix}-shuffled"):
            get_client().bucket(name).delete(missing_ok=True)
