"""The three-step AIStore + WebDataset workflow, end to end, on a real cluster.

1. Convert a small real dataset to shards in a bucket: scikit-learn's handwritten digits
   (1797 8x8 images, shipped inside the scikit-learn package), written as PNG + class
   samples with webdataset's ``ShardWriter``; each shard goes to the bucket as it closes.
2. Shuffle the samples across shards on the cluster with dSort.
3. Stream the shuffled shards into a DataLoader2 training loop with 2 workers (DataLoader
   where torchdata has no DataLoader2).

Run::

    pip install -e '.[examples]'
    python examples/ais_webdataset_workflow.py          # starts (and stops) a local cluster
    AIS_ENDPOINT=http://host:8080 python examples/ais_webdataset_workflow.py   # your cluster

Without ``AIS_ENDPOINT`` it uses the cluster of ``python -m aisio.cluster start`` when one
runs, else starts one for the run (building aisnode with Go first if it is missing).
"""

from __future__ import annotations

import argparse
import io
import os
import tempfile
import time

import numpy as np
import torch
import webdataset as wds
from PIL import Image

import wds_datapipes as wd  # registers load_tar, group_by_key, decode, ...
from aisio import AISSourceLister, ShardUploader, dsort_shuffle, get_client
from aisio.cluster import cluster_endpoint

RAW_BUCKET = "digits-raw"
SHUFFLED_BUCKET = "digits-shuffled"
BATCH_SIZE = 64


def convert_to_shards(samples_per_shard: int) -> list[str]:
    """Step 1: digits -> PNG/cls samples -> tar shards, uploaded as each one closes."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    uploader = ShardUploader(f"ais://{RAW_BUCKET}/train-")  # removes each local file once stored
    with tempfile.TemporaryDirectory() as tmp:
        with wds.ShardWriter(f"{tmp}/%06d.tar", maxcount=samples_per_shard, post=uploader, verbose=0) as sink:
            for i, (image, label) in enumerate(zip(digits.images, digits.target)):
                pixels = (image * (255 / 16)).astype(np.uint8)  # 0..16 -> 0..255
                png = io.BytesIO()
                Image.fromarray(pixels, mode="L").save(png, format="PNG")
                sink.write({"__key__": f"digit{i:05d}", "png": png.getvalue(), "cls": int(label)})
        leftover = os.listdir(tmp)
    assert not leftover, f"local shards left behind: {leftover}"
    return uploader.uploaded


def to_example(sample: dict) -> tuple[torch.Tensor, int]:
    """A decoded sample -> (flat float image in 0..1, label)."""
    return torch.from_numpy(sample["png"]).float().div_(255).flatten(), sample["cls"]


def make_pipe(shards_url: str):
    """Step 3's input pipeline: list and shuffle shards (a new order each epoch), stream,
    group, shuffle samples, decode, batch. Each worker reads whole, distinct shards."""
    return (
        AISSourceLister(shards_url, shuffle=True)
        .load_tar()
        .group_by_key()
        .shuffle_samples(bufsize=500)
        .decode("l8")
        .map(to_example)
        .batch_samples(BATCH_SIZE)
    )


def train(shards_url: str, epochs: int, workers: int) -> float:
    """Step 3: a softmax classifier trained from the streamed shards; returns the last epoch's accuracy."""
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = make_loader(make_pipe(shards_url), workers)
    accuracy = 0.0
    try:
        for epoch in range(epochs):
            started, seen, correct, total_loss = time.perf_counter(), 0, 0, 0.0
            for images, labels in loader:
                logits = model(images)
                loss = torch.nn.functional.cross_entropy(logits, labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                seen += len(labels)
                correct += int((logits.argmax(1) == labels).sum())
                total_loss += loss.item() * len(labels)
            accuracy = correct / seen
            print(f"  epoch {epoch}: {seen} samples, loss {total_loss / seen:.3f}, "
                  f"train accuracy {accuracy:.3f}, {seen / (time.perf_counter() - started):.0f} samples/s")
    finally:
        getattr(loader, "shutdown", lambda: None)()
    return accuracy


def make_loader(dp, workers: int):
    """DataLoader2 with wds_datapipes' reading service; torch's DataLoader where torchdata has none."""
    try:
        from torchdata.dataloader2 import DataLoader2
    except ImportError:  # torchdata >= 0.10
        return torch.utils.data.DataLoader(dp, batch_size=None, num_workers=workers,
                                           generator=torch.Generator().manual_seed(0))
    loader = DataLoader2(dp, reading_service=wd.MultiProcessingReadingService(num_workers=workers))
    loader.seed(0)
    return loader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--samples-per-shard", type=int, default=200)
    args = parser.parse_args()

    with cluster_endpoint():
        client = get_client()
        for name in (RAW_BUCKET, SHUFFLED_BUCKET):
            client.bucket(name).delete(missing_ok=True)

        t = time.perf_counter()
        shards = convert_to_shards(args.samples_per_shard)
        print(f"1. wrote {len(shards)} shards to ais://{RAW_BUCKET} in {time.perf_counter() - t:.1f} s")

        t = time.perf_counter()
        shuffled = dsort_shuffle(
            f"ais://{RAW_BUCKET}/train-{{000000..{len(shards) - 1:06d}}}.tar",
            f"ais://{SHUFFLED_BUCKET}/shuffled-{{0000..9999}}.tar",
            output_shard_size="64KiB",
            timeout=300,
        )
        print(f"2. dSort shuffled them into {len(shuffled)} shards in ais://{SHUFFLED_BUCKET} "
              f"in {time.perf_counter() - t:.1f} s")

        print(f"3. training from ais://{SHUFFLED_BUCKET} with {args.workers} loader workers")
        accuracy = train(f"ais://{SHUFFLED_BUCKET}/shuffled-", args.epochs, args.workers)
        print(f"done: train accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
