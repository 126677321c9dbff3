"""``keep_freed_memory``: let glibc's malloc keep freed memory instead of faulting it in again.

Raw samples are large ``bytes`` (tens of KB each). A shuffle buffer (``shuffle_samples``,
``ExactEpochs``' blocks) frees them in another order than they were made, so free memory
gathers at the top of malloc's heap, and glibc hands it back to the OS whenever that
exceeds its trim threshold (128 KB by default, or twice the largest memory-mapped block
freed so far). The next samples then fault every page in again: on the 2-core machine
that halves the rate of a shuffled raw pipeline (benchmarks/bench_pipeline.py, section 5).
Raising the threshold once per process keeps up to that much freed memory for reuse.

It changes the whole process's allocator, so nothing calls it for you: call it at the
start of the training script (DataLoader workers started by fork inherit it; with the
``spawn`` or ``forkserver`` start method, also call it in ``worker_init_fn``), or set the
environment variable ``MALLOC_TRIM_THRESHOLD_`` (trailing underscore) before Python starts.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger("wds_datapipes")

_M_TRIM_THRESHOLD = -1  # glibc's malloc.h


def keep_freed_memory(limit_bytes: int = 64 << 20) -> bool:
    """Keeps up to ``limit_bytes`` of freed memory in this process for reuse (glibc's
    ``mallopt(M_TRIM_THRESHOLD)``). Returns whether it took effect: False where the C
    library has no ``mallopt`` (macOS, musl) or refused the value."""
    if limit_bytes < 0:
        raise ValueError(f"limit_bytes must be >= 0, not {limit_bytes}")
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        logger.info("keep_freed_memory: this C library (%s) has no mallopt; nothing changed", name)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_TRIM_THRESHOLD, min(limit_bytes, 2**31 - 1)))
