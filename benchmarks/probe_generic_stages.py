"""Where a DataLoader worker's CPU goes in the generic recipe, stage by stage, beside decode_batches.

Three pipes on the same photos, each under ``DataLoader(num_workers=2)``, timed in turn
``--rounds`` times, the order reversed every other round (a slow spell of a shared machine
falls on all of them):

- ``decode_batches``: section 3b's README recipe (decode, resize, crop and copy into the
  batch in one stage, torchvision's functional ``resize`` on the decoded view);
- ``generic, v2 Compose``: section 3b's generic recipe, ``decode("torchrgb8")`` then
  ``map_fields(jpg=Compose([Resize(256), CenterCrop(224)]))`` then ``to_tuple`` and
  ``batch_samples(64)``;
- ``generic, functional``: the same pipes, the transform written as the two functional
  calls the Compose makes (``resize`` on the tensor, then the central slice).

In each worker every stage is wrapped in a plain iterator that adds up the thread CPU
(``time.thread_time``) spent inside its source's ``next()``; a stage's own time is that
minus its source's. Printed per sample (ms, medians of the rounds): each stage's own time in
the workers, the workers' user and kernel time and minor page faults (``getrusage``), and
the whole path's CPU (this process and its reaped workers, as section 3b counts it).

Usage: ``python -m benchmarks.probe_generic_stages [--rounds 5] [--photos 2000] [--quick]``
(``--quick``: 64 photos, one round).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import tempfile
import time

import torch
from torch.utils.data import DataLoader, IterDataPipe

import wds_datapipes as wd
from benchmarks.harness import Bench, in_turn, median, own_and_reaped_cpu
from benchmarks.shards import make_photo_shards
from benchmarks.vision_loops import BATCH, EVAL, ours_vision, torchvision_transform
from wds_datapipes.decoding.batch_decoder import BatchDecoder
from wds_datapipes.decoding.decoder import Decoder
from wds_datapipes.pipes.batching import Batcher
from wds_datapipes.pipes.fields import FieldMapper, TupleMaker

STAGES = ("read", "decode", "map_fields", "to_tuple", "batch")


class Stage:
    """Yields its source's items; adds the thread CPU spent in the source's ``next()`` to ``spent[name]``."""

    def __init__(self, source, name: str, spent: dict[str, float]):
        self.source, self.name, self.spent = source, name, spent

    def __iter__(self):
        items, spent, name = iter(self.source), self.spent, self.name
        while True:
            start = time.thread_time()
            try:
                item = next(items)
            except StopIteration:
                return
            finally:
                spent[name] = spent.get(name, 0.0) + time.thread_time() - start
            yield item


def functional_eval(image: torch.Tensor) -> torch.Tensor:
    """``Compose([Resize(256, antialias=True), CenterCrop(224)])``'s work as two plain calls."""
    from torchvision.transforms.v2 import functional as tvf

    image = tvf.resize(image, [256], antialias=True)
    height, width = image.shape[-2:]
    top, left = round((height - 224) / 2.0), round((width - 224) / 2.0)  # torchvision's anchor
    return image[:, top : top + 224, left : left + 224]


def staged_pipe(variant: str, photos: list[str], spent: dict[str, float]):
    pipe = Stage(wd.ShardLister(photos).load_tar().group_by_key(), "read", spent)
    if variant == "decode_batches":
        pipe = Stage(BatchDecoder(pipe, "torchrgb8", batch_size=BATCH, num_threads=0, transform=EVAL),
                     "decode", spent)
        return Stage(TupleMaker(pipe, "jpg", "cls"), "to_tuple", spent)
    transform = torchvision_transform(EVAL) if variant == "generic, v2 Compose" else functional_eval
    pipe = Stage(Decoder(pipe, "torchrgb8"), "decode", spent)
    pipe = Stage(FieldMapper(pipe, jpg=transform), "map_fields", spent)
    pipe = Stage(TupleMaker(pipe, "jpg", "cls"), "to_tuple", spent)
    return Stage(Batcher(pipe, BATCH), "batch", spent)


class Measured(IterDataPipe):
    """Yields the staged pipe's batches; in each worker, writes its per-sample times to ``folder``."""

    def __init__(self, variant: str, photos: list[str], folder: str):
        self.variant, self.photos, self.folder = variant, photos, folder

    def __iter__(self):
        spent: dict[str, float] = {}
        n, before = 0, resource.getrusage(resource.RUSAGE_SELF)
        for batch in staged_pipe(self.variant, self.photos, spent):
            n += len(batch[1])
            yield batch
        after = resource.getrusage(resource.RUSAGE_SELF)
        inclusive = [spent[s] for s in STAGES if s in spent]
        own = {s: inclusive[i] - (inclusive[i - 1] if i else 0.0) for i, s in enumerate(s for s in STAGES if s in spent)}
        record = {s: 1000 * t / n for s, t in own.items()}
        record.update(user=1000 * (after.ru_utime - before.ru_utime) / n, sys=1000 * (after.ru_stime - before.ru_stime) / n,
                      faults=(after.ru_minflt - before.ru_minflt) / n)
        with open(os.path.join(self.folder, f"worker-{os.getpid()}.json"), "w") as f:
            json.dump(record, f)


def one_epoch(variant: str, photos: list[str], folder: str) -> dict[str, float]:
    """The workers' per-sample records (averaged over the two) and the whole path's CPU per sample."""
    for name in os.listdir(folder):
        os.remove(os.path.join(folder, name))
    cpu = own_and_reaped_cpu()
    n = sum(len(labels) for _, labels in DataLoader(Measured(variant, photos, folder), batch_size=None, num_workers=2))
    whole = 1000 * (own_and_reaped_cpu() - cpu) / n
    workers = []
    for name in os.listdir(folder):
        with open(os.path.join(folder, name)) as f:
            workers.append(json.load(f))
    return {**{k: statistics.mean(w[k] for w in workers) for k in workers[0]}, "whole path": whole}


def main(argv: list[str] | None = None) -> None:
    bench = Bench("probe_generic_stages", __doc__, rounds=5)
    bench.parser.add_argument("--photos", type=int, default=2000)
    args = bench.parse(argv)
    if args.quick:
        args.photos = min(args.photos, 64)
    torch.set_num_threads(1)
    photos = make_photo_shards(os.path.join(args.data, "photos"), args.photos)
    ours_vision(photos, EVAL, 0)  # a decoder built before the workers fork (Pillow's plugins), as in 3b
    variants = ("decode_batches", "generic, v2 Compose", "generic, functional")
    folder = tempfile.mkdtemp()
    rows: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    with bench.results(args):
        for round_, variant in in_turn(args.rounds, variants):
            rows[variant].append(one_epoch(variant, photos, folder))
            if variant == (variants[-1] if round_ % 2 == 0 else variants[0]):
                print(f"round {round_ + 1} done; load average {os.getloadavg()[0]:.1f}", flush=True)
        columns = [*STAGES, "user", "sys", "faults", "whole path"]
        print(f"\n  ms per sample, medians of {args.rounds} rounds; stages and user/sys/faults in a worker")
        print(f"  {'':<22}" + "".join(f"{c:>11}" for c in columns))
        for variant, records in rows.items():
            cells = [median(r[c] for r in records) if c in records[0] else None for c in columns]
            print(f"  {variant:<22}" + "".join(f"{'-':>11}" if c is None else f"{c:>11.3f}" for c in cells))


if __name__ == "__main__":
    main()
