"""A conversion to a bucket run as its own process, for the kill-and-resume test:
``ais_write_job.py ais://BUCKET WORKERS``.

Prints ``go`` once its imports are done, then writes 300 generated samples in shards of 10
to ``ais://BUCKET/s-%04d.tar``, slowed by a map function so that a kill lands in the middle.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the tree's root, for tests.*

from tests.writing.conftest import make_samples
from wds_datapipes.writing import write_shards


def slow(sample: dict) -> dict:
    time.sleep(0.003)
    return sample


if __name__ == "__main__":
    out, workers = sys.argv[1], int(sys.argv[2])
    print("go", flush=True)
    report = write_shards(make_samples(300, seed=9), f"{out}/s-%04d.tar", maxcount=10, workers=workers, map=slow)
    print(f"done {report.read} {report.written} {report.resumed}", flush=True)
