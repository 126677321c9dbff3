"""``MixedEpochs``: several shard indexes in, one exact epoch of all of them out, each by its weight.

Each epoch follows the plan of :mod:`wds_datapipes.epochs.mixture`; the loaders' hooks, the
epochs and the state are :mod:`.epoch_pipe`'s, as for one dataset; each source's part is
read as one dataset's share is (:mod:`.reading`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence

from ..limits import Limits
from ..stats.probe import probe as stats_probe
from ..storage.cloud_settings import StoreArg
from .epoch_pipe import EpochPipe, Run
from .index import ShardIndex
from .mixture import MixSettings, Window, epoch_windows, next_cursor, plan_mixture
from .plan import PlanSettings, Segment
from .reading import check_shards, read_mixed
from .state import EpochState, SourceWindow
from .stream import Cursor

logger = logging.getLogger("wds_datapipes")

Index = ShardIndex | str


class MixedEpochs(EpochPipe):
    """Yields this rank's and worker's samples of each epoch of a mixture of datasets, each by its weight.

    A source pipe, like :class:`~wds_datapipes.ExactEpochs` (whose guarantees it keeps: every
    rank the same number of batches, every planned sample once, exact resume on the same or
    another topology), over several shard indexes. Each sample is a dict like
    ``group_by_key()``'s with ``__pad__`` and ``__source__`` (the source's name).

    How many samples each source gives per epoch, by one of:

    - ``samples_per_epoch`` and ``weights``: the epoch's samples shared by the weights
      (largest remainders, exact); each source cycles through passes over its shards, each
      pass in a new order. Without weights, in proportion to the sources' sizes.
    - ``weights`` and ``stop``: ``"first_exhausted"``, the epoch ends when the first source
      has given all its samples (every sample at most once); ``"all_exhausted"``, when every
      source has (the others repeat: each source's epoch starts a new pass, so every sample
      comes in every epoch).
    - per source, ``repeat`` (a factor of its size: 0.5 takes half, the next epoch the other
      half; 3 upsamples) or ``choose`` (a count); a source given neither comes once.

    No sample comes twice in an epoch unless a source is asked for more than it holds; then
    each of its samples at most ``ceil(count / size)`` times (:mod:`.stream`).

    Args:
        sources: ``{name: index}``, or a list of indexes or ``(name, index)`` pairs (an index
            is a ShardIndex or the location of its JSON; a bare location is named after its
            folder, or its file where the folder names clash).
        batch_size: the pipeline's batch size, as for ExactEpochs.
        weights: ``{name: weight}``, any scale, >= 0 (0: the source gives nothing).
        samples_per_epoch: the epoch's length, shared by the weights.
        stop: ``"first_exhausted"``, ``"all_exhausted"`` (weights without
            ``samples_per_epoch``), or ``"cycle"`` (with it, the default).
        repeat, choose: ``{name: factor}``, ``{name: count}`` (without weights).
        batching: ``"random"``: each source's count exact per epoch, the order random;
            ``"stratified"``: every batch holds each source's share within one sample;
            ``"per_source"``: every batch from one source, the sources' batches in proportion
            (each source's count rounded to whole batches: down in ``drop`` mode, up with pads
            in ``pad`` mode). The last two give ranks whole batches only.
        mode, shuffle, seed, rank, world_size, lanes, block, allow_pipe, limits, views, store: as
            for ExactEpochs; ``lanes`` and ``block`` apply per source (the blocks share one
            ``block`` by the sources' parts).

    Weights, counts and batching may change when a run resumes (a curriculum): the resumed
    epoch finishes as it was planned, the new settings hold from the next one; sources may be
    added (they start at their first pass) or left out then. ``batch_size`` must stay. For
    ``DataLoader`` and DataLoader2, save :meth:`step_state` (the step count with its mix): a bare
    ``EpochState(epoch, batches)`` is refused past an epoch's start.

    Example:
        >>> dp = MixedEpochs({"web": "web/index.json", "books": "books/index.json"},
        ...                  weights={"web": 0.7, "books": 0.3}, samples_per_epoch=1_000_000,
        ...                  batch_size=64, batching="stratified").decode("torchrgb8").batch_samples(64)
    """

    def __init__(
        self,
        sources: Mapping[str, Index] | Sequence[Index | tuple[str, Index]],
        *,
        batch_size: int,
        weights: Mapping[str, float] | None = None,
        samples_per_epoch: int | None = None,
        stop: str | None = None,
        repeat: Mapping[str, float] | None = None,
        choose: Mapping[str, int] | None = None,
        batching: str = "random",
        mode: str = "drop",
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        lanes: int = 16,
        block: int = 512,
        allow_pipe: bool = False,
        limits: Limits | None = None,
        views: bool = False,
        store: StoreArg = None,
    ):
        named = _named(sources)
        names = tuple(name for name, _ in named)
        per_source = {"weights": weights, "repeat": repeat, "choose": choose}
        for label, values in per_source.items():
            unknown = sorted(set(values or {}) - set(names))
            if unknown:
                raise ValueError(f"{label} name sources that are not in the mixture: {unknown}; its sources: "
                                 f"{list(names)}")
        settings = MixSettings(
            names=names,
            weights=None if weights is None else tuple(float(weights.get(n, 0.0)) for n in names),
            repeat=None if repeat is None else tuple(repeat.get(n) for n in names),
            choose=None if choose is None else tuple(choose.get(n) for n in names),
            samples_per_epoch=samples_per_epoch, stop=stop, batching=batching, seed=seed, batch_size=batch_size,
            mode=mode, shuffle=shuffle, lanes=lanes, block=block)
        self.indexes = {name: index.with_store(store) if isinstance(index, ShardIndex)
                        else ShardIndex.load(index, allow_pipe=allow_pipe, store=store) for name, index in named}
        super().__init__(settings, rank, world_size, limits, views)
        self._anchor: tuple[int, dict[str, Cursor]] = (0, {})  # the first epoch of these settings, its starts
        self._windows(0, settings)  # a source to give samples without any: said now, not at the first epoch

    @property
    def names(self) -> tuple[str, ...]:
        """The sources' names, in the order the plan keeps them (and ``__source__`` gives)."""
        return self.settings.names

    def _windows(self, epoch: int, settings: MixSettings) -> list[Window]:
        """Each source's window of ``epoch``: on from where the sources stood at the anchor
        (a loaded state's next epoch), else from epoch 0."""
        anchor, starts = self._anchor
        totals = [self.indexes[n].total for n in settings.names]
        if epoch < anchor:
            anchor, starts = 0, {}
        return epoch_windows(settings, totals, epoch, anchor, [starts.get(n, Cursor()) for n in settings.names])

    # ------------------------------------------------------------ EpochPipe's questions

    def _plan(self, epoch: int, world: int, workers: int, history: tuple[Segment, ...] = (),
              state: EpochState | None = None):
        if state is not None and state.mixture is not None and state.epoch == epoch:
            settings = state.settings
            saved = {w.name: w for w in state.mixture}
            windows = [Window(saved[n].start, saved[n].count, saved[n].skip_pass, saved[n].skip)
                       for n in settings.names]
        else:
            settings = self.settings
            windows = self._windows(epoch, settings)
        sizes = [self.indexes[n].sizes for n in settings.names]
        return plan_mixture(sizes, settings, epoch, windows, world, workers, history)

    def _read(self, run: Run) -> Iterator[dict]:
        reader = run.reader()
        names = run.plan.settings.names
        indexes = [self.indexes[n] for n in names]
        for index, spans in zip(indexes, reader.spans):
            check_shards(index, spans)
        probe = stats_probe(self._stats)  # stats: the epoch's draws per source against its plan's shares
        mix = None if probe is None else probe.mixture("MixedEpochs", run.epoch, names,
                                                       tuple(float(w.count) for w in run.plan.windows))
        yield from read_mixed(indexes, names, reader, run.start, self.limits, self.views, mix)

    def _state_fields(self, run: Run) -> dict:
        settings = run.plan.settings
        windows = tuple(SourceWindow(n, w.start, w.count, self.indexes[n].total, len(self.indexes[n]), w.skip_pass,
                                     w.skip) for n, w in zip(settings.names, run.plan.windows))
        return {"settings": settings, "mixture": windows}

    def step_state(self, epoch: int, batches: int, world: int | None = None, workers: int | None = None) -> EpochState:
        """The state after this rank took ``batches`` batches of ``epoch`` (a step count), with
        the mix that plans that epoch: what to save in a checkpoint for ``DataLoader`` and
        DataLoader2 (``.to_dict()`` is plain JSON), so that a pipe built with other weights,
        counts or batching finishes the epoch as it was planned. ``world`` and ``workers``:
        the topology of the run that took them, as for :class:`EpochState`."""
        pending = self._resume if self._resume is not None and self._resume.epoch == epoch else None
        plan = self._plan(epoch, world or self._where.resolve().world, 1, (), pending)
        windows = tuple(SourceWindow(n, w.start, w.count, self.indexes[n].total, len(self.indexes[n]), w.skip_pass,
                                     w.skip) for n, w in zip(plan.settings.names, plan.windows))
        return EpochState(epoch=epoch, batches=batches, world=world, workers=workers, settings=plan.settings,
                          mixture=windows)

    def _accept(self, state: EpochState) -> None:
        if isinstance(state.settings, PlanSettings):
            raise ValueError("this is one dataset's state (ExactEpochs'); MixedEpochs reads a mixture")  # noqa: TRY004
        if state.mixture is None:  # a bare step count: fine at an epoch's start only
            # Whether an epoch ended depends on its plan, which new weights or a new stop rule
            # change: the end of an epoch is saved as the next one's start, or with the mix.
            if state.batches != 0 if state.batches is not None else any(state.taken):
                raise ValueError(
                    f"{state.epoch_label()} holds no mix: this MixedEpochs would plan epoch {state.epoch} by its own "
                    "weights, counts and batching, which need not be the ones that planned it. Save "
                    "source.step_state(epoch, batches).to_dict() in the checkpoint (the step count with its mix) and "
                    "load that, or StatefulDataLoader's state_dict()")
            return
        for window in state.mixture:
            index = self.indexes.get(window.name)
            if index is None:
                raise ValueError(f"the state's epoch reads source {window.name!r}, which this mixture does not have "
                                 f"({list(self.names)}): it can be left out from the next epoch on, not mid-epoch")
            if (index.total, len(index)) != (window.samples, window.shards):
                raise ValueError(f"source {window.name!r} has {index.total} samples in {len(index)} shards, the state "
                                 f"was saved with {window.samples} in {window.shards}: its index changed")
        if state.settings.batch_size != self.settings.batch_size:
            raise ValueError(f"the state was saved with batch_size={state.settings.batch_size}, this pipe has "
                             f"{self.settings.batch_size}: batch_size must stay (the epoch's shares are whole batches)")
        if state.settings != self.settings:
            logger.info("mixture: epoch %d finishes as it was planned; the new settings hold from epoch %d",
                        state.epoch, state.epoch + 1)

    def _adopt(self, state: EpochState, finished: bool) -> None:
        if state.mixture is None:
            return
        self._anchor = (state.epoch + 1, {w.name: next_cursor(Window(w.start, w.count, w.skip_pass, w.skip),
                                                              w.samples, state.settings.stop)
                                          for w in state.mixture})


def _named(sources) -> list[tuple[str, Index]]:
    """The sources as (name, index) pairs; a bare location is named after its folder (or
    file, where folders clash); names must differ."""
    if isinstance(sources, Mapping):
        pairs = list(sources.items())
    else:
        pairs = [s if isinstance(s, tuple) else (None, s) for s in sources]
        unnamed = [index for name, index in pairs if name is None]
        by_folder = [_location_name(index, folder=True) for index in unnamed]
        clash = len(set(by_folder)) < len(by_folder)
        names = iter(_location_name(index, folder=not clash) for index in unnamed)
        pairs = [(name if name is not None else next(names), index) for name, index in pairs]
    for name, _ in pairs:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a source's name must be a non-empty string, got {name!r}")
    twice = sorted({n for n, _ in pairs if [m for m, _ in pairs].count(n) > 1})
    if twice:
        raise ValueError(f"two sources have the same name: {twice}; give each its own name "
                         "({name: index} or (name, index) pairs)")
    return pairs


def _location_name(index: Index, folder: bool) -> str:
    if isinstance(index, ShardIndex):  # its base is its folder
        if not index.base or not folder:
            raise ValueError("name the sources given as ShardIndex objects: {name: index} or (name, index) pairs")
        return os.path.basename(index.base.rstrip("/"))
    parent, file = os.path.split(index.rstrip("/"))
    return (os.path.basename(parent) or file) if folder else os.path.splitext(file)[0]
