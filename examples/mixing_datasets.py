"""Mixing datasets by weight: three WebDataset sources in one exact, resumable epoch.

    python examples/mixing_datasets.py [--data DIR] [--workers 2]

1. Writes three small datasets of uneven shards ("web": many samples, "books": fewer,
   "curated": one small shard) with webdataset's ShardWriter, and indexes each
   (``python -m wds_datapipes index`` does the same from the command line).
2. Mixes them 50/30/20 into epochs of 600 samples, every batch of 20 holding each
   source's share within one sample (``batching="stratified"``): "curated" is smaller
   than its share, so it repeats, each pass in a new order.
3. Reads two epochs under a StatefulDataLoader with 2 workers and prints what each epoch
   held per source; then stops mid-epoch, saves the loader's state, and resumes it in a
   new loader, which gives exactly the batches the uninterrupted run gave.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import warnings
from collections import Counter

import numpy as np
import webdataset as wds
from PIL import Image
from torchdata.stateful_dataloader import StatefulDataLoader

import wds_datapipes as wd

SOURCES = {"web": (7, 60), "books": (3, 50), "curated": (1, 40)}  # name: (shards, samples per shard, about)
WEIGHTS = {"web": 0.5, "books": 0.3, "curated": 0.2}
BATCH = 20


def write_source(folder: str, name: str, shards: int, per_shard: int, rng: np.random.Generator) -> str:
    """A dataset of PNGs with a class, in shards of uneven sizes; returns its index's path."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for shard in range(shards):
        path = os.path.join(folder, f"{name}-{shard:04d}.tar")
        with wds.TarWriter(path) as sink:
            for i in range(per_shard + int(rng.integers(-per_shard // 3, per_shard // 3 + 1))):
                png = io.BytesIO()
                Image.fromarray(rng.integers(0, 255, (16, 16), dtype=np.uint8)).save(png, format="PNG")
                sink.write({"__key__": f"{name}-{shard:04d}-{i:05d}", "png": png.getvalue(), "cls": i % 10})
        paths.append(path)
    index = os.path.join(folder, "index.json")
    wd.ShardIndex.from_scans(wd.build_index(paths), relative_to=index).save(index)
    return index


def mixture(indexes: dict[str, str]):
    source = wd.MixedEpochs(indexes, weights=WEIGHTS, samples_per_epoch=600, batch_size=BATCH,
                            batching="stratified", seed=0)
    return source, source.decode("l8").to_tuple("png", "cls", "__source__", "__key__").batch_samples(BATCH)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="data/mixing")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")  # torchdata 0.8 on torch 2.13, not ours
    rng = np.random.default_rng(0)
    indexes = {name: write_source(os.path.join(args.data, name), name, shards, per, rng)
               for name, (shards, per) in SOURCES.items()}

    source, dp = mixture(indexes)
    print(f"{source.batches_per_epoch} batches of {BATCH} per epoch; "
          f"sizes: {({n: wd.ShardIndex.load(i).total for n, i in indexes.items()})}")
    loader = StatefulDataLoader(dp, batch_size=None, num_workers=args.workers, persistent_workers=True)
    whole = []
    for epoch in range(2):
        batches = [(list(keys), Counter(sources), tuple(images.shape)) for images, labels, sources, keys in loader]
        held = sum((c for _, c, _ in batches), Counter())
        print(f"epoch {epoch}: {dict(held)}; the first batch {dict(batches[0][1])}, images {batches[0][2]}")
        assert all(abs(c[n] - BATCH * w) < 1 for _, c, _ in batches for n, w in WEIGHTS.items())
        whole.append([keys for keys, _, _ in batches])

    stopped = StatefulDataLoader(mixture(indexes)[1], batch_size=None, num_workers=args.workers,
                                 persistent_workers=True)
    for step, _ in enumerate(stopped, 1):
        if step == 11:
            checkpoint = json.dumps(stopped.state_dict())  # what a training loop saves beside its model
            break
    resumed = StatefulDataLoader(mixture(indexes)[1], batch_size=None, num_workers=args.workers,
                                 persistent_workers=True)
    resumed.load_state_dict(json.loads(checkpoint))
    rest = [list(keys) for *_, keys in resumed]
    following = [list(keys) for *_, keys in resumed]
    assert rest == whole[0][11:] and following == whole[1], "the resumed run differs"
    print(f"resumed: the same batches as the uninterrupted run ({len(rest)} left in epoch 0, then epoch 1)")


if __name__ == "__main__":
    main()
