"""A loader worker's shared-memory batches: written again only once no other process holds them."""

from __future__ import annotations

import io
import multiprocessing
import pickle
import sys
from multiprocessing import resource_sharer

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data.datapipes.iter import IterableWrapper

import wds_datapipes  # noqa: F401  (registers .decode_batches, .batch_samples)
from wds_datapipes.pipes import shared_batches
from wds_datapipes.pipes.batching import collate, new_batch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="leases on /dev/shm: Linux")

SHAPE = (8, 3, 64, 64)


class Filled(IterableDataset):
    """Batches from new_batch, each filled with its number; with the worker's count of buffers."""

    def __init__(self, count: int, kept_in_worker: int = 0):
        self.count, self.kept_in_worker = count, kept_in_worker

    def __iter__(self):
        kept = []
        for i in range(self.count):
            batch = new_batch(SHAPE)
            batch.fill_(i % 251)
            if self.kept_in_worker:
                kept = [*kept, batch][-self.kept_in_worker:]  # the worker holds these too
                assert all(int(b.min()) == int(b.max()) == n % 251 for n, b in zip(range(i - len(kept) + 1, i + 1), kept))
            yield batch, len(shared_batches._buffers)


def _drain(dataset: IterableDataset, held: int) -> tuple[list[int], int]:
    """Reads the batches in a 1-worker DataLoader, holding the last ``held`` and checking them all
    against their numbers at every step; returns the numbers held at the end and the buffer count."""
    loader = DataLoader(dataset, batch_size=None, num_workers=1, timeout=60,
                        multiprocessing_context=multiprocessing.get_context("fork"))
    kept: list[tuple[int, torch.Tensor]] = []
    buffers = 0
    for i, (batch, buffers) in enumerate(loader):
        kept = [*kept, (i, batch)][-held:]
        for n, b in kept:  # oracle: each batch still holds the number it was filled with
            assert int(b.min()) == int(b.max()) == n % 251, f"batch {n} was written over while held"
    return [n for n, _ in kept], buffers


@pytest.mark.timeout(120)
def test_batches_the_main_process_holds_are_never_written_again_and_the_others_are_reused():
    numbers, buffers = _drain(Filled(60), held=4)
    assert numbers == [56, 57, 58, 59]
    assert 4 < buffers <= shared_batches.MAX_BUFFERS  # 60 batches in a handful of buffers


@pytest.mark.timeout(120)
def test_batches_the_worker_itself_still_holds_are_not_reused():
    numbers, buffers = _drain(Filled(40, kept_in_worker=3), held=2)
    assert numbers == [38, 39] and buffers <= shared_batches.MAX_BUFFERS


@pytest.mark.timeout(120)
def test_when_every_buffer_is_held_batches_are_made_fresh_and_stay_intact():
    numbers, buffers = _drain(Filled(30), held=shared_batches.MAX_BUFFERS + 6)
    assert numbers == list(range(30 - shared_batches.MAX_BUFFERS - 6, 30))
    assert buffers == shared_batches.MAX_BUFFERS


def test_in_the_main_process_batches_are_private_memory():
    assert not new_batch(SHAPE).is_shared() and shared_batches._buffers == []


# ------------------------------------------------------------ small tensors travel by value


def _jpeg(seed: int, side: int = 100) -> bytes:
    out = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(out, format="JPEG", quality=85)
    return out.getvalue()


def _photo_pipes() -> dict[str, object]:
    """decode_batches and the generic decode().batch_samples(): batches of 4 100x100 images
    (120 KB, over INLINE_MAX_BYTES) and their labels (4 int64)."""
    samples = [{"__key__": f"k{i}", "__url__": "mem.tar", "jpg": _jpeg(i), "cls": str(i % 7).encode()}
               for i in range(10)]
    return {"decode_batches": IterableWrapper(samples).decode_batches("torchrgb8", batch_size=4).to_tuple("jpg", "cls"),
            "generic": IterableWrapper(samples).decode("torchrgb8").to_tuple("jpg", "cls").batch_samples(4)}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["decode_batches", "generic"])
def test_a_batch_of_images_and_labels_passes_the_main_process_one_descriptor(monkeypatch, name):
    """Every tensor in shared memory passes its own descriptor (a connection to the worker's
    resource sharer); the labels travel inside the message. Oracle for the values: the same
    pipe read in this process (no worker); the descriptors counted where the main process
    fetches each (multiprocessing's DupFd.detach)."""
    passed = []
    detach = resource_sharer.DupFd.detach

    def counted(handle):
        passed.append(handle)
        return detach(handle)

    pipe = _photo_pipes()[name]
    expected = list(pipe)
    loader = DataLoader(pipe, batch_size=None, num_workers=1, timeout=60,
                        multiprocessing_context=multiprocessing.get_context("fork"))
    monkeypatch.setattr(resource_sharer.DupFd, "detach", counted)
    batches = iter(loader)
    got = list(batches)
    assert len(got) == len(expected) == 3
    for (images, labels), (images0, labels0) in zip(got, expected):
        assert images.dtype == images0.dtype == torch.uint8 and images.shape == images0.shape
        assert torch.equal(images, images0) and images.is_shared()
        assert labels.dtype == labels0.dtype == torch.int64 and labels.shape == labels0.shape
        assert labels.tolist() == labels0.tolist() and labels.is_contiguous()
    assert len(passed) == len(got)  # one descriptor a batch: the images'


_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
           torch.bfloat16, torch.float32, torch.float64, torch.complex64]


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(_DTYPES), shape=st.lists(st.integers(1, 5), min_size=0, max_size=3),
       seed=st.integers(0, 2**32 - 1))
def test_a_tensor_sent_by_value_arrives_with_its_values_dtype_and_shape(dtype, shape, seed):
    """Oracle: the values the tensor was made from (``tolist()``), its dtype and shape."""
    values = torch.from_numpy(np.random.default_rng(seed).integers(-100, 100, shape)).to(dtype)
    sent = values.clone()
    shared_batches._mark_inline(sent)
    rebuild, args = shared_batches._reduce_tensor(sent)
    got = pickle.loads(pickle.dumps(rebuild))(*pickle.loads(pickle.dumps(args)))
    assert got.dtype == dtype and got.shape == values.shape and got.is_contiguous()
    assert got.tolist() == values.tolist()
    assert got.untyped_storage().data_ptr() != sent.untyped_storage().data_ptr()


def test_a_marked_tensor_that_no_longer_qualifies_is_sent_as_torch_sends_it(monkeypatch):
    """Shared on purpose, or needing grad: torch's own reduction (oracle: the function it returns)."""
    monkeypatch.setattr(shared_batches, "_torch_reduce_tensor", lambda tensor: ("torch's", tensor))
    shared, grad = torch.zeros(4), torch.zeros(4)
    for tensor in (shared, grad):
        shared_batches._mark_inline(tensor)
    shared.share_memory_()
    grad.requires_grad_()
    assert shared_batches._reduce_tensor(shared)[0] == "torch's" and shared_batches._reduce_tensor(grad)[0] == "torch's"
    assert shared_batches._reduce_tensor(torch.zeros(4))[0] == "torch's"  # never marked


def test_in_the_main_process_nothing_is_marked_and_torch_reduction_stays():
    from multiprocessing.reduction import ForkingPickler

    labels = collate([1, 2, 3])
    assert id(labels) not in shared_batches._inline
    assert ForkingPickler._extra_reducers[torch.Tensor] is not shared_batches._reduce_tensor


# ------------------------------------------------------------ a buffer mapped once in its worker


class Mappings(IterableDataset):
    """Batches from new_batch, each filled with its number (or a view of it: ``view``); last, the
    count of mappings the worker made and whether a buffer in use when it forked was written again."""

    def __init__(self, count: int, view: bool = False, fork_at: int | None = None):
        self.count, self.view, self.fork_at = count, view, fork_at

    def __iter__(self):
        import os

        mapped = []
        new_shared_fd = torch.UntypedStorage._new_shared_fd_cpu

        def counted(*args):
            mapped.append(args)
            return new_shared_fd(*args)

        torch.UntypedStorage._new_shared_fd_cpu = counted
        before_fork: list = []
        try:
            for i in range(self.count):
                if i == self.fork_at:
                    before_fork = list(shared_batches._buffers)
                    pid = os.fork()
                    if pid == 0:
                        os._exit(0)
                    os.waitpid(pid, 0)
                batch = new_batch(SHAPE)
                batch.fill_(i % 251)
                yield (batch[1:] if self.view else batch), i
        finally:
            torch.UntypedStorage._new_shared_fd_cpu = new_shared_fd
        yield len(mapped), len(shared_batches._buffers), any(b in shared_batches._buffers for b in before_fork)


def _held_intact(dataset: IterableDataset, held: int):
    loader = DataLoader(dataset, batch_size=None, num_workers=1, timeout=60,
                        multiprocessing_context=multiprocessing.get_context("fork"))
    kept: list = []
    for item in loader:
        if isinstance(item[0], torch.Tensor):
            kept = [*kept, item][-held:]
            for b, n in kept:  # oracle: each batch still holds the number it was filled with
                assert int(b.min()) == int(b.max()) == int(n) % 251, f"batch {int(n)} was written over while held"
        else:
            return item


@pytest.mark.timeout(120)
@pytest.mark.parametrize("view", [False, True])
def test_a_worker_maps_each_buffer_once_and_what_it_sends_of_one_is_never_written_while_held(view):
    """A view of a batch goes out as the batch does: through a new description of the file."""
    mapped, buffers, _ = _held_intact(Mappings(60, view=view), held=2)
    assert mapped == buffers < shared_batches.MAX_BUFFERS  # 60 batches, reused; before, a new mapping each


@pytest.mark.timeout(120)
def test_buffers_in_use_when_a_worker_forks_are_not_written_again():
    """A child forked from a worker maps its buffers as the worker does, which no lease sees."""
    _, _, reused = _held_intact(Mappings(30, fork_at=10), held=2)
    assert not reused
