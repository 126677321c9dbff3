"""Where this library's DataPipe machinery comes from: torch's, or a small stand-in.

torch still ships ``torch.utils.data.datapipes`` (``IterDataPipe``, functional names, the
sharding filter, graph traversal), but has announced its removal (pytorch/pytorch#168318:
its main branch warns on import). Every module here takes those pieces from this one:

- where torch has them, torch's, imported with any deprecation warning caught and said
  once, in our words, on the ``wds_datapipes`` logger;
- where torch has none, a stand-in with the same names: ``IterDataPipe`` becomes a plain
  ``IterableDataset`` with functional names and a yield counter, and a ``ShardingFilter``
  that the listers split themselves by rank and worker. DataLoader and StatefulDataLoader
  then see ordinary iterable datasets, and everything but DataLoader2 keeps working.
"""

from __future__ import annotations

import enum
import functools
import logging
import warnings
from collections.abc import Callable, Iterator
from typing import ClassVar

import torch

logger = logging.getLogger("wds_datapipes")

with warnings.catch_warnings(record=True) as _caught:
    warnings.simplefilter("always")
    try:
        from torch.utils.data import IterDataPipe, functional_datapipe
        from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES, ShardingFilterIterDataPipe
        from torch.utils.data.graph import traverse_dps

        HAVE_TORCH_DATAPIPES = True
    except ImportError:
        HAVE_TORCH_DATAPIPES = False

_deprecations = [w for w in _caught if issubclass(w.category, (DeprecationWarning, FutureWarning))
                 and "datapipe" in str(w.message).lower()]
if _deprecations:
    logger.warning("torch marks its DataPipes as deprecated (%s); wds_datapipes runs on them while they exist "
                   "and on its own stand-in after that", _deprecations[0].message)

if not HAVE_TORCH_DATAPIPES:
    logger.warning("this torch has no DataPipes (torch.utils.data.datapipes): wds_datapipes uses its own "
                   "stand-in; DataLoader and StatefulDataLoader work, DataLoader2 does not")

    class SHARDING_PRIORITIES(enum.IntEnum):
        DEFAULT = 1
        DISTRIBUTED = 2
        MULTIPROCESSING = 3

    class IterDataPipe(torch.utils.data.IterableDataset):
        """An IterableDataset with torch DataPipes' functional names and yield counter."""

        functions: ClassVar[dict[str, Callable]] = {}
        _number_of_samples_yielded = 0

        def __init_subclass__(cls, **kwargs):
            super().__init_subclass__(**kwargs)
            if "__iter__" in cls.__dict__:
                cls.__iter__ = _counting(cls.__dict__["__iter__"])

        def __getattr__(self, name: str):
            if name in IterDataPipe.functions:
                return functools.partial(IterDataPipe.functions[name], self)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

        @classmethod
        def register_function(cls, name: str, function: Callable) -> None:
            cls.functions[name] = function

    def _counting(iter_fn: Callable) -> Callable:
        @functools.wraps(iter_fn)
        def __iter__(self) -> Iterator:
            self._number_of_samples_yielded = 0
            for item in iter_fn(self):
                self._number_of_samples_yielded += 1
                yield item

        return __iter__

    def functional_datapipe(name: str) -> Callable[[type], type]:
        def register(cls: type) -> type:
            IterDataPipe.functions[name] = cls
            return cls

        return register

    class ShardingFilterIterDataPipe(IterDataPipe):
        """Keeps every n-th item: the share of instance ``i`` of ``n`` (ranks and workers combined)."""

        def __init__(self, source_datapipe: IterDataPipe):
            self.source_datapipe = source_datapipe
            self.groups: dict = {}
            self.num_of_instances, self.instance_id = 1, 0

        def apply_sharding(self, num_of_instances: int, instance_id: int,
                           sharding_group: SHARDING_PRIORITIES = SHARDING_PRIORITIES.DEFAULT) -> None:
            self.groups[sharding_group] = (num_of_instances, instance_id)
            self.num_of_instances, self.instance_id = 1, 0
            for group in sorted(self.groups, reverse=True):
                count, index = self.groups[group]
                self.instance_id += self.num_of_instances * index
                self.num_of_instances *= count

        def __iter__(self) -> Iterator:
            for i, item in enumerate(self.source_datapipe):
                if i % self.num_of_instances == self.instance_id:
                    yield item

    def traverse_dps(datapipe: IterDataPipe) -> dict:
        """{id: (pipe, graph of the pipes it reads)}, found through the pipe's attributes."""
        return {id(datapipe): (datapipe, {id(s): traverse_dps(s)[id(s)] for s in _sources(datapipe)})}

    def _sources(datapipe: object) -> list:
        found = []
        for value in vars(datapipe).values():
            values = value if isinstance(value, (list, tuple)) else [value]
            found.extend(v for v in values if isinstance(v, IterDataPipe))
        return found


__all__ = [
    "HAVE_TORCH_DATAPIPES",
    "SHARDING_PRIORITIES",
    "IterDataPipe",
    "ShardingFilterIterDataPipe",
    "functional_datapipe",
    "traverse_dps",
]
