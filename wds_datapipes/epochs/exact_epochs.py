"""``ExactEpochs``: a shard index in, this rank's and worker's samples of each epoch out.

Each epoch follows the plan of :mod:`wds_datapipes.epochs.plan`: every rank yields the same
number of batches, every sample comes once (``drop``) or at least once with the repeats
flagged (``pad``), and a stopped run resumes exactly where it stopped, on the same or
another topology. The loaders' hooks, the epochs and the state are :mod:`.epoch_pipe`'s; :mod:`.reading`
reads what the plan says.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..limits import Limits
from ..storage.cloud_settings import StoreArg
from .epoch_pipe import EpochPipe, Run
from .index import ShardIndex
from .plan import PlanSettings, Segment, plan_epoch
from .reading import check_shards, read_share
from .state import EpochState


class ExactEpochs(EpochPipe):
    """Yields this rank's and worker's raw samples of each epoch, by an exact, resumable plan.

    A source pipe: it takes a :class:`~wds_datapipes.epochs.index.ShardIndex` (or its
    location) and yields sample dicts like ``group_by_key()``'s, each with a ``__pad__``
    flag (True for the repeats of ``pad`` mode). Every rank yields the same number of
    batches of ``batch_size`` in every epoch, so DDP never waits on a rank that ran out.
    Ranks and workers read contiguous runs of the epoch's sequence, starting and ending
    anywhere inside a shard.

    Args:
        index: a ShardIndex, or the location of its JSON file.
        batch_size: the batch size of the pipeline (``batch_samples(n)``,
            ``decode_batches(..., batch_size=n)`` or the DataLoader's ``batch_size``):
            worker shares are cut in whole batches.
        mode: ``"drop"``: every sample at most once, the few that do not divide evenly
            between ranks are left out (and logged); ``"pad"``: every sample at least once,
            a few repeated to fill, flagged ``__pad__``.
        shuffle: a new shard order and sample order each epoch, drawn from ``seed`` and the
            epoch: the same on every rank and worker, and in a resumed run.
        seed: the seed of every shuffle (loaders' seeds are not used: every rank must agree).
        samples_per_epoch: epochs of this many samples (over all ranks) instead of one pass
            over the data: consecutive windows over passes in new orders.
        rank, world_size: this process's place; by default the loader's
            DistributedReadingService, ``torch.distributed``, or ``RANK``/``WORLD_SIZE``.
        lanes, block: the shuffle's shape: each reader reads ``lanes`` runs of its share side
            by side and yields blocks of ``block`` samples in a random order (the memory
            held is one block of raw samples).
        allow_pipe: with an index location, let its shard URLs be ``pipe:`` commands.
        limits: the largest member, HTTP timeouts, ...: by default the process's
            :func:`~wds_datapipes.limits.get_limits` when the pipe is built.
        views: fields as read-only ``memoryview`` objects instead of ``bytes``. Where the index
            has member places, they are slices of the read (up to a megabyte) around them:
            one copy per member (page cache to that read) instead of two, and a sample
            keeps its read alive. ``decode_batches`` decodes images from them; ``decode``
            copies each field into ``bytes`` first; other code may need ``bytes(field)``.
            A memoryview cannot be pickled: decode in the DataLoader worker, not after.
        store: this pipeline's own object-store settings for the index and its shards,
            ahead of the process's (as ``ShardLister``'s ``store``: a ``StoreSettings`` or
            ``{prefix: StoreSettings}``); they hold no secret and pickle with the pipe.

    Epochs are counted as the loaders start them; ``set_epoch(e)`` sets the next one, as
    ``DistributedSampler.set_epoch`` does. ``state_dict()`` / ``load_state_dict()`` (also on
    the last pipe of a pipeline built on this one) save and restore the position; see
    :class:`~wds_datapipes.epochs.state.EpochState`.

    Example:
        >>> dp = ExactEpochs("data/index.json", batch_size=64, seed=0).decode("torchrgb8").batch_samples(64)
    """

    def __init__(
        self,
        index: ShardIndex | str,
        *,
        batch_size: int,
        mode: str = "drop",
        shuffle: bool = True,
        seed: int = 0,
        samples_per_epoch: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        lanes: int = 16,
        block: int = 512,
        allow_pipe: bool = False,
        limits: Limits | None = None,
        views: bool = False,
        store: StoreArg = None,
    ):
        self.index = (index.with_store(store) if isinstance(index, ShardIndex)
                      else ShardIndex.load(index, allow_pipe=allow_pipe, store=store))
        settings = PlanSettings(seed=seed, batch_size=batch_size, mode=mode, shuffle=shuffle,
                                samples_per_epoch=samples_per_epoch, lanes=lanes, block=block)
        super().__init__(settings, rank, world_size, limits, views)

    def _plan(self, epoch: int, world: int, workers: int, history: tuple[Segment, ...] = (),
              state: EpochState | None = None):
        return plan_epoch(self.index.sizes, self.settings, epoch, world, workers, history)

    def _read(self, run: Run) -> Iterator[dict]:
        rank, worker = run.topology.rank, run.plan_worker
        spans = run.plan.reader_spans(rank, worker)
        check_shards(self.index, spans)
        yield from read_share(self.index, run.plan.reader(rank, worker), spans, run.start, self.limits, self.views)

    def _accept(self, state: EpochState) -> None:
        if state.mixture is not None:
            raise ValueError("this is a mixture's state (MixedEpochs'); ExactEpochs reads one dataset")
        if state.settings is not None and state.settings != self.settings:
            raise ValueError(f"the state was saved with other plan settings ({state.settings}) than this "
                             f"pipe's ({self.settings}): seed, batch_size, mode, shuffle, lanes and block must match")
