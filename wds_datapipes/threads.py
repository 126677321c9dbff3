"""The one home of the thread pools that decode, transform and batch.

Decoders (Pillow, simplejpeg, torchvision) release the GIL, so threads decode in
parallel. A pool lives only as long as the generator that uses it, so the pipes that own
one still pickle (DataLoader2 ships them to worker processes). ``num_threads=0`` runs
every job at once on the calling thread, through the same interface.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class InlineExecutor(Executor):
    """Runs each job when it is submitted; its future is already done."""

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        future: Future[R] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exn:  # noqa: BLE001 - the future carries it, as a pool's would
            future.set_exception(exn)
        return future


@contextlib.contextmanager
def worker_threads(num_threads: int, name: str = "wds-decode") -> Iterator[Executor]:
    """A pool of ``num_threads`` threads (inline for 0), shut down (pending jobs cancelled) on exit."""
    if num_threads < 0:
        raise ValueError(f"num_threads must be >= 0, not {num_threads}")
    if num_threads == 0:
        yield InlineExecutor()
        return
    pool = ThreadPoolExecutor(num_threads, thread_name_prefix=name)
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def ordered_map(fn: Callable[[T], R], items: Iterable[T], pool: Executor, window: int) -> Iterator[tuple[T, Future[R]]]:
    """(item, future of ``fn(item)``) in input order, with at most ``window`` jobs in flight."""
    in_flight: collections.deque[tuple[T, Future[R]]] = collections.deque()
    for item in items:
        in_flight.append((item, pool.submit(fn, item)))
        if len(in_flight) >= window:
            yield in_flight.popleft()
    while in_flight:
        yield in_flight.popleft()


def check_positive(name: str, value: int, minimum: int = 1) -> int:
    """``value``, or ValueError naming ``name`` when it is below ``minimum``."""
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value
