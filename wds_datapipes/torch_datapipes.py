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

Two pieces of our own work on either: :func:`walk_graph` (torch's graph walk, or one
through attributes where torch cannot pickle a graph) and :func:`add_graph_attributes`
(names a pipe answers only where its graph calls for them: the loaders' hooks).
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


def _attribute_graph(datapipe: IterDataPipe, seen: frozenset = frozenset()) -> dict:
    """{id: (pipe, graph of the pipes it reads)}, found through the pipes' attributes (and
    lists, tuples and dicts held in them)."""
    seen = seen | {id(datapipe)}
    children = {id(s): _attribute_graph(s, seen)[id(s)] for s in _attribute_sources(datapipe) if id(s) not in seen}
    return {id(datapipe): (datapipe, children)}


def _attribute_sources(datapipe: object) -> list:
    found = []
    for value in vars(datapipe).values():
        values = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
        found.extend(v for v in values if isinstance(v, IterDataPipe))
    return found


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
            found = _graph_attribute(self, name)
            if found is not None:
                return found
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

    traverse_dps = _attribute_graph


def walk_graph(datapipe: IterDataPipe) -> dict:
    """The graph upstream of ``datapipe``, as ``traverse_dps`` gives it; where torch cannot
    pickle the graph (a lambda, without dill) the pipes found through attributes instead."""
    try:
        return traverse_dps(datapipe)
    except Exception:  # noqa: BLE001 - torch's walk pickles the graph: anything unpicklable fails it
        logger.debug("torch cannot walk the graph of %s: its pipes are found through attributes",
                      type(datapipe).__name__)
        return _attribute_graph(datapipe)


_GRAPH_NAMES: frozenset[str] = frozenset()
_graph_lookup: Callable[[IterDataPipe, str], object] | None = None


def _graph_attribute(pipe: IterDataPipe, name: str):
    return _graph_lookup(pipe, name) if name in _GRAPH_NAMES else None


def add_graph_attributes(names: frozenset[str], lookup: Callable[[IterDataPipe, str], object]) -> None:
    """Answers ``names`` on any pipe whose class lacks them with ``lookup(pipe, name)``; where
    that returns None the pipe has no such attribute (``hasattr`` is False, as without us).

    The alternative, ``IterDataPipe.register_function``, gives a name to every pipe of the
    process, whatever its graph; this answers per pipe, through ``IterDataPipe.__getattr__``
    (only reached when the normal lookup fails), and leaves every other name to torch.
    """
    global _GRAPH_NAMES, _graph_lookup
    _GRAPH_NAMES, _graph_lookup = frozenset(names), lookup
    if HAVE_TORCH_DATAPIPES and not getattr(IterDataPipe.__getattr__, "_wds_graph_attributes", False):
        torch_getattr = IterDataPipe.__getattr__

        def __getattr__(self, name: str):
            if name in _GRAPH_NAMES:
                found = _graph_lookup(self, name)
                if found is not None:
                    return found
            return torch_getattr(self, name)

        __getattr__._wds_graph_attributes = True
        IterDataPipe.__getattr__ = __getattr__


__all__ = [
    "HAVE_TORCH_DATAPIPES",
    "SHARDING_PRIORITIES",
    "IterDataPipe",
    "ShardingFilterIterDataPipe",
    "add_graph_attributes",
    "functional_datapipe",
    "traverse_dps",
    "walk_graph",
]
