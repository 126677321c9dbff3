"""Loaders with 2 worker processes that tally what they read, kept up between measurements:
what bench_ais and bench_storage's pipelines time, and the CPU meters they read.

Workers count samples and bytes and send one total per ``PER_MESSAGE`` samples, so a row
compares reading, parsing and grouping, not inter-process transfer. ``worker_clock``
reads a run's CPU in parts: the loader's workers (this process's children, from
``/proc``: kept workers are never reaped), the main process, and the given cluster nodes.
"""

from __future__ import annotations

import functools
import os
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

from torch.utils.data import DataLoader, IterableDataset

warnings.filterwarnings("ignore", message=r"(?s).*'datapipes', 'dataloader2' modules are deprecated")

import wds_datapipes as wd
from benchmarks.harness import Clock
from wds_datapipes.torch_datapipes import IterDataPipe

try:
    from torchdata.dataloader2 import DataLoader2
except ImportError:  # torchdata >= 0.10: the datapipe rows run under DataLoader
    DataLoader2 = None

WORKERS = 2
PER_MESSAGE = 500


def _tally(sample: dict) -> tuple[int, int]:
    return 1, sum(len(v) for k, v in sample.items() if not k.startswith("__"))


def _add(tallies: list[tuple[int, int]]) -> tuple[int, int]:
    return sum(n for n, _ in tallies), sum(b for _, b in tallies)


def tally_named(item: tuple) -> tuple[int, int]:
    """An aistore.pytorch item, ``(name, content)``: a sample's dict (AISShardReader) or one
    object's bytes (AISIterDataset, AISMapDataset, AISBatchIterDataset)."""
    content = item[1]
    return _tally(content) if isinstance(content, dict) else (1, len(content))


def _collate_tallies(tally: Callable[[object], tuple[int, int]], batch: list) -> tuple[int, int]:
    return _add([tally(item) for item in batch])


class _Tallied(IterableDataset):
    """Runs in each worker over a torch IterableDataset: one (count, bytes) per PER_MESSAGE items."""

    def __init__(self, dataset: IterableDataset, tally: Callable[[object], tuple[int, int]]):
        self.dataset, self.tally = dataset, tally

    def __iter__(self):
        return _tallies(self.dataset, self.tally)


class _TalliedPipe(IterDataPipe):
    """The same one-generator tally over a datapipe, kept a datapipe so that the reading
    service's sharding still reaches the pipe below it."""

    def __init__(self, source_datapipe, tally: Callable[[object], tuple[int, int]]):
        self.source_datapipe, self.tally = source_datapipe, tally

    def __iter__(self):
        return _tallies(self.source_datapipe, self.tally)


def _tallies(items: Iterable, tally: Callable[[object], tuple[int, int]]):
    pending = []
    for item in items:
        pending.append(tally(item))
        if len(pending) == PER_MESSAGE:
            yield _add(pending)
            pending = []
    if pending:
        yield _add(pending)


class Loader:
    """A 2-worker loader over a pipe of (count, bytes) tallies, kept up between measurements.

    ``kind``: "datapipes", "webdataset", or a torch dataset of ``(name, content)`` items,
    "torch-iterable" or "torch-map" (aistore.pytorch); ``per_sample``: items per sample.
    ``generator_tally``: datapipes and webdataset tally in one plain generator, at the same
    cost a sample on both sides, instead of each library's own map and batch stages (torch's
    datapipe stages cost a hook a sample that webdataset's do not)."""

    def __init__(self, kind: str, make: Callable[[], object], per_sample: int = 1, generator_tally: bool = False):
        self.kind, self.make, self.loader, self.per_sample = kind, make, None, per_sample
        self.generator_tally = generator_tally
        self.last = (0, 0)  # (samples, bytes) of the last epoch

    def _tallied_pipe(self):
        if self.generator_tally:
            return _TalliedPipe(self.make(), _tally)
        return self.make().map(_tally).batch(PER_MESSAGE).map(_add)

    def start(self) -> None:
        if self.kind == "datapipes" and DataLoader2 is not None:
            self.loader = DataLoader2(self._tallied_pipe(),
                                      reading_service=wd.MultiProcessingReadingService(num_workers=WORKERS))
        elif self.kind == "datapipes":
            self.loader = DataLoader(self._tallied_pipe(), batch_size=None, num_workers=WORKERS,
                                     persistent_workers=True)
        elif self.kind == "torch-iterable":  # each worker tallies its share of the items
            self.loader = DataLoader(_Tallied(self.make(), tally_named), batch_size=None,
                                     num_workers=WORKERS, persistent_workers=True)
        elif self.kind == "torch-map":  # collate_fn runs in the workers: one tally per batch
            self.loader = DataLoader(self.make(), batch_size=PER_MESSAGE, num_workers=WORKERS,
                                     collate_fn=functools.partial(_collate_tallies, tally_named),
                                     persistent_workers=True)
        else:  # webdataset
            ds = _Tallied(self.make(), _tally) if self.generator_tally else \
                self.make().map(_tally).batched(PER_MESSAGE, collation_fn=_add)
            self.loader = DataLoader(ds, batch_size=None, num_workers=WORKERS, persistent_workers=True)

    def epoch(self) -> tuple[int, int]:
        count, nbytes = _add(list(self.loader))
        self.last = (count // self.per_sample, nbytes)
        return self.last

    def epochs(self, n: int) -> tuple[int, int]:
        """A harness path: ``n`` epochs, their samples and bytes together."""
        done = [self.epoch() for _ in range(n)]
        return sum(c for c, _ in done), sum(b for _, b in done)

    def stop(self) -> None:
        if DataLoader2 is not None and isinstance(self.loader, DataLoader2):
            self.loader.shutdown()
        self.loader = None


def started(loaders: dict[str, Loader]) -> None:
    """Every loader up (idle ones cost nothing), each warmed by one epoch."""
    for loader in loaders.values():
        loader.start()
        loader.epoch()


def stopped(loaders: dict[str, Loader]) -> None:
    for loader in loaders.values():
        loader.stop()


def _stat(pid: str) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def children_ticks() -> int:
    """CPU ticks (user + system) of this process's children: the loaders' workers."""
    me, total = str(os.getpid()), 0
    for pid in os.listdir("/proc"):
        if pid.isdigit() and (fields := _stat(pid)) is not None and fields[1] == me:
            total += int(fields[11]) + int(fields[12])
    return total


def ticks_of(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        if (fields := _stat(str(pid))) is not None:
            total += int(fields[11]) + int(fields[12])
    return total


def below_ticks() -> int:
    """CPU ticks (user + system) of the processes below this one (workers, their agents), not
    the cluster's nodes (started detached)."""
    parents, ticks = {}, {}
    for pid in os.listdir("/proc"):
        if pid.isdigit() and (fields := _stat(pid)) is not None:
            parents[pid], ticks[pid] = fields[1], int(fields[11]) + int(fields[12])
    me, total = str(os.getpid()), 0
    for pid, used in ticks.items():
        up = parents.get(pid)
        while up and up != me and up != "0":
            up = parents.get(up)
        if up == me:
            total += used
    return total


def worker_clock(node_pids: list[int], workers: Callable[[], int] = children_ticks) -> Clock:
    """The wall clock, and CPU seconds in parts: ``workers`` (ticks of the loaders' processes),
    ``main`` (this process) and ``cluster`` (the nodes ``node_pids``, on this machine)."""
    tick = 1 / os.sysconf("SC_CLK_TCK")
    parts = {"workers": lambda: workers() * tick, "main": time.process_time,
             "cluster": lambda: ticks_of(node_pids) * tick}
    return Clock(cpu=lambda: sum(meter() for meter in parts.values()), parts=parts)
