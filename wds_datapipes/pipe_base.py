"""The base class of this library's DataPipes."""

from __future__ import annotations

import inspect
from typing import TypeVar

from .torch_datapipes import IterDataPipe

T_co = TypeVar("T_co", covariant=True)


class Pipe(IterDataPipe[T_co]):
    """An ``IterDataPipe`` that answers torch's per-item iterator check cheaply, and whose
    arguments read right in torch's error lines.

    torch's iterator hook asks ``hasattr(pipe, "_is_child_datapipe")`` for every item a
    pipe yields. Without the attribute, the lookup falls through
    ``IterDataPipe.__getattr__`` into an AttributeError, about 2 us per item per pipe
    (benchmarks/bench_pipeline.py).

    When a pipe raises, torch adds "This exception is thrown by __iter__ of Pipe(name=value,
    ...)", taking each argument's value from the attribute of its name in ``dir(pipe)``.
    Where an argument shares its name with a registered functional form (``shuffle=``:
    torch's ``.shuffle()``) and the pipe keeps it under another name, that line showed the
    functional (``functools.partial(...)``); such names are left out of ``dir`` instead.
    """

    _is_child_datapipe = False

    def __dir__(self) -> list[str]:
        parameters = inspect.signature(type(self)).parameters
        hidden = {name for name in parameters if name in IterDataPipe.functions and name not in self.__dict__
                  and not hasattr(type(self), name)}
        return [name for name in super().__dir__() if name not in hidden]
