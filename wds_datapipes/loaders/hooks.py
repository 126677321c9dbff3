"""The hooks loaders call on a whole pipeline: ``state_dict``, ``load_state_dict`` and ``set_epoch``.

A pipeline holding a pipe of ours that draws per-epoch orders (``ExactEpochs``,
``MixedEpochs``, a shuffling ``ShardLister``, ``shuffle_samples``, ``RandomMix``, a random
crop) answers the three names wherever it ends, and so does the wrapper the DataLoaders put
around it: StatefulDataLoader and ``torchdata.nodes`` then save its position with their own
checkpoints, and ``loader.dataset.set_epoch(e)`` reaches every pipe upstream that draws
per-epoch orders, as it does for a ``DistributedSampler``. Any other pipeline (torch's own
pipes, or ours without such a pipe) has none of the three: importing ``wds_datapipes``
changes nothing for it, and StatefulDataLoader checkpoints it as it would without us. Which
pipeline is which is found by one walk of its graph, kept per pipe (weakly).

An exact-epoch source's state is a few integers. A pipeline without one (``ShardLister``
and friends) has a position too: its epoch and how many items it yielded in it. It resumes
by reading that epoch again from its start (the same shard and sample orders: they follow
the seeds and the epoch) and passing over those items, which is exact where the orders are
seeded; only an index (``ExactEpochs``) resumes without reading anything twice. Either
state is built from what the walk kept, without walking (pickling) the graph again: its
size and cost do not grow with the graph's data (a lister's URLs, a wrapped list).
"""

from __future__ import annotations

import logging
import types
import weakref
from collections.abc import Mapping

from ..epochs.epoch_pipe import EpochPipe
from ..epochs.state import EpochState
from ..pipe_base import Pipe
from ..topology import EpochSeed
from ..torch_datapipes import IterDataPipe, add_graph_attributes, walk_graph

logger = logging.getLogger("wds_datapipes")
REPLAY = "wds_datapipes.replay/1"  # the state of a pipeline without an exact-epoch source


class _Graph:
    """What one walk of a pipeline's graph found: the pipes that take ``set_epoch``, those that
    draw from an :class:`EpochSeed`, and the exact-epoch source with the samples in each item
    the last pipe yields. Pipes are held weakly (the last pipe may be one of them)."""

    def __init__(self, listeners: list, seeded: list, exact: tuple[EpochPipe, int] | None):
        self._listeners = [weakref.ref(p) for p in listeners]
        self._seeded = [weakref.ref(p) for p in seeded]
        self._exact = None if exact is None else (weakref.ref(exact[0]), exact[1])
        # the hooks answer only where a pipe of ours draws per-epoch orders
        self.ours = exact is not None or any(isinstance(p, Pipe) for p in listeners)

    @property
    def listeners(self) -> list:
        return [ref() for ref in self._listeners]

    @property
    def seeded(self) -> list:
        return [ref() for ref in self._seeded]

    @property
    def exact(self) -> tuple[EpochPipe, int] | None:
        return None if self._exact is None else (self._exact[0](), self._exact[1])


_GRAPHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_NOTHING = _Graph([], [], None)
_walking: set[int] = set()  # pipes whose graph is being walked (the walk pickles: no hooks meanwhile)


def _graph(pipe: IterDataPipe) -> _Graph:
    """What ``pipe``'s graph holds, walked once per pipe (StatefulDataLoader asks after every batch)."""
    try:
        return _GRAPHS[pipe]
    except KeyError:
        pass
    except TypeError:  # a pipe that cannot be weakly referenced: walked each time
        return _walk(pipe)
    if id(pipe) in _walking:
        return _NOTHING
    _walking.add(id(pipe))
    try:
        found = _GRAPHS[pipe] = _walk(pipe)
    finally:
        _walking.discard(id(pipe))
    return found


def _walk(pipe: IterDataPipe) -> _Graph:
    graph = walk_graph(pipe)
    pipes = list({id(p): p for p in _all_pipes(graph)}.values())  # once each (forks meet again)
    listeners = [p for p in pipes if any("set_epoch" in vars(c) for c in type(p).__mro__)]
    seeded = [p for p in pipes if isinstance(p.__dict__.get("seeds"), EpochSeed)]
    exact = (pipe, 1) if isinstance(pipe, EpochPipe) else _find_source(pipe, graph)
    return _Graph(listeners, seeded, exact)


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
        if isinstance(size, int):
            if size != source.settings.batch_size:
                raise ValueError(f"{type(node).__name__} batches by {size}, but {type(source).__name__} was built with "
                                 f"batch_size={source.settings.batch_size}: they must agree")
            unit *= size
        return source, unit
    return None


def _unwrapped(pipe: IterDataPipe) -> IterDataPipe:
    """The pipe inside the serialization wrapper that DataLoader puts around a DataPipe."""
    return pipe.__dict__.get("_datapipe", pipe)


def pipeline_state_dict(pipe: IterDataPipe) -> dict | None:
    """The position after what ``pipe`` has yielded: an exact epoch's state where an exact-epoch
    source is upstream, else a replay state (see the module); None where no pipe of ours
    draws per-epoch orders (nothing of ours to save).

    It is ``state_dict`` on the pipelines described in the module (and on the wrapper the
    DataLoaders put around one), which makes StatefulDataLoader save it with its own
    checkpoints. It costs what the state costs: the graph was walked once, before.
    """
    pipe = _unwrapped(pipe)
    graph = _graph(pipe)
    if graph.exact is not None:
        source, unit = graph.exact
        return source.state_at(pipe._number_of_samples_yielded * unit).to_dict()
    if not graph.ours:
        return None
    return _replay_state(pipe, graph)


def pipeline_load_state_dict(pipe: IterDataPipe, state: Mapping | EpochState | None) -> None:
    """Loads a state into the exact-epoch source (ExactEpochs, MixedEpochs) upstream of ``pipe``, or
    a replay state (see the module) into a pipeline without one."""
    if state is None:  # saved by an earlier version, which kept no state for such pipelines
        return
    pipe = _unwrapped(pipe)
    graph = _graph(pipe)
    if isinstance(state, Mapping) and state.get("format") == REPLAY:
        _load_replay(pipe, graph, state)
        return
    if graph.exact is None:
        raise ValueError(f"{type(pipe).__name__}: an exact-epoch state can only be loaded into a pipeline "
                         "built on ExactEpochs or MixedEpochs")
    source = graph.exact[0]
    source.load_state_dict(state)
    for other in graph.listeners:  # e.g. a random transform's draws: the same epoch
        if other is not source:
            other.set_epoch(source._clock.next_epoch())


def _replay_state(pipe: IterDataPipe, graph: _Graph) -> dict:
    seeded = graph.seeded
    seeds = [p.seeds for p in seeded]
    items = pipe._number_of_samples_yielded
    epoch = seeds[0].epoch - (items > 0) if seeds else 0  # an iteration has drawn its orders: the next epoch's count
    # a pipe may name itself (``orders_name``) and say it draws nothing this time (``draws_orders``)
    unseeded = sorted({getattr(p, "orders_name", type(p).__name__) for p, s in zip(seeded, seeds, strict=True)
                       if s.seed is None and s.loader_seed is None and getattr(p, "draws_orders", True)})
    # The loader seeds the epoch drew its orders from: StatefulDataLoader's checkpoint names a
    # shared seed other than the one its workers were given for their first epoch.
    return {"format": REPLAY, "epoch": max(epoch, 0), "items": items, "unseeded": unseeded,
            "loader_seeds": [s.loader_seed for s in seeds]}


def _load_replay(pipe: IterDataPipe, graph: _Graph, state: Mapping) -> None:
    if state.get("unseeded"):
        raise ValueError(f"this pipeline's position cannot be resumed exactly: {state['unseeded']} shuffled "
                         "without a seed, so a new process draws other orders; give them seed= (or resume "
                         "from a shard index with ExactEpochs)")
    seeds, saved = [p.seeds for p in graph.seeded], state.get("loader_seeds")
    if saved is not None and len(saved) == len(seeds):  # the pipeline it was saved from
        for seed, loader_seed in zip(seeds, saved, strict=True):
            seed.loader_seed = loader_seed
    for other in graph.listeners:
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


def pipeline_set_epoch(pipe: IterDataPipe, epoch: int) -> None:
    """Sets the next epoch of every pipe upstream of ``pipe`` that draws per-epoch orders
    (:class:`ExactEpochs`, :class:`MixedEpochs`, the shard listers' and ``shuffle_samples``' seeds,
    a random crop's draws); where none does, it does nothing (said at DEBUG)."""
    targets = _graph(_unwrapped(pipe)).listeners
    if not targets:
        logger.debug("set_epoch(%d) on %s: nothing upstream draws per-epoch orders", epoch, type(pipe).__name__)
    for target in targets:
        target.set_epoch(epoch)


def _all_pipes(graph: dict) -> list:
    pipes = []
    for node, children in graph.values():
        pipes.append(node)
        pipes.extend(_all_pipes(children))
    return pipes


HOOKS = {"state_dict": pipeline_state_dict, "load_state_dict": pipeline_load_state_dict,
         "set_epoch": pipeline_set_epoch}


def _hook(pipe: IterDataPipe, name: str):
    """``name``'s hook bound to ``pipe`` where its graph holds a pipe of ours that draws
    per-epoch orders; else None (the pipe has no such attribute, as without us)."""
    return types.MethodType(HOOKS[name], pipe) if _graph(_unwrapped(pipe)).ours else None


# On the pipes of such graphs, and so on the wrapper DataLoader puts around one
# (``loader.dataset.set_epoch(e)`` works as it does for a DistributedSampler).
add_graph_attributes(frozenset(HOOKS), _hook)
