"""The main job: stream WebDataset shards into a training loop with DataLoader2 and 2 workers.

    python examples/train_digits.py [--data DIR] [--epochs 5] [--workers 2]

On a stack without DataLoader2 (torchdata >= 0.10) it uses torch's DataLoader instead.

1. Turns scikit-learn's digits (1,797 8x8 greyscale images that ship inside the package)
   into tar shards with webdataset's ShardWriter: PNG image + class label per sample,
   a train set and a held-out test set.
2. Streams the train shards through ``list_shards -> load_tar -> group_by_key ->
   shuffle_samples -> decode -> to_tuple -> batch_samples`` under DataLoader2 with
   2 worker processes (``wds_datapipes.MultiProcessingReadingService``) (each reads whole, distinct shards; shuffles change each epoch).
3. Trains a small CNN for a few epochs with a progress bar, then prints samples/s and the
   test accuracy.
"""

from __future__ import annotations

import argparse
import io
import os
import time
import warnings

import numpy as np
import torch
import webdataset as wds
from PIL import Image
from sklearn.datasets import load_digits
from torch import nn
from tqdm import tqdm

import wds_datapipes as wd

try:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"(?s).*'datapipes', 'dataloader2' modules are deprecated")
        from torchdata.dataloader2 import DataLoader2
except ImportError:  # torchdata >= 0.10
    DataLoader2 = None


def write_digit_shards(folder: str, per_shard: int = 200) -> tuple[str, str]:
    """Writes train and test shards of the digits; returns their brace URLs."""
    digits = load_digits()
    images = (digits.images * (255 / 16)).astype(np.uint8)  # 0..16 -> 0..255
    order = np.random.default_rng(0).permutation(len(images))
    test = set(order[: len(order) // 5].tolist())
    os.makedirs(folder, exist_ok=True)
    urls = {}
    for split in ("train", "test"):
        pattern = os.path.join(folder, f"digits-{split}-%04d.tar")
        indices = [i for i in range(len(images)) if (i in test) == (split == "test")]
        with wds.ShardWriter(pattern, maxcount=per_shard, verbose=0) as sink:
            for i in indices:
                png = io.BytesIO()
                Image.fromarray(images[i]).save(png, format="PNG")
                sink.write({"__key__": f"digit{i:05d}", "png": png.getvalue(), "cls": int(digits.target[i])})
        shards = (len(indices) + per_shard - 1) // per_shard
        urls[split] = os.path.join(folder, f"digits-{split}-{{0000..{shards - 1:04d}}}.tar")
    return urls["train"], urls["test"]


def pipeline(url: str, train: bool, batch_size: int = 64):
    """Shards to (images float Nx8x8 in [0, 1], labels) batches; shuffled per epoch when training."""
    dp = wd.ShardLister(url, shuffle=train).load_tar().group_by_key()
    if train:
        dp = dp.shuffle_samples(bufsize=500)
    return dp.decode("torchl").to_tuple("png", "cls").batch_samples(batch_size)


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x.unsqueeze(1))  # greyscale batches come as N x H x W


def main() -> None:
    parser = argparse.ArgumentParser(description="Train a small CNN on digits streamed from WebDataset shards.")
    parser.add_argument("--data", default=os.path.join("data", "digits"), help="where the shards are written")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    train_url, test_url = write_digit_shards(args.data)
    print(f"shards: {train_url} and {test_url}")

    model = SmallCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    loss_fn = nn.CrossEntropyLoss()
    if DataLoader2 is not None:
        loader = DataLoader2(pipeline(train_url, train=True),
                             reading_service=wd.MultiProcessingReadingService(num_workers=args.workers))
        loader.seed(args.seed)
    else:
        loader = torch.utils.data.DataLoader(pipeline(train_url, train=True), batch_size=None,
                                             num_workers=args.workers,
                                             generator=torch.Generator().manual_seed(args.seed))
    print(f"loader: {type(loader).__name__} with {args.workers} workers")
    seen, start = 0, time.perf_counter()
    try:
        for epoch in range(args.epochs):
            model.train()
            bar = tqdm(loader, desc=f"epoch {epoch + 1}/{args.epochs}", unit="batch")
            for images, labels in bar:
                optimizer.zero_grad()
                loss = loss_fn(model(images), labels)
                loss.backward()
                optimizer.step()
                seen += len(labels)
                bar.set_postfix(loss=f"{loss.item():.3f}")
    finally:
        if DataLoader2 is not None:
            loader.shutdown()
    elapsed = time.perf_counter() - start

    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in pipeline(test_url, train=False):
            correct += (model(images).argmax(1) == labels).sum().item()
            total += len(labels)
    print(f"trained on {seen} samples in {elapsed:.1f} s: {seen / elapsed:,.0f} samples/s "
          f"({args.workers} workers)")
    print(f"test accuracy: {correct / total:.1%} on {total} held-out digits")


if __name__ == "__main__":
    main()
