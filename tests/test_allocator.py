"""keep_freed_memory: freed sample memory is reused instead of faulted in again (glibc)."""

from __future__ import annotations

import ctypes.util
import platform
import subprocess
import sys

import pytest

CHURN = r"""
import random, resource
import wds_datapipes as wd

def faults_of_a_shuffle_buffer(size):
    held, rng = [], random.Random(0)
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(1500):
        held.append(b"\1" * size)  # a sample
        if len(held) > 200:
            held.pop(rng.randrange(len(held)))  # leaves the buffer in another order
    held.clear()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start

def faults():
    return [faults_of_a_shuffle_buffer(size) for size in (50_000, 200_000)]

faults()  # the heap has grown to its size
before = faults()  # only importing wds_datapipes: the allocator as it was
took = wd.keep_freed_memory()
faults()
after = faults()
print(took, *before, *after)
"""


@pytest.mark.skipif(platform.system() != "Linux" or "musl" in (ctypes.util.find_library("c") or ""),
                    reason="glibc's mallopt only")
def test_freed_samples_are_reused_not_faulted_in_again_and_importing_changes_nothing():
    run = subprocess.run([sys.executable, "-c", CHURN], capture_output=True, text=True, timeout=120, check=True)
    took, small_before, large_before, small_after, large_after = run.stdout.split()
    assert took == "True"
    assert int(small_before) > 1000  # 1,500 samples of 13 pages: most pages come back as faults
    assert int(small_after) < int(small_before) / 10
    assert int(large_after) <= int(large_before)  # 200 KB samples (mapped blocks): no worse


def test_a_negative_limit_is_refused():
    import wds_datapipes as wd

    with pytest.raises(ValueError, match="limit_bytes"):
        wd.keep_freed_memory(-1)
