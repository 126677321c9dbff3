"""The ``batch_samples`` pipe: lists of samples into batches, stacking what stacks."""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Callable, Iterable, Iterator, Sequence
from numbers import Number
from typing import Any

import numpy as np
import torch

from ..pipe_base import Pipe
from ..stats.probe import probe as stats_probe
from ..stats.settings import current_settings
from ..threads import check_positive
from ..torch_datapipes import IterDataPipe, functional_datapipe
from .shared_batches import INLINE_MAX_BYTES, reused_storage, sent_inline


def chunks(items: Iterable[Any], size: int, partial: bool = True) -> Iterator[list]:
    """Lists of ``size`` consecutive items; the last, shorter one only if ``partial``."""
    batch: list = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch and partial:
        yield batch


def collate(items: Sequence[Any]) -> Any:
    """One batch value from the same field of several samples.

    Tensors or arrays of one shape and dtype stack into a tensor (arrays become tensors);
    ints, floats and bools (also numpy scalars) become a 1-d tensor, dtypes as torch's
    ``default_collate`` gives them (int64, float64, bool); dicts and tuples collate field by field;
    anything else (strings, bytes, ragged shapes) stays a list.
    """
    first = items[0]
    if isinstance(first, torch.Tensor):
        if all(isinstance(x, torch.Tensor) and x.shape == first.shape and x.dtype == first.dtype for x in items):
            return stack_tensors(items)
        return list(items)
    if isinstance(first, np.ndarray):
        if all(isinstance(x, np.ndarray) and x.shape == first.shape and x.dtype == first.dtype for x in items):
            return _fill(items, first.shape)
        return list(items)
    if isinstance(first, (bool, np.bool_, Number)) and not isinstance(first, (complex, np.complexfloating)):
        if all(isinstance(x, (bool, np.bool_, int, float, np.integer, np.floating)) for x in items):
            # Through numpy, so dtypes follow default_collate: int64, float64, bool, and
            # numpy scalars keep theirs.
            return sent_inline(torch.from_numpy(np.asarray(items)))
        return list(items)
    if isinstance(first, dict):
        if all(isinstance(x, dict) and x.keys() == first.keys() for x in items):
            return {k: collate([x[k] for x in items]) for k in first}
        return list(items)
    if isinstance(first, tuple):
        if all(isinstance(x, tuple) and len(x) == len(first) for x in items):
            return tuple(collate(column) for column in zip(*items))
        return list(items)
    return list(items)


def stack_tensors(items: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.stack(items)`` that keeps the first item's memory layout, copied through numpy.

    Decoded images are CHW views of HWC arrays: their batch comes out as an NCHW tensor
    in channels_last layout (a view of one NHWC buffer), equal to ``torch.stack``'s by
    value. Copying row by row in layout order with numpy is ~3x faster than
    ``torch.stack``, which transposes (1.4 vs 4.4 ms for 64 256x256 images here with one
    torch thread), and uses no intra-op threads: with two, on cores that decoding threads
    or other processes hold, ``torch.stack`` took 35 ms and more. Items of other strides
    (crops: views into images of different widths) are copied the same way: numpy reads
    any strides (``torch.stack`` took 8 ms a batch of 64 224x224 crops, numpy 1.5).
    The batch is made by :func:`new_batch`: in shared memory in a loader's worker (a small one
    in its own memory, sent by value).
    """
    first = items[0]
    order = sorted(range(first.dim()), key=lambda d: -first.stride(d))  # outermost dimension first
    plain = first.device.type == "cpu" and not first.requires_grad and first.dtype in _NUMPY_DTYPES
    if not plain or any(x.is_conj() or x.is_neg() for x in items):
        return torch.stack(list(items))
    layout = tuple(first.shape[d] for d in order)
    batch = _fill([x.permute(order).numpy() for x in items], layout)
    inverse = [0] * len(order)
    for position, d in enumerate(order):
        inverse[d] = position + 1
    return batch.permute(0, *inverse)


# The dtypes that stack through numpy (torch.stack takes the others: bfloat16, float8, ...).
_NUMPY_DTYPES = frozenset({
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32,
    torch.float64, torch.complex64, torch.complex128,
})


def new_batch(shape: tuple[int, ...], dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """An uninitialised CPU tensor for a batch; in shared memory in a child process (a loader's
    worker), which sends it to the main process as it is (torch would otherwise copy it
    into new shared memory at the send: ~4 ms of a batch of 64 224x224 crops here, as
    torch's own ``default_collate`` avoids the same way). In a worker the memory of a batch the
    main process has let go is written again (:mod:`.shared_batches`: no new pages a batch);
    a small one (labels) is private memory sent by value (no descriptor to pass)."""
    size = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    if multiprocessing.parent_process() is None or size == 0:
        return torch.empty(shape, dtype=dtype)
    if size <= INLINE_MAX_BYTES:
        return sent_inline(torch.empty(shape, dtype=dtype))
    storage = reused_storage(size)
    if storage is None:
        storage = torch.UntypedStorage._new_shared(size)
    return torch.empty(0, dtype=dtype).set_(storage).view(shape)


def _fill(arrays: Sequence[np.ndarray], shape: tuple[int, ...]) -> torch.Tensor:
    """A new (len(arrays), *shape) tensor holding ``arrays``, filled row by row."""
    try:
        dtype = torch.from_numpy(np.empty(0, dtype=arrays[0].dtype)).dtype
    except (TypeError, ValueError):  # a dtype torch has not (object, str, big-endian): from_numpy says so
        rows = np.empty((len(arrays), *shape), dtype=arrays[0].dtype)
        return torch.from_numpy(rows)
    batch = new_batch((len(arrays), *shape), dtype)
    rows = batch.numpy()
    for i, array in enumerate(arrays):
        rows[i] = array
    return batch


@functional_datapipe("batch_samples")
class Batcher(Pipe):
    """Yields batches of ``batch_size`` samples, collated (functional name: ``batch_samples``).

    Dict samples give a dict of batched fields, tuples a tuple; tensors, arrays and
    numbers of one shape stack into tensors, the rest stays as lists (see :func:`collate`).

    Args:
        source_datapipe: samples (dicts or tuples).
        batch_size: samples per batch.
        partial: yield the last, smaller batch (default) instead of dropping it.
        collate_fn: replaces :func:`collate` (called with the list of samples).

    Example:
        >>> samples.to_tuple("jpg", "cls").batch_samples(64)
    """

    def __init__(self, source_datapipe: IterDataPipe, batch_size: int, partial: bool = True,
                 collate_fn: Callable[[list], Any] | None = None):
        self.source_datapipe = source_datapipe
        self.batch_size = check_positive("batch_size", batch_size)
        self.partial = partial
        self.collate_fn = collate_fn
        self._stats = current_settings()  # stats on or off travel with the pipe

    _stats = None  # a pipe pickled before stats existed measures nothing

    def __iter__(self) -> Iterator[Any]:
        combine = self.collate_fn or collate
        probe = stats_probe(self._stats)
        if probe is not None:  # per batch: the wait for its samples, and their collation
            yield from probe.batches(chunks(self.source_datapipe, self.batch_size, self.partial), combine)
            return
        for batch in chunks(self.source_datapipe, self.batch_size, self.partial):
            yield combine(batch)
