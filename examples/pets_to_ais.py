"""The seed workflow, end to end: a Pets-like folder -> indexed shards in AIStore -> dSort -> training.

1. Draw a small dataset in the Oxford-IIIT Pets layout (``images/<breed>_<n>.jpg``,
   ``annotations/trimaps/<breed>_<n>.png``, ``annotations/list.txt`` with class, species
   and breed ids): each breed is a shape of its own colour on a noisy background.
2. ``python -m wds_datapipes create`` writes it straight into a bucket as tar shards with
   their index (``index.json``, offsets, member places) in one pass: each shard is built in
   a local spool, uploaded while the next is written, and the run resumes where it died.
3. dSort shuffles the samples across new shards on the cluster (each sample whole).
4. A tiny model trains a few steps from the shuffled shards with ``ExactEpochs`` (every
   sample exactly once per epoch, batches of equal size).

Run::

    python -m aisio.cluster start                  # a local cluster; prints AIS_ENDPOINT=...
    AIS_ENDPOINT=http://127.0.0.1:PORT python examples/pets_to_ais.py

Without ``AIS_ENDPOINT`` it uses the cluster of ``python -m aisio.cluster start`` when one
runs, else starts one for the run (building aisnode with Go first if it is missing).
"""

from __future__ import annotations

import argparse
import io
import os
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

import wds_datapipes as wd
from aisio import dsort_shuffle, get_client
from aisio.cluster import cluster_endpoint
from wds_datapipes.cli import main as wds_command
from wds_datapipes.epochs.index import ShardIndex, build_index

BREEDS = [("Abyssinian", 1, (200, 120, 40), "ellipse"), ("Bengal", 1, (60, 60, 200), "rectangle"),
          ("beagle", 2, (40, 170, 60), "triangle"), ("pug", 2, (190, 40, 160), "cross")]
SIZE = 32


def draw_pets(root: Path, per_breed: int, seed: int = 0) -> int:
    """Step 1: the Pets layout under ``root``, drawn with Pillow; returns the number of images."""
    rng = random.Random(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "annotations" / "trimaps").mkdir(parents=True, exist_ok=True)
    lines = ["#Image CLASS-ID SPECIES BREED ID", "#All images with 1st letter as captial are cat images"]
    for n in range(per_breed):
        for class_id, (breed, species, colour, shape) in enumerate(BREEDS, start=1):
            noise = np.random.default_rng(rng.randrange(1 << 30)).integers(0, 90, (SIZE, SIZE, 3), dtype=np.uint8)
            image = Image.fromarray(noise)
            trimap = Image.new("L", (SIZE, SIZE), 2)  # 1 pet, 2 background, 3 border
            x, y, r = rng.randrange(8, SIZE - 8), rng.randrange(8, SIZE - 8), rng.randrange(5, 8)
            box = [x - r, y - r, x + r, y + r]
            for canvas, fill in ((ImageDraw.Draw(image), colour), (ImageDraw.Draw(trimap), 1)):
                if shape == "ellipse":
                    canvas.ellipse(box, fill=fill)
                elif shape == "rectangle":
                    canvas.rectangle(box, fill=fill)
                elif shape == "triangle":
                    canvas.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=fill)
                else:
                    canvas.rectangle([x - r, y - 2, x + r, y + 2], fill=fill)
                    canvas.rectangle([x - 2, y - r, x + 2, y + r], fill=fill)
            key = f"{breed}_{n + 1}"
            image.save(root / "images" / f"{key}.jpg", quality=90)
            trimap.save(root / "annotations" / "trimaps" / f"{key}.png")
            lines.append(f"{key} {class_id} {species} {class_id}")
    (root / "annotations" / "list.txt").write_text("\n".join(lines) + "\n")
    return per_breed * len(BREEDS)


def to_example(sample: dict) -> tuple[torch.Tensor, int]:
    """A shard sample -> (the image as a flat float tensor in 0..1, class index from 0)."""
    pixels = np.asarray(Image.open(io.BytesIO(sample["jpg"])).convert("RGB"), dtype=np.float32) / 255
    return torch.from_numpy(pixels).flatten(), int(sample["cls"]) - 1


def train(index: ShardIndex, epochs: int, batch_size: int) -> list[float]:
    """Step 4: a linear classifier over the pixels, from ``ExactEpochs``; each epoch's mean loss."""
    torch.manual_seed(0)
    model = torch.nn.Linear(SIZE * SIZE * 3, len(BREEDS))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    epochs_pipe = wd.ExactEpochs(index, batch_size=batch_size, seed=0, rank=0, world_size=1)
    losses = []
    for epoch in range(epochs):
        epochs_pipe.set_epoch(epoch)
        batch, total, steps = [], 0.0, 0
        for sample in epochs_pipe:
            batch.append(to_example(sample))
            if len(batch) < batch_size:
                continue
            images, labels = torch.stack([b[0] for b in batch]), torch.tensor([b[1] for b in batch])
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, steps, batch = total + loss.item(), steps + 1, []
        losses.append(total / steps)
        print(f"  epoch {epoch}: {steps} steps of {batch_size}, mean loss {losses[-1]:.3f}")
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-breed", type=int, default=60, help="images per breed (4 breeds)")
    parser.add_argument("--maxcount", type=int, default=40, help="samples per shard written by create")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--bucket", default="pets", help="buckets <bucket>-raw and <bucket>-shuffled")
    args = parser.parse_args()
    raw, shuffled_bucket = f"{args.bucket}-raw", f"{args.bucket}-shuffled"

    with cluster_endpoint(), tempfile.TemporaryDirectory() as tmp:
        client = get_client()
        for name in (raw, shuffled_bucket):
            client.bucket(name).delete(missing_ok=True)
        client.bucket(raw).create(exist_ok=True)

        t = time.perf_counter()
        pets = Path(tmp) / "pets"
        count = draw_pets(pets, args.per_breed)
        print(f"1. drew {count} pets in {pets} in {time.perf_counter() - t:.1f} s")

        t = time.perf_counter()
        wds_command(["create", str(pets), "-o", f"ais://{raw}/pets-%06d.tar", "--extensions", "jpg,png",
                     "--fields", str(pets / "annotations" / "list.txt"), "--field-names", "cls,species,breed",
                     "--require", "jpg,png,cls", "--maxcount", str(args.maxcount), "-j", "2", "--quiet"])
        index = ShardIndex.load(f"ais://{raw}/index.json")
        assert index.total == count and index.has_offsets
        print(f"2. create wrote {len(index)} shards and ais://{raw}/index.json in {time.perf_counter() - t:.1f} s")

        t = time.perf_counter()
        shuffled = dsort_shuffle(f"ais://{raw}/pets-{{000000..{len(index) - 1:06d}}}.tar",
                                 f"ais://{shuffled_bucket}/shuffled-{{0000..9999}}.tar",
                                 output_shard_size="64KiB", timeout=120)
        shuffled_index = ShardIndex.from_scans(build_index(shuffled, jobs=4))  # their sample offsets
        assert shuffled_index.total == count
        print(f"3. dSort shuffled them into {len(shuffled)} shards in ais://{shuffled_bucket} "
              f"in {time.perf_counter() - t:.1f} s")

        print(f"4. training from ais://{shuffled_bucket} with ExactEpochs")
        losses = train(shuffled_index, args.epochs, batch_size=16)
        print(f"done: mean loss {losses[0]:.3f} -> {losses[-1]:.3f}")
        if os.environ.get("PETS_KEEP_BUCKETS") is None:
            for name in (raw, shuffled_bucket):
                client.bucket(name).delete(missing_ok=True)


if __name__ == "__main__":
    main()
