"""keep_freed_memory: freed sample memory is reused instead of faulted in again (glibc)."""

from __future__ import annotations

import ctypes.util
import platform
import subprocess
import sys

import pytest

CHURN = r"""
import random, resource, sys
import wds_datapipes as wd

took = wd.keep_freed_memory() if sys.argv[1] == "keep" else None  # first: before any large block is freed

def faults_of_a_shuffle_buffer(size, count, kept):
    held, rng = [], random.Random(0)
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(count):
        held.append(b"\1" * size)  # a sample
        if len(held) > kept:
            held.pop(rng.randrange(len(held)))  # leaves the buffer in another order
    held.clear()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start

def faults():  # 50 KB samples, and 4 MB ones (above any threshold glibc has slid to by now)
    return [faults_of_a_shuffle_buffer(50_000, 1500, 200), faults_of_a_shuffle_buffer(4_000_000, 150, 8)]

faults()  # the heap has grown to its size
print(took, *faults())
"""


def _faults(mode: str) -> tuple[str, int, int]:
    run = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, timeout=120, check=True)
    took, small, large = run.stdout.split()
    return took, int(small), int(large)


@pytest.mark.skipif(platform.system() != "Linux" or "musl" in (ctypes.util.find_library("c") or ""),
                    reason="glibc's mallopt only")
def test_freed_samples_are_reused_not_faulted_in_again_and_importing_changes_nothing():
    _, small_before, large_before = _faults("import only")  # the allocator as glibc sets it
    took, small_after, large_after = _faults("keep")
    assert took == "True"
    assert small_before > 1000  # 1,500 samples of 13 pages: most pages come back as faults
    assert small_after < small_before / 10
    assert large_after <= large_before  # 4 MB samples (blocks glibc maps): no worse


def test_a_negative_limit_is_refused():
    import wds_datapipes as wd

    with pytest.raises(ValueError, match="limit_bytes"):
        wd.keep_freed_memory(-1)
