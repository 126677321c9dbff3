"""The hooks loaders call on a whole pipeline: ``state_dict``, ``load_state_dict`` and ``set_epoch``.

Registered on every ``IterDataPipe`` (and so on the wrapper the DataLoaders put around
one) when ``wds_datapipes`` is imported: StatefulDataLoader then saves an exact epoch's
position with its own checkpoints, and ``loader.dataset.set_epoch(e)`` reaches every pipe
upstream that draws per-epoch orders, as it does for a ``DistributedSampler``.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping

from ..epochs.epoch_pipe import EpochPipe
from ..epochs.state import EpochState
from ..torch_datapipes import IterDataPipe, traverse_dps

_SOURCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _exact_source(pipe: IterDataPipe) -> tuple[EpochPipe, int] | None:
    """The exact-epoch source (ExactEpochs, MixedEpochs) upstream of ``pipe`` and the samples
    in each item ``pipe`` yields.

    StatefulDataLoader asks for every batch, so the answer is kept per pipe (weakly).
    """
    if isinstance(pipe, EpochPipe):
        return pipe, 1
    if pipe in _SOURCES:
        source, unit = _SOURCES[pipe]
        return None if source is None else (source(), unit)
    found = _find_source(pipe, traverse_dps(pipe))
    _SOURCES[pipe] = (None, 0) if found is None else (weakref.ref(found[0]), found[1])
    return found


def _find_source(pipe: IterDataPipe, graph: dict) -> tuple[EpochPipe, int] | None:
    """Walks down from ``pipe``; each batching pipe on the way multiplies the unit."""
    for node, children in graph.values():
        if isinstance(node, EpochPipe):
            return node, 1
        below = _find_source(node, children)
        if below is None:
            continue
        source, unit = below
        size = getattr(node, "batch_size", None)
        if isinstance(size, int) and not isinstance(node, EpochPipe):
            if size != source.settings.batch_size:
                raise ValueError(f"{type(node).__name__} batches by {size}, but {type(source).__name__} was built with "
                                 f"batch_size={source.settings.batch_size}: they must agree")
            unit *= size
        return source, unit
    return None


def _unwrapped(pipe: IterDataPipe) -> IterDataPipe:
    """The pipe inside the serialization wrapper that DataLoader puts around a DataPipe."""
    return getattr(pipe, "_datapipe", pipe)


def pipeline_state_dict(pipe: IterDataPipe) -> dict | None:
    """The exact epoch's position after what ``pipe`` has yielded; None without an exact-epoch source upstream.

    Registered as ``state_dict`` on every IterDataPipe (and so on the wrapper the
    DataLoaders put around one), which makes StatefulDataLoader save it with its own
    checkpoints. For other pipelines it returns None, and StatefulDataLoader does what
    it did before (replays the epoch's start).
    """
    pipe = _unwrapped(pipe)
    found = _exact_source(pipe)
    if found is None:
        return None
    source, unit = found
    return source.state_at(pipe._number_of_samples_yielded * unit).to_dict()


def pipeline_load_state_dict(pipe: IterDataPipe, state: Mapping | EpochState) -> None:
    """Loads an exact-epoch state into the exact-epoch source (ExactEpochs, MixedEpochs) upstream of ``pipe``."""
    found = _exact_source(_unwrapped(pipe))
    if found is None:
        raise ValueError(f"{type(pipe).__name__}: an exact-epoch state can only be loaded into a pipeline "
                         "built on ExactEpochs or MixedEpochs")
    source = found[0]
    source.load_state_dict(state)
    for other in _epoch_aware(_unwrapped(pipe)):  # e.g. a random transform's draws: the same epoch
        if other is not source:
            other.set_epoch(source._clock.next_epoch())


def pipeline_set_epoch(pipe: IterDataPipe, epoch: int) -> None:
    """Sets the next epoch of every pipe upstream of ``pipe`` that draws per-epoch orders
    (:class:`ExactEpochs`, :class:`MixedEpochs`, the shard listers' and ``shuffle_samples``' seeds)."""
    targets = _epoch_aware(_unwrapped(pipe))
    if not targets:
        raise AttributeError(f"{type(pipe).__name__} has no set_epoch: nothing upstream draws per-epoch orders")
    for target in targets:
        target.set_epoch(epoch)


def _epoch_aware(pipe: IterDataPipe) -> list:
    """The pipes of ``pipe``'s graph that draw per-epoch orders (they define ``set_epoch``)."""
    return [p for p in _all_pipes(traverse_dps(pipe)) if any("set_epoch" in vars(c) for c in type(p).__mro__)]


def _all_pipes(graph: dict) -> list:
    pipes = []
    for node, children in graph.values():
        pipes.append(node)
        pipes.extend(_all_pipes(children))
    return pipes


# On every IterDataPipe, and so on the wrapper DataLoader puts around one
# (``loader.dataset.set_epoch(e)`` works as it does for a DistributedSampler).
IterDataPipe.register_function("state_dict", pipeline_state_dict)
IterDataPipe.register_function("load_state_dict", pipeline_load_state_dict)
IterDataPipe.register_function("set_epoch", pipeline_set_epoch)
