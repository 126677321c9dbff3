"""Shards written into a test's temp dir, and the loaders the stats tests read them with."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import webdataset as wds
from PIL import Image
from server_process import free_port
from stack import DataLoader2


def write_shards(folder: Path | str, shards: int, per_shard: int, size: int = 100, prefix: str = "s",
                 seed: int = 0) -> list[str]:
    """``shards`` tar files of ``per_shard`` samples each (a ``bin`` field of ``size`` random bytes
    and a ``cls``), written by webdataset's TarWriter; returns their paths."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    paths = []
    for shard in range(shards):
        path = os.path.join(folder, f"{prefix}-{shard:03d}.tar")
        with wds.TarWriter(path) as writer:
            for i in range(per_shard):
                writer.write({"__key__": f"{prefix}{shard:03d}-{i:04d}", "bin": rng.bytes(size),
                              "cls": str(i % 10).encode()})
        paths.append(path)
    return paths


def write_jpeg_shards(folder: Path | str, shards: int, per_shard: int, side: int, seed: int = 0) -> list[str]:
    """Shards of ``side`` x ``side`` JPEGs of smooth noise (they compress as photos do) and a ``cls``."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(2, side // 16), max(2, side // 16), 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(small).resize((side, side), Image.BICUBIC).save(out, format="JPEG", quality=90)
    jpeg = out.getvalue()
    os.makedirs(folder, exist_ok=True)
    paths = []
    for shard in range(shards):
        path = os.path.join(folder, f"j-{shard:03d}.tar")
        with wds.TarWriter(path) as writer:
            for i in range(per_shard):
                writer.write({"__key__": f"j{shard:03d}-{i:04d}", "jpg": jpeg, "cls": str(i % 10).encode()})
        paths.append(path)
    return paths


def fork_loader(dp, workers: int = 2, **options):
    """``dp`` under torch's DataLoader with forked workers, batches as the pipe makes them."""
    import torch

    return torch.utils.data.DataLoader(dp, batch_size=None, num_workers=workers, multiprocessing_context="fork",
                                       **options)


def loader_named(name: str, dp):
    """``dp`` under the loader ``name``: "plain" (the pipe itself), "DataLoader", "StatefulDataLoader"
    and "DataLoader2" with 2 forked workers, "torchdata.nodes" a prefetching thread of this
    process. Skips the test where this stack has no torchdata.nodes (mark DataLoader2's cases
    with ``stack.needs_dataloader2``). Shut down what has ``shutdown`` when done."""
    import pytest

    import wds_datapipes as wd

    if name == "plain":
        return dp
    if name == "DataLoader":
        return fork_loader(dp)
    if name == "StatefulDataLoader":
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(dp, batch_size=None, num_workers=2, multiprocessing_context="fork")
    if name == "DataLoader2":
        return DataLoader2(dp, reading_service=wd.MultiProcessingReadingService(num_workers=2))
    if name == "torchdata.nodes":
        tn = pytest.importorskip("torchdata.nodes", reason="torchdata < 0.10 has no torchdata.nodes (the newest stack has)")
        return tn.Loader(tn.Prefetcher(tn.IterableWrapper(dp), prefetch_factor=2))
    raise ValueError(f"no loader named {name!r}")


def decode_seconds(jpeg: bytes) -> float:
    """The time one decode of ``jpeg`` takes here, as ``decode`` does it: simplejpeg, Pillow where
    it is missing (the slow-decoding tests' oracle)."""
    import time

    try:
        import simplejpeg
    except ImportError:  # an optional dependency of the decoder's
        simplejpeg = None
    began = time.perf_counter()
    if simplejpeg is not None:
        simplejpeg.decode_jpeg(jpeg, colorspace="RGB")
    else:
        Image.open(io.BytesIO(jpeg)).convert("RGB").load()
    return time.perf_counter() - began


def start_ranks(script: str, args: list[list[str]]):
    """One ``python -c script`` process per rank of a gloo world of ``len(args)``, rank ``r`` given
    ``args[r]`` and torch's env:// variables; their output piped. Communicate with them, kill them after."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(len(args))}
    return [subprocess.Popen([sys.executable, "-c", script, *argv], env={**env, "RANK": str(rank)},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for rank, argv in enumerate(args)]
