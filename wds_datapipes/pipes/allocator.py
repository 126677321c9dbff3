"""``keep_freed_memory``: let glibc's malloc keep freed memory instead of faulting it in again.

Raw samples are large ``bytes`` (tens of KB each). A shuffle buffer (``shuffle_samples``,
``ExactEpochs``' blocks over an index without member places) frees them in another order
than they were made, so free memory
gathers at the top of malloc's heap, and glibc hands it back to the OS whenever that
exceeds its trim threshold (128 KB by default, or twice the largest memory-mapped block
freed so far). The next samples then fault every page in again: on the 2-core machine
that halves the rate of a shuffled raw pipeline (benchmarks/bench_pipeline.py, section 5).
Raising the threshold once per process keeps up to that much freed memory for reuse.
Setting it switches off glibc's sliding threshold for memory-mapped blocks, after which
every block above where that threshold stood would be mapped and faulted in anew
(measured: 14x the page faults for 4 MB samples after importing torch, 5-10x for
200 KB-1 MB samples in a bare process): so the mmap threshold is raised with it.

It changes the whole process's allocator, so nothing calls it for you: call it at the
start of the training script (DataLoader workers started by fork inherit it; with the
``spawn`` or ``forkserver`` start method, also call it in ``worker_init_fn``), or set the
environment variables ``MALLOC_TRIM_THRESHOLD_=67108864 MALLOC_MMAP_THRESHOLD_=33554432``
(trailing underscores) before Python starts.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger("wds_datapipes")

_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's largest on 64-bit systems


def keep_freed_memory(limit_bytes: int = 64 << 20) -> bool:
    """Keeps up to ``limit_bytes`` of freed memory in this process for reuse (glibc's
    ``mallopt(M_TRIM_THRESHOLD)``, and ``M_MMAP_THRESHOLD`` up to 32 MB so large blocks come
    from the heap too). Returns whether it took effect: False where the C library has no
    ``mallopt`` (macOS, musl) or refused a value."""
    if limit_bytes < 0:
        raise ValueError(f"limit_bytes must be >= 0, not {limit_bytes}")
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        logger.info("keep_freed_memory: this C library (%s) has no mallopt; nothing changed", name)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mapped = mallopt(_M_MMAP_THRESHOLD, min(limit_bytes, _MMAP_THRESHOLD_MAX))
    return bool(mallopt(_M_TRIM_THRESHOLD, min(limit_bytes, 2**31 - 1))) and bool(mapped)
