"""Section 3b of bench_pipeline.py: every front door of ours beside webdataset, wids and LitData on 2 cores.

On the same photo-like JPEGs, each path decodes, resizes the short side to 256 and cuts the
central 224x224 (uint8), in batches of 64, with 2 workers (or 2 threads), each epoch timed
from building its loader (its workers start). The peers decode and crop with the ceiling's
own decoder and torchvision transform, sample by sample, as their users write it. The rows
are timed in turn, ``rounds`` times, the order reversed every other round (a slow spell of a
shared machine falls on all of them); each row prints the median rate by the wall clock and
the median CPU seconds per 1,000 samples of the whole path (this process and its reaped
workers: much steadier than the wall clock on a loaded machine), and its ratio to the
ceiling, the bare loop in 2 threads (the median of each round's pair).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch.utils.data import DataLoader

import wds_datapipes as wd
from benchmarks.harness import Timings, time_in_turn
from benchmarks.vision_loops import (
    BATCH,
    EVAL,
    DataLoader2,
    bare_vision,
    counted,
    ours_vision,
    through_dataloader2,
    torchvision_transform,
)
from wds_datapipes.decoding.vision import tensor_decoders

try:
    import wids
except ImportError:  # make bench installs it with webdataset
    wids = None
try:
    from torchdata.stateful_dataloader import StatefulDataLoader
except ImportError:  # torchdata < 0.8
    StatefulDataLoader = None


CEILING = "bare loop in 2 threads (the ceiling)"


class DecodeAndCrop:
    """The ceiling's per-sample work for the peers: the crops' decoder + torchvision's transform;
    takes a sample dict of any peer (``jpg`` or ``.jpg``; bytes, memoryview or a file object)."""

    def __init__(self, transform: Callable[[torch.Tensor], torch.Tensor]):
        self.transform = transform

    def __call__(self, sample: dict) -> tuple[torch.Tensor, int]:
        jpg, cls = (_field(sample, name) for name in ("jpg", "cls"))
        image = tensor_decoders()["JPEG"](torch.frombuffer(bytearray(jpg), dtype=torch.uint8))
        return self.transform(image), int(bytes(cls))


def _field(sample: dict, name: str):
    value = sample[name] if name in sample else sample["." + name]
    return value.getvalue() if hasattr(value, "getvalue") else value


def generic_recipe(files: list[str], transform, batch: int):
    """The README's quick start with a torchvision transform per sample: decode, map_fields, batch."""
    return (wd.ShardLister(files).load_tar().group_by_key().decode("torchrgb8")
            .map_fields(jpg=transform).to_tuple("jpg", "cls").batch_samples(batch))


def _webdataset(files: list[str], crop: DecodeAndCrop, batch: int):
    import webdataset as wds

    return wds.WebDataset(files, shardshuffle=False).map(crop).batched(batch)


def _wids(files: list[str], sizes: list[int], crop: DecodeAndCrop):
    shards = [{"url": path, "nsamples": n} for path, n in zip(files, sizes)]
    return wids.ShardListDataset(shards, transformations=[crop], localname=lambda url: url)


def _litdata_dataset(folder: str, crop: DecodeAndCrop):
    import litdata

    class Cropped(litdata.StreamingDataset):
        def __getitem__(self, index):
            return crop(super().__getitem__(index))

    return Cropped(folder)


def front_doors(photos: list[str], jpgs: list[bytes], sizes: list[int],
                litdata_folder: str | None) -> dict[str, Callable[[], Iterable]]:
    """Each path's maker, the ceiling first: a fresh loader each call."""
    batch, eval_transform, torchvision_eval = BATCH, EVAL, torchvision_transform(EVAL)
    crop = DecodeAndCrop(torchvision_eval)
    rows: dict[str, Callable[[], Iterable]] = {
        CEILING: bare_vision(jpgs, eval_transform, 2),
        "ours, one process, decode_batches(num_threads=2) (README, 2 cores)":
            lambda: ours_vision(photos, eval_transform, 2),
        "ours, DataLoader(2 workers), decode_batches (README vision)":
            lambda: DataLoader(ours_vision(photos, eval_transform, 0), batch_size=None, num_workers=2),
        "ours, DataLoader(2 workers), decode('torchrgb8').map_fields(...) (generic)":
            lambda: DataLoader(generic_recipe(photos, torchvision_eval, batch), batch_size=None, num_workers=2),
    }
    if DataLoader2 is not None:
        rows["ours, DataLoader2 + MultiProcessingReadingService(2), decode_batches"] = (
            lambda: through_dataloader2(ours_vision(photos, eval_transform, 0), 2))
    if StatefulDataLoader is not None:
        rows["ours, StatefulDataLoader(2 workers), decode_batches"] = (
            lambda: StatefulDataLoader(ours_vision(photos, eval_transform, 0), batch_size=None, num_workers=2))
    rows["webdataset, WebDataset().map(decode + crop).batched(64), DataLoader(2 workers)"] = (
        lambda: DataLoader(_webdataset(photos, crop, batch), batch_size=None, num_workers=2))
    if wids is not None:
        rows["wids, ShardListDataset + decode + crop, DataLoader(2 workers, batch_size=64)"] = (
            lambda: DataLoader(_wids(photos, sizes, crop), batch_size=batch, num_workers=2))
    if litdata_folder is not None:
        import litdata

        rows["litdata, StreamingDataset + decode + crop, StreamingDataLoader(2 workers)"] = (
            lambda: litdata.StreamingDataLoader(_litdata_dataset(litdata_folder, crop), batch_size=batch,
                                                num_workers=2))
    return rows


def time_doors(rows: dict[str, Callable[[], Iterable]], expect: int, rounds: int) -> Timings:
    """Every door in turn ``rounds`` times, each epoch from building its loader; prints the
    table (medians; ratios to the ceiling paired by round) as it is done."""
    timings = time_in_turn({name: counted(make) for name, make in rows.items()}, rounds, expect=expect)
    print(f"  {'':<86} {'samples/s':>10} {'/ceiling':>9} {'CPU s/1k':>9} {'ceiling/it':>10}")
    for name in rows:
        print(f"  {name:<86} {timings.rate(name):>10,.0f} {timings.ratio(name, CEILING).value:>9.0%} "
              f"{timings.cpu_per(name):>9.2f} {timings.ratio(name, CEILING, of='cpu').value:>10.0%}")
    return timings
