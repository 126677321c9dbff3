"""Shared-memory batches that a loader's worker writes again once every other holder has let go.

A batch a worker sends to the main process lies in shared memory. Made fresh for every batch,
each of its pages is allocated, zeroed and mapped by the kernel, and freed again when the main
process drops the batch: on the 2-core development machine ~15 ms of kernel time a batch of
64 224x224 crops (9.6 MB), ~0.23 ms a sample, a tenth of decoding and cropping it. Here a
worker keeps a few buffers (files in /dev/shm, unlinked at once) and writes a batch into one
that no other process holds any more.

How a buffer is known to be free: the worker keeps one open file description of each buffer
(``own``), and maps the buffer once, through ``own`` itself (a dup of a descriptor is the same
description); its batches are views of that mapping. Whenever a tensor or storage of a buffer
is sent (every one passes :func:`_reduce_storage`, put before torch's reduction for
multiprocessing's pickler in this process), a second description is opened for that send and
its descriptor passes to the receiver, which maps it while it holds the batch. A process that
maps a file holds its description open until it unmaps it, whatever it did with the
descriptor. The kernel grants a write lease (``F_SETLEASE``) on ``own`` only while no other
description of the file is open anywhere: in the main process, or in any process the batch
was passed on to. So a buffer is written again only when no tensor of this worker views it
(its storage's use count) and the lease is granted (it is released at once). A child forked
from the worker maps the buffers through ``own`` too, unseen: at a fork every buffer retires
(never written again). Mapping each buffer once saves the kernel's populating and unmapping of
9.6 MB a batch (~3 ms here). Where leases are not available (no ``/dev/shm``, leases
disabled), or every buffer is held, a batch is made fresh, as before.

Small batch tensors (labels, per-sample numbers: up to ``INLINE_MAX_BYTES``) travel inside the
message instead: each tensor in shared memory passes the main process a descriptor of its own,
a connection to the worker's resource sharer (an authenticated socket handshake, and a wakeup of
its thread in the worker) that cost more than copying a few KB. A worker marks the small tensors
it makes (:func:`sent_inline`); the main process gets a tensor of the same values, dtype and
shape in its own memory, and a batch of images and labels passes one descriptor.
"""

from __future__ import annotations

import ctypes
import fcntl
import multiprocessing
import multiprocessing.reduction
import os
import secrets
import threading
import weakref

import numpy as np
import torch

MAX_BUFFERS = 8  # per worker process; the buffers live as long as the process
INLINE_MAX_BYTES = 64 * 1024  # a batch tensor up to this size is sent by value, without a descriptor
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14: map every page in one call instead of a fault per page

_lock = threading.Lock()
_buffers: list[_Buffer] = []
_disabled = False


class _Buffer:
    """One file in /dev/shm (unlinked): the worker's own description of it, and its size."""

    def __init__(self, nbytes: int):
        name = f"/dev/shm/wds-datapipes-{os.getpid()}-{secrets.token_hex(6)}"
        self.fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.unlink(name)
            os.posix_fallocate(self.fd, 0, nbytes)  # a full /dev/shm is an OSError here, not a SIGBUS later
        except BaseException:
            os.close(self.fd)
            raise
        self.nbytes = nbytes
        self.kept: torch.UntypedStorage | None = None  # this worker's lasting mapping, through ``fd`` itself
        self.retired = False  # a child was forked while it was mapped: never written again

    def free(self) -> bool:
        """True where no tensor of this process views it and no other open description of the file
        exists (a write lease is granted)."""
        if self.retired or self.viewed():
            return False
        try:
            fcntl.fcntl(self.fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
        except BlockingIOError:  # EAGAIN: another description is open somewhere
            return False
        fcntl.fcntl(self.fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        return True

    def viewed(self) -> bool:
        """True while a tensor of this process views the buffer (one being sent included)."""
        return self.kept is not None and torch._C._storage_Use_Count(self.kept._cdata) > 1

    def storage(self) -> torch.UntypedStorage:
        """The buffer's storage in this process, mapped once (through ``fd``: a dup of it is the
        same description, which no lease sees); :func:`_reduce_storage` sends it through a new
        description each time."""
        if self.kept is None:
            self.kept = torch.UntypedStorage._new_shared_fd_cpu(self.fd, self.nbytes)  # torch dups fd and maps it
            _populate(self.kept.data_ptr(), self.nbytes)
            _kept[self.kept._cdata] = self
        return self.kept

    def close(self) -> None:
        if self.kept is not None:
            _kept.pop(self.kept._cdata, None)
            self.kept = None  # tensors still viewing it keep the mapping; it is never written again
        os.close(self.fd)


def reused_storage(nbytes: int) -> torch.UntypedStorage | None:
    """A shared-memory storage of ``nbytes`` in a buffer no other process holds, or None (make
    one fresh) where every buffer is held or reuse is not available here."""
    global _disabled
    if _disabled or not hasattr(torch.UntypedStorage, "_new_shared_fd_cpu") or not _install_reducer():
        return None  # without the reducer, torch would send the worker's own description
    with _lock:
        try:
            buffer = _free_buffer(nbytes)
            return None if buffer is None else buffer.storage()
        except OSError:  # no /dev/shm, no /proc, leases disabled (EINVAL), a full /dev/shm: as before
            _disabled = True
            return None


def _free_buffer(nbytes: int) -> _Buffer | None:
    for buffer in [b for b in _buffers if b.retired and not b.viewed()]:
        _buffers.remove(buffer)
        buffer.close()
    for buffer in _buffers:
        if buffer.nbytes == nbytes and buffer.free():
            return buffer
    if len(_buffers) >= MAX_BUFFERS:  # make room: a free buffer of another size goes
        spare = next((b for b in _buffers if b.nbytes != nbytes and b.free()), None)
        if spare is None:
            return None
        _buffers.remove(spare)
        spare.close()
    buffer = _Buffer(nbytes)
    if not buffer.free():  # a file system where a lone description gets no lease: leases cannot tell here
        buffer.close()
        raise OSError("write leases are not granted on /dev/shm")
    _buffers.append(buffer)
    return buffer


def sent_inline(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` (a small batch tensor this process made), marked to reach the process it is
    sent to by value, inside the message, where it is sent from a child process (a loader's
    worker); returns it. Without a mark, or once it no longer qualifies (grown, shared, needing
    grad), torch sends it as before."""
    if multiprocessing.parent_process() is None or not _inlinable(tensor) or not _install_reducer():
        return tensor
    return _mark_inline(tensor)


def _mark_inline(tensor: torch.Tensor) -> torch.Tensor:
    key = id(tensor)

    def forget(ref: weakref.ref, key: int = key) -> None:
        if _inline.get(key) is ref:
            del _inline[key]

    _inline[key] = weakref.ref(tensor, forget)
    return tensor


_inline: dict[int, weakref.ref] = {}  # id -> the marked tensor (ids, not a WeakSet: a tensor's == is elementwise)
_torch_reduce_tensor = None
_torch_reduce_storage = None
_kept: dict[int, _Buffer] = {}  # a buffer's lasting storage (its StorageImpl's address) -> the buffer
# The dtypes whose bytes numpy copies (through a uint8 view).
_INLINE_DTYPES = frozenset({
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
    torch.float32, torch.float64, torch.complex64, torch.complex128,
})


def _inlinable(tensor: torch.Tensor) -> bool:
    return (type(tensor) is torch.Tensor and tensor.layout == torch.strided and tensor.device.type == "cpu"
            and tensor.dtype in _INLINE_DTYPES and 0 < tensor.nbytes <= INLINE_MAX_BYTES
            and not tensor.requires_grad and tensor.is_contiguous() and not tensor.is_conj()
            and not tensor.is_neg() and not tensor.is_shared() and not any(getattr(tensor, "names", ())))  # named tensors: torch's way


def _install_reducer() -> bool:
    """Puts :func:`_reduce_tensor` before torch's reduction of tensors for multiprocessing's
    pickler in this process (once); False where torch has none registered."""
    global _torch_reduce_tensor, _torch_reduce_storage
    if _torch_reduce_tensor is None:
        from multiprocessing.reduction import ForkingPickler

        tensors = ForkingPickler._extra_reducers.get(torch.Tensor)
        storages = ForkingPickler._extra_reducers.get(torch.UntypedStorage)
        if tensors is None or storages is None:
            return False
        _torch_reduce_tensor, _torch_reduce_storage = tensors, storages
        ForkingPickler.register(torch.Tensor, _reduce_tensor)
        ForkingPickler.register(torch.UntypedStorage, _reduce_storage)
    return True


def _reduce_storage(storage: torch.UntypedStorage):
    """A buffer's storage through a new description of the file, opened for this send (every
    tensor and storage sent passes here: torch reduces a tensor to its storage); any other as
    torch sends it."""
    with _lock:  # a buffer is not closed meanwhile (its descriptor's number taken by another file)
        buffer = _kept.get(storage._cdata)
        fd = None if buffer is None else os.open(f"/proc/self/fd/{buffer.fd}", os.O_RDWR | os.O_CLOEXEC)
    if buffer is None:
        return _torch_reduce_storage(storage)
    try:
        handle = multiprocessing.reduction.DupFd(fd)  # a dup, held until the receiver has it
    finally:
        os.close(fd)
    return _rebuild_storage, (handle, buffer.nbytes)


def _rebuild_storage(handle, nbytes: int) -> torch.UntypedStorage:
    """The receiving side of :func:`_reduce_storage`: the buffer mapped through that description."""
    fd = handle.detach()
    try:
        return torch.UntypedStorage._new_shared_fd_cpu(fd, nbytes)
    finally:
        os.close(fd)


def _reduce_tensor(tensor: torch.Tensor):
    """A marked tensor as its bytes; any other as torch reduces it (into shared memory)."""
    ref = _inline.get(id(tensor))
    if ref is not None and ref() is tensor and _inlinable(tensor):
        data = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
        return _rebuild_inline, (data, tensor.dtype, tuple(tensor.shape))
    return _torch_reduce_tensor(tensor)


def _rebuild_inline(data: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """The receiving side of :func:`_reduce_tensor`: a new tensor holding ``data``."""
    tensor = torch.empty(shape, dtype=dtype)
    tensor.reshape(-1).view(torch.uint8).numpy()[:] = np.frombuffer(data, dtype=np.uint8)
    return tensor


def _populate(address: int, nbytes: int) -> None:
    """Maps the pages of a new mapping of a buffer in one call (best effort: faults otherwise)."""
    if _madvise is None:
        return
    start = (address + _PAGE - 1) // _PAGE * _PAGE
    end = (address + nbytes) // _PAGE * _PAGE
    if end > start:
        _madvise(start, end - start, _MADV_POPULATE_WRITE)  # EINVAL before Linux 5.14: ignored


def _forget_buffers() -> None:
    """In a process forked from one with buffers: they are its parent's; close them, keep none."""
    global _lock
    _lock = threading.Lock()
    for buffer in _buffers:
        try:
            buffer.close()
        except OSError:
            pass
    _buffers.clear()
    _kept.clear()


def _retire_buffers() -> None:
    """Before a fork: the child maps every buffer as this process does, unseen by leases; none
    is written again (each is closed at the next batch; tensors viewing one keep it)."""
    for buffer in _buffers:
        buffer.retired = True


def _libc_madvise():
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_madvise = _libc_madvise()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_retire_buffers, after_in_child=_forget_buffers)
