"""The vision loops that bench_pipeline's sections 2-4, bench_nodes and the probes time: the
bare loop (the ceiling), ours, webdataset's usual recipe, and the loaders with workers kept
across epochs; ``counted`` makes any of them a path for the harness (a run returns the
samples it yielded).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.utils.data import DataLoader

warnings.filterwarnings("ignore", message=r"(?s).*'datapipes', 'dataloader2' modules are deprecated")

import webdataset as wds
from torchvision.transforms import v2 as T

import wds_datapipes as wd
from wds_datapipes.decoding.vision import CenterCrop, RandomResizedCrop, tensor_decoders

try:
    from torchdata.dataloader2 import DataLoader2
except ImportError:  # torchdata >= 0.10
    DataLoader2 = None

BATCH = 64
EVAL = CenterCrop(224, 256)
TRAIN = RandomResizedCrop(224, seed=0)


def count_samples(items: Iterable) -> int:
    """Samples in an iterable of samples, of (images, labels) batches, or of dict batches."""
    n = 0
    for item in items:
        if isinstance(item, dict):
            labels = item.get("cls")
            # A batch's labels count its samples; a raw sample's label is bytes (LitData: a memoryview).
            n += len(labels) if hasattr(labels, "__len__") and not isinstance(labels, (bytes, str, memoryview)) else 1
        elif isinstance(item, (tuple, list)):
            n += len(item[1])
        else:
            n += 1
    return n


def counted(make: Callable[[], Iterable]) -> Callable[[], int]:
    """A harness path: makes a fresh iterable, reads it whole, returns its samples."""
    return lambda: count_samples(make())


def torchvision_transform(transform) -> Callable[[torch.Tensor], torch.Tensor]:
    """torchvision's own transform for ours (for the bare loop; draws from torch's RNG)."""
    if isinstance(transform, CenterCrop):
        return T.Compose([T.Resize(transform.resize, antialias=True), T.CenterCrop(transform.size)])
    return T.Compose([T.RandomResizedCrop(transform.size, antialias=True), T.RandomHorizontalFlip()])


def bare_vision(jpgs: list[bytes], transform, threads: int) -> Callable[[], Iterable]:
    """decode_jpeg + the transform over bytes in memory, in ``threads`` threads, into batches.
    The decoder is the one our crops use: torchvision's, or TorchCodec's where torchvision
    deprecates its own (the same pixels at the same speed: docs/media.md)."""
    tf = torchvision_transform(transform)
    decode_jpeg = tensor_decoders()["JPEG"]

    def one(jpg: bytes) -> torch.Tensor:
        return tf(decode_jpeg(torch.frombuffer(bytearray(jpg), dtype=torch.uint8)))

    def run():
        if threads == 1:
            images = (one(j) for j in jpgs)
        else:
            pool = ThreadPoolExecutor(threads)
            images = pool.map(one, jpgs, chunksize=8)
        batch = []
        for image in images:
            batch.append(image)
            if len(batch) == BATCH:
                yield torch.stack(batch), torch.zeros(BATCH)
                batch = []
        if batch:
            yield torch.stack(batch), torch.zeros(len(batch))
        if threads > 1:
            pool.shutdown()

    return run


def ours_vision(files: list[str], transform, threads: int):
    return (wd.ShardLister(files).load_tar().group_by_key()
            .decode_batches("torchrgb8", batch_size=BATCH, num_threads=threads, transform=transform)
            .to_tuple("jpg", "cls"))


def _pil_to_tensor_eval():
    return T.Compose([T.Resize(256, antialias=True), T.CenterCrop(224), T.PILToTensor()])


def _pil_to_tensor_train():
    return T.Compose([T.RandomResizedCrop(224, antialias=True), T.RandomHorizontalFlip(), T.PILToTensor()])


def webdataset_vision(files: list[str], train: bool):
    tf = _pil_to_tensor_train() if train else _pil_to_tensor_eval()
    return (wds.WebDataset(files, shardshuffle=False).decode("pil").to_tuple("jpg", "cls")
            .map_tuple(tf, int).batched(BATCH))


def through_dataloader2(dp, workers: int):
    loader = DataLoader2(dp, reading_service=wd.MultiProcessingReadingService(num_workers=workers))
    try:
        yield from loader
    finally:
        loader.shutdown()


@contextlib.contextmanager
def started_loaders(photos: list[str]):
    """The loaders of section 3 with workers that last across epochs (DataLoader with
    ``persistent_workers=True``; DataLoader2 keeps its workers), each past its first epoch:
    what every epoch after the first costs."""
    loaders = {"DataLoader(num_workers=2)": DataLoader(ours_vision(photos, EVAL, 0), batch_size=None,
                                                       num_workers=2, persistent_workers=True)}
    if DataLoader2 is not None:
        loaders["DataLoader2 + MultiProcessingReadingService(2)"] = DataLoader2(
            ours_vision(photos, EVAL, 0), reading_service=wd.MultiProcessingReadingService(num_workers=2))
    try:
        for loader in loaders.values():
            count_samples(loader)
        yield loaders
    finally:
        for loader in loaders.values():
            if not isinstance(loader, DataLoader):
                loader.shutdown()
        loaders.clear()  # a DataLoader's kept workers stop when it is freed


def first_batch_seconds(make: Callable[[], Iterable]) -> float:
    start = time.perf_counter()
    iterator = iter(make())
    next(iterator)
    elapsed = time.perf_counter() - start
    for _ in iterator:  # let the loader finish and shut down as it would
        pass
    return elapsed
