"""Writing shards from an ImageFolder tree: ours against ``cp -r``, webdataset's ShardWriter and LitData.

    python -m benchmarks.bench_write [--files 4000] [--images 1600] [--rounds 9] [--index-pairs 3] [--quick]

The input: ``--files`` files of 50-150 KB of random bytes in 40 class folders, read once
so they sit in the page cache. A copy-only conversion to shards of 1000 samples (each
sample its file and its class), in one process, timed per round, the median reported (a
peer that is not installed says so in its row):

- ``cp -r``: the same bytes copied file by file (the disk's limit for this work);
- webdataset 1.0.2's ``ShardWriter`` loop (read each file, ``write({"jpg": ..., "cls": ...})``);
- LitData's ``optimize()`` (one worker, chunks of 1000 samples, its own format);
- ours, ``write_shards(imagefolder_samples(...))``: files read by the OS into the shard's
  1 MB write buffer (``os.readv``), the index (offsets and member places) taken in the
  same pass; and ours with the index switched off, for the index's cost.

Then ``--images`` JPEGs (640x480, 50-150 KB) through a per-sample function (decode,
resize to 320x240, re-encode), with 1 and 2 worker processes, in shards of 10 samples.
1,600 by default: a run of 400 lasts 1.4-2.4 s, short enough for its start and its end to
move the ratio (measured in one hour: 1.67 at 400 images, rounds 1.32-1.97; 1.91 at 1,600,
rounds 1.84-2.00).

The paths alternate within each round (a change of the machine's load hits every row).
The index's cost is taken three ways: the rounds' runs of ours with and without it;
``--index-pairs`` back-to-back runs of the two after each round (the median of each pair's
ratio), since two single runs a round differ by more than the index costs (paired runs of
the same code moved -11% to +20%); and its own CPU time inside the runs with it (the
places, each shard's progress record, the join into the index file; garbage collections
that start inside those functions counted apart), which moves least with the machine.
No run fsyncs (``cp`` does not); after each run, untimed, its output is
removed and ``sync`` waits for the disk, so no run is throttled by the writeback of the one
before it. Timings on a shared machine move with its load: compare
ratios from one run. The CPU time per file (user + system of this process and its
children: ``cp``, the workers) moves less with the load than the wall time does. Each goal's
ratio is the median of the rounds' pairs (both runs of a pair in the same round), with its
range. ``--quick``: 200 files, 20 images, one round, one pair.
"""

from __future__ import annotations

import gc
import os
import random
import shutil
import subprocess
import tempfile
import time
from importlib.util import find_spec

from benchmarks.harness import Bench, Ratio, time_in_turn
from wds_datapipes.epochs.index import ShardIndex
from wds_datapipes.epochs.places import ShardPlaces
from wds_datapipes.writing import progress, shard_file, writer
from wds_datapipes.writing.sources import imagefolder_samples
from wds_datapipes.writing.writer import write_shards


def make_tree(root: str, files: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    total = 0
    for i in range(files):
        folder = os.path.join(root, f"class{i % 40:02d}")
        os.makedirs(folder, exist_ok=True)
        data = rng.randbytes(rng.randrange(50_000, 150_000))
        total += len(data)
        with open(os.path.join(folder, f"img{i:06d}.jpg"), "wb") as out:
            out.write(data)
    for folder, _, names in os.walk(root):  # into the page cache
        for name in names:
            with open(os.path.join(folder, name), "rb") as stream:
                stream.read()
    return total


def run_cp(src: str, dst: str) -> None:
    subprocess.run(["cp", "-r", src, dst], check=True)


def run_webdataset(src: str, dst: str) -> None:
    import webdataset as wds

    os.makedirs(dst)
    classes = sorted(os.listdir(src))
    with wds.ShardWriter(os.path.join(dst, "wds-%06d.tar"), maxcount=1000, verbose=0) as sink:
        for number, name in enumerate(classes):
            folder = os.path.join(src, name)
            for file in sorted(os.listdir(folder)):
                with open(os.path.join(folder, file), "rb") as stream:
                    sink.write({"__key__": f"{name}/{file[:-4]}", "jpg": stream.read(), "cls": number})


def _litdata_item(item: tuple[str, int]) -> dict:
    path, number = item
    with open(path, "rb") as stream:
        return {"jpg": stream.read(), "cls": number}


def run_litdata(src: str, dst: str) -> None:
    import litdata

    classes = sorted(os.listdir(src))
    inputs = [(os.path.join(src, name, file), number) for number, name in enumerate(classes)
              for file in sorted(os.listdir(os.path.join(src, name)))]
    litdata.optimize(fn=_litdata_item, inputs=inputs, output_dir=dst, chunk_size=1000, num_workers=1,
                     reorder_files=False, verbose=False, start_method="fork")


def run_ours(src: str, dst: str, workers: int = 1, **settings) -> None:
    write_shards(imagefolder_samples(src), os.path.join(dst, "ours-%06d.tar"), workers=workers, fsync=False,
                 **{"maxcount": 1000, **settings})


def run_ours_no_index(src: str, dst: str) -> None:
    """Ours with member places and the index file switched off (the progress record stays)."""
    places, join = shard_file._places, writer.join_index
    shard_file._places = lambda *args: ShardPlaces(None)
    writer.join_index = lambda index, world, own=None: ShardIndex([])  # nothing joined nor saved
    try:
        run_ours(src, dst)
    finally:
        shard_file._places, writer.join_index = places, join


INDEX_PAIR = ("ours", "ours, no index")


def make_images(root: str, images: int, seed: int = 0) -> int:
    """``images`` JPEGs of 640x480 (smooth colours and noise: 50-150 KB) in 4 class folders."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    total = 0
    for i in range(images):
        folder = os.path.join(root, f"class{i % 4}")
        os.makedirs(folder, exist_ok=True)
        y, x = np.mgrid[0:480, 0:640]
        base = np.stack([(x * rng.uniform(0.1, 0.4) + y * rng.uniform(0.1, 0.4)) % 256] * 3, axis=-1)
        noise = rng.normal(0, rng.uniform(4, 12), size=(480, 640, 3))
        path = os.path.join(folder, f"img{i:06d}.jpg")
        Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8)).save(path, quality=90)
        total += os.path.getsize(path)
    return total


def resize_sample(sample: dict) -> dict:
    """The per-sample function: decode the JPEG, resize to 320x240, encode it again."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(sample["jpg"])) as image:
        small = image.convert("RGB").resize((320, 240), Image.BILINEAR)
    out = io.BytesIO()
    small.save(out, format="JPEG", quality=90)
    return {**sample, "jpg": out.getvalue()}


class IndexTime:
    """The CPU time spent inside the index's own work during ``ours`` runs: the member places
    (``shard_file._places``), each shard's progress record (``ProgressLog.record``, which the
    run without an index writes too, smaller: an upper bound) and the join into the index
    file (``writer.join_index``). Measured inside the run, it does not move with the
    machine's noise as a difference of two whole runs does.

    Garbage collections that start inside those functions are counted apart
    (``gc_seconds``): a collection pays for the objects of the whole run and starts in
    whichever function happens to cross the allocation count. A full one took 200 ms here,
    about 40% of a run of ours, in 2 of 30 runs (the back-to-back pairs count what the
    index's objects add to the collections)."""

    def __init__(self):
        self.seconds = 0.0
        self.gc_seconds = 0.0
        self._inside = 0
        self._collecting: float | None = None

    def run(self, src: str, dst: str) -> None:
        saved = shard_file._places, writer.join_index, progress.ProgressLog.record
        shard_file._places, writer.join_index = self._timed(saved[0]), self._timed(saved[1])
        progress.ProgressLog.record = self._timed(saved[2])
        gc.callbacks.append(self._collection)
        try:
            run_ours(src, dst)
        finally:
            gc.callbacks.remove(self._collection)
            shard_file._places, writer.join_index, progress.ProgressLog.record = saved

    def _collection(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._collecting = time.process_time() if self._inside else None
        elif self._collecting is not None:
            self.gc_seconds += time.process_time() - self._collecting
            self._collecting = None

    def _timed(self, function):
        def timed(*args, **kwargs):
            started, collected = time.process_time(), self.gc_seconds
            self._inside += 1
            try:
                return function(*args, **kwargs)
            finally:
                self._inside -= 1
                self.seconds += time.process_time() - started - (self.gc_seconds - collected)
        return timed


def main(argv: list[str] | None = None) -> None:
    bench = Bench("bench_write", __doc__, peers=("webdataset", "litdata"), rounds=9, data=None)
    bench.parser.add_argument("--files", type=int, default=4000)
    bench.parser.add_argument("--images", type=int, default=1600)
    bench.parser.add_argument("--index-pairs", type=int, default=None,
                              help="back-to-back runs of ours with and without the index a round (default 3)")
    args = bench.parse(argv)
    if args.quick:
        args.files, args.images = min(args.files, 200), min(args.images, 20)
    pairs_a_round = args.index_pairs if args.index_pairs is not None else (1 if args.quick else 3)
    work = tempfile.mkdtemp(prefix="bench-write-")
    try:
        with bench.results(args):
            measure(bench, args, work, pairs_a_round)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(bench: Bench, args, work: str, pairs_a_round: int) -> None:
    src, images = os.path.join(work, "src"), os.path.join(work, "images")
    total = make_tree(src, args.files)
    image_bytes = make_images(images, args.images)
    print(f"{args.files} files, {total / 1e6:.0f} MB in the page cache; {args.images} JPEGs, "
          f"{image_bytes / 1e6:.0f} MB; medians of {args.rounds} round(s)")
    dst = os.path.join(work, "dst")
    index_time = IndexTime()

    def path(source: str, count: int, run):
        return lambda: (run(source, dst), count)[1]

    def mapped(workers: int):
        return path(images, args.images, lambda s, d: run_ours(s, d, workers, maxcount=10, map=resize_sample))

    runs = {"cp -r": path(src, args.files, run_cp), "webdataset ShardWriter": path(src, args.files, run_webdataset)}
    if find_spec("litdata") is not None:
        runs["LitData optimize"] = path(src, args.files, run_litdata)
    runs.update({
        "ours": path(src, args.files, index_time.run),
        "ours, no index": path(src, args.files, run_ours_no_index),
        "ours + function, 1 worker": mapped(1),
        "ours + function, 2 workers": mapped(2),
    })

    def cleanup(_: str) -> None:
        shutil.rmtree(dst)
        os.sync()  # untimed: the next run does not wait on this one's writeback

    times = pairs = None
    for round_ in range(args.rounds):
        times = time_in_turn(runs, 1, timings=times, after_each=cleanup, start=round_)
        if pairs_a_round:  # the index's cost: ours with and without it, back to back
            pairs = time_in_turn({name: runs[name] for name in INDEX_PAIR}, pairs_a_round, timings=pairs,
                                 after_each=cleanup, start=round_)
    for name in runs:
        rounds = times.rounds(name)
        print(f"{name:28s} {times.rate(name):8.0f} files/s (min {min(r.rate() for r in rounds):.0f}, "
              f"max {max(r.rate() for r in rounds):.0f}); CPU {times.cpu_per(name, per=10**6):.0f} us/file")
    if "LitData optimize" not in runs:
        print("LitData optimize             not measured: litdata is not installed (pip install -e '.[bench]')")

    print("\nratios, the median of the rounds' pairs (range) [goals]")

    def goal(label: str, a: str, b: str, wanted: str) -> None:
        bench.ratio(label, times.ratio(a, b), wanted, note=f"by CPU time {times.ratio(a, b, of='cpu')}")

    goal("ours / cp -r", "ours", "cp -r", ">= 0.8")
    goal("ours / webdataset ShardWriter", "ours", "webdataset ShardWriter", ">= 3")
    if "LitData optimize" in runs:
        goal("ours / LitData optimize", "ours", "LitData optimize", ">= 1.2")

    def cost(timings, label: str) -> None:  # the index's cost: ours without it over ours, minus 1
        by_cpu = Ratio.of(x - 1 for x in timings.paired("ours, no index", "ours", of="cpu"))
        bench.ratio(label, Ratio.of(x - 1 for x in timings.paired("ours, no index", "ours")), "<= 0.05",
                    note=f"by CPU time {by_cpu}")

    cost(times, "index in the same pass, time over none")
    if pairs is not None:
        cost(pairs, f"index, {len(pairs.rounds('ours'))} back-to-back pairs")
    ours_cpu = sum(r.cpu for r in times.rounds("ours")) + (
        sum(r.cpu for r in pairs.rounds("ours")) if pairs is not None else 0.0)  # every run of ours
    own = index_time.seconds / ours_cpu
    bench.ratio("index, its own CPU time over the rest of ours", own / (1 - own), "<= 0.05")
    print(f"  (garbage collections that started inside the index's functions, not counted there: "
          f"{index_time.gc_seconds / ours_cpu:.3f} of ours' CPU time)")
    by_cpu = Ratio.of(2 * x for x in times.paired("ours + function, 2 workers", "ours + function, 1 worker", of="cpu"))
    bench.ratio("function, 2 workers / 1 worker", times.ratio("ours + function, 2 workers", "ours + function, 1 worker"),
                ">= 1.7", note=f"by CPU time (x2) {by_cpu}")


if __name__ == "__main__":
    main()
