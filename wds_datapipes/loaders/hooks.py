"""The hooks loaders call on a whole pipeline: ``state_dict``, ``load_state_dict`` and ``set_epoch``.

Registered on every ``IterDataPipe`` (and so on the wrapper the DataLoaders put around
one) when ``wds_datapipes`` is imported: StatefulDataLoader and ``torchdata.nodes`` then
save an exact epoch's position with their own checkpoints, and
``loader.dataset.set_epoch(e)`` reaches every pipe upstream that draws per-epoch orders,
as it does for a ``DistributedSampler``.

A pipeline without an exact-epoch source (``ShardLister`` and friends) has a position too:
its epoch and how many items it yielded in it. It resumes by reading that epoch again
from its start (the same shard and sample orders: they follow the seeds and the epoch)
and passing over those items, which is exact where the orders are seeded; only an index
(``ExactEpochs``) resumes without reading anything twice.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping

from ..epochs.epoch_pipe import EpochPipe
from ..epochs.state import EpochState
from ..topology import EpochSeed
from ..torch_datapipes import IterDataPipe, traverse_dps

_SOURCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
REPLAY = "wds_datapipes.replay/1"  # the state of a pipeline without an exact-epoch source
_SEEDED_NAMES = {"_SeededOrder": "the shard lister (shuffle=True)", "Shuffler": "shuffle_samples"}


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
        return _replay_state(pipe)
    source, unit = found
    return source.state_at(pipe._number_of_samples_yielded * unit).to_dict()


def pipeline_load_state_dict(pipe: IterDataPipe, state: Mapping | EpochState | None) -> None:
    """Loads a state into the exact-epoch source (ExactEpochs, MixedEpochs) upstream of ``pipe``, or
    a replay state (see the module) into a pipeline without one."""
    if state is None:  # saved by an earlier version, which kept no state for such pipelines
        return
    if isinstance(state, Mapping) and state.get("format") == REPLAY:
        _load_replay(_unwrapped(pipe), state)
        return
    found = _exact_source(_unwrapped(pipe))
    if found is None:
        raise ValueError(f"{type(pipe).__name__}: an exact-epoch state can only be loaded into a pipeline "
                         "built on ExactEpochs or MixedEpochs")
    source = found[0]
    source.load_state_dict(state)
    for other in _epoch_aware(_unwrapped(pipe)):  # e.g. a random transform's draws: the same epoch
        if other is not source:
            other.set_epoch(source._clock.next_epoch())


def _replay_state(pipe: IterDataPipe) -> dict:
    seeded = _seeded_pipes(pipe)  # one walk of the graph: StatefulDataLoader asks after every batch
    seeds = [s for _, s in seeded]
    items = pipe._number_of_samples_yielded
    epoch = seeds[0].epoch - (items > 0) if seeds else 0  # an iteration has drawn its orders: the next epoch's count
    unseeded = sorted({_SEEDED_NAMES.get(type(p).__name__, type(p).__name__) for p, s in seeded
                       if s.seed is None and s.loader_seed is None
                       and p.__dict__.get("shuffle_order", True)})  # a lister that does not shuffle draws nothing
    # The loader seeds the epoch drew its orders from: StatefulDataLoader's checkpoint names a
    # shared seed other than the one its workers were given for their first epoch.
    return {"format": REPLAY, "epoch": max(epoch, 0), "items": items, "unseeded": unseeded,
            "loader_seeds": [s.loader_seed for s in seeds]}


def _load_replay(pipe: IterDataPipe, state: Mapping) -> None:
    if state.get("unseeded"):
        raise ValueError(f"this pipeline's position cannot be resumed exactly: {state['unseeded']} shuffled "
                         "without a seed, so a new process draws other orders; give them seed= (or resume "
                         "from a shard index with ExactEpochs)")
    seeds, saved = _seeds(pipe), state.get("loader_seeds")
    if saved is not None and len(saved) == len(seeds):  # the pipeline it was saved from
        for seed, loader_seed in zip(seeds, saved, strict=True):
            seed.loader_seed = loader_seed
    for other in _epoch_aware(pipe):
        other.set_epoch(int(state["epoch"]))
    if int(state["items"]):
        pipe._fast_forward_iterator = _Skipping(pipe, int(state["items"]))


class _Skipping:
    """The first iterator of a resumed pipeline: its epoch from the start, less ``count`` items.

    torch hands it out as the pipe's next iterator (``_fast_forward_iterator``); a plain
    object, not a generator, so that the pipe still pickles to loader workers.
    """

    def __init__(self, pipe: IterDataPipe, count: int):
        self.pipe, self.count, self._it = pipe, count, None

    def __iter__(self):
        return self

    def __next__(self):
        if self._it is None:
            self._it = iter(self.pipe)  # a new iteration: torch took this object off the pipe first
            for _ in range(self.count):
                next(self._it)
        return next(self._it)

    def __getstate__(self) -> dict:
        return {"pipe": self.pipe, "count": self.count, "_it": None}


def _seeded_pipes(pipe: IterDataPipe) -> list:
    """(pipe, its EpochSeed) for each pipe of ``pipe``'s graph that draws orders from seeds."""
    return [(node, node.__dict__["seeds"]) for node in _all_pipes(traverse_dps(pipe))
            if isinstance(node.__dict__.get("seeds"), EpochSeed)]


def _seeds(pipe: IterDataPipe) -> list[EpochSeed]:
    return [seeds for _, seeds in _seeded_pipes(pipe)]


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
