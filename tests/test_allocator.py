"""keep_freed_memory: freed sample memory is reused instead of faulted in again (glibc)."""

from __future__ import annotations

import ctypes.util
import platform
import subprocess
import sys

import pytest

CHURN = """
import random, resource, sys
import wds_datapipes as wd

def faults_of_a_shuffle_buffer():
    held, rng = [], random.Random(0)
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3000):
        held.append(b"\\1" * 50_000)  # a 50 KB sample
        if len(held) > 400:
            held.pop(rng.randrange(len(held)))  # leaves the buffer in another order
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start

faults_of_a_shuffle_buffer()  # the heap has grown to its size
before = faults_of_a_shuffle_buffer()  # only importing wds_datapipes: the allocator as it was
took = wd.keep_freed_memory()
faults_of_a_shuffle_buffer()
after = faults_of_a_shuffle_buffer()
print(took, before, after)
"""


@pytest.mark.skipif(platform.system() != "Linux" or "musl" in (ctypes.util.find_library("c") or ""),
                    reason="glibc's mallopt only")
def test_freed_samples_are_reused_not_faulted_in_again_and_importing_changes_nothing():
    run = subprocess.run([sys.executable, "-c", CHURN], capture_output=True, text=True, timeout=120, check=True)
    took, before, after = run.stdout.split()
    assert took == "True"
    assert int(before) > 1000  # 3,000 samples of 13 pages: most pages come back as faults
    assert int(after) < int(before) / 10


def test_a_negative_limit_is_refused():
    import wds_datapipes as wd

    with pytest.raises(ValueError, match="limit_bytes"):
        wd.keep_freed_memory(-1)
