"""The base class of this library's DataPipes."""

from __future__ import annotations

from typing import TypeVar

from .torch_datapipes import IterDataPipe

T_co = TypeVar("T_co", covariant=True)


class Pipe(IterDataPipe[T_co]):
    """An ``IterDataPipe`` that answers torch's per-item iterator check cheaply.

    torch's iterator hook asks ``hasattr(pipe, "_is_child_datapipe")`` for every item a
    pipe yields. Without the attribute, the lookup falls through
    ``IterDataPipe.__getattr__`` into an AttributeError, about 2 us per item per pipe
    (benchmarks/bench_pipeline.py).
    """

    _is_child_datapipe = False
