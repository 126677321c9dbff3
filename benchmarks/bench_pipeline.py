"""Throughput of wds_datapipes against its peers and against the bare loops, on the same data, in one run.

    python benchmarks/bench_pipeline.py [--photos 2000] [--repeats 2] [--rounds 5] [--quick]

Writes its data once (reused between runs; --data DIR):
- photos: 2,000 photo-like JPEGs of 300-500 px per side (quality 90, ~50 KB) with a label;
- uniform small images: 8 x 1,000 256x256 JPEGs (the data of earlier tables);
- raw payloads: 4,000 samples of random bytes of 1, 16 and 100 KB.

Then times, each row the best of --repeats after a warm-up read (page cache):
1. raw grouped samples (no decoding): ours (load_tar().group_by_key(), and ExactEpochs
   over an index with member places, which reads no tar header), webdataset, LitData (the
   same samples in its own chunk format, written once; where litdata is installed, as
   `make bench` does) and reading the same tar files whole (the ceiling of any reader),
   per member size, the rows of a size timed in turn at least 5 times; with them the floor of
   reading by member places: a bare loop of reads and slices, and the same yielding a dict
   per sample from a minimal pipe;
2. vision, one process, one thread: bytes -> 224x224 uint8 crops in batches of 64, for
   evaluation (resize the short side to 256, centre crop) and training (random-resized
   crop + flip): the bare loop (torchvision.io.decode_jpeg + the transform over bytes in
   memory), ours (decode_batches(..., transform=...)), webdataset's usual recipe
   (decode("pil") + torchvision's PIL transforms);
3. vision, two cores (wall time): the bare loop in 2 threads (the ceiling), ours in one
   process with 2 threads, ours under DataLoader(num_workers=2) and DataLoader2 + our
   MultiProcessingReadingService(2) (the same per-worker pipeline): a first epoch of a new
   loader (its workers start) and a later epoch of one whose workers are kept, timed in
   turn with the ceiling; webdataset's recipe under DataLoader(num_workers=2); and the
   time to each loader's first batch;
3b. every front door of ours beside webdataset, wids and LitData on 2 cores (benchmarks/front_doors.py):
   the ceiling, ours in one process, under DataLoader (decode_batches, and the generic
   decode("torchrgb8").map_fields(...) recipe), DataLoader2 and StatefulDataLoader, and the
   peers decoding and cropping with the ceiling's decoder and transform, each epoch timed
   from building its loader, the rows in turn --rounds times: medians of the wall clock and
   of CPU seconds per 1,000 samples (this process and its workers);
4. uniform small images: decode_batches into the batch (no transform) against the bare
   decoder, in one and two threads;
5. shuffled raw samples (photos): shuffle_samples(1000), ExactEpochs' shuffle (and its
   in-order read) and webdataset's shuffle(1000), each in a fresh process: with glibc's
   default allocator, and after wd.keep_freed_memory().
Prints samples/s by the wall clock (what a user waits for; this process's CPU time beside it
where the work is this process's), the ratios the targets name, from the wall clock, and
the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore", message=r"(?s).*'datapipes', 'dataloader2' modules are deprecated")

import torchvision
import webdataset as wds
from front_doors import front_doors, timed_in_turn
from shards import make_jpeg_shards, make_payload_shards, make_photo_shards
from vision_loops import (
    BATCH,
    EVAL,
    TRAIN,
    DataLoader2,
    bare_vision,
    count_samples,
    first_batch_seconds,
    ours_vision,
    started_loaders,
    through_dataloader2,
    torchvision_transform,
    webdataset_vision,
)

import wds_datapipes as wd
from wds_datapipes.decoding.images import decode_image
from wds_datapipes.epochs import places as member_places
from wds_datapipes.pipe_base import Pipe
from wds_datapipes.shards.openers import local_path

try:  # make bench installs it (the [bench] extra)
    import litdata
    from litdata.streaming.writer import BinaryWriter
except ImportError:
    litdata = None



class Table:
    """Rows of samples/s by the wall clock, each the best of ``repeats`` runs; with ``cpu``, the
    rate by this process's CPU time beside it (labelled: what a user waits for is the wall clock)."""

    def __init__(self, repeats: int):
        self.repeats, self.rows = repeats, {}
        self.cpu = True  # False where other processes do the work (loader workers)

    def _timed(self, make: Callable[[], Iterable]) -> tuple[int, float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        count = count_samples(make())
        return count, time.perf_counter() - wall, time.process_time() - cpu

    def _print(self, name: str, wall: float, cpu: float) -> None:
        beside = f"   (CPU time {cpu:>10,.0f})" if self.cpu else ""
        print(f"  {name:<70} {wall:>10,.0f}{beside}")

    def row(self, name: str, make: Callable[[], Iterable], expect: int | None = None) -> float:
        best_wall = best_cpu = 0.0
        for _ in range(self.repeats):
            count, wall, cpu = self._timed(make)
            best_wall, best_cpu = max(best_wall, count / wall), max(best_cpu, count / max(cpu, 1e-9))
        if expect is not None and count != expect:
            raise SystemExit(f"{name}: got {count} samples, expected {expect}")
        self.rows[name] = best_wall
        self._print(name, best_wall, best_cpu)
        return best_wall

    def interleaved(self, makes: dict[str, Callable[[], Iterable]], expect: int, repeats: int) -> dict[str, float]:
        """Rows timed in turn, ``repeats`` times, so that a slow spell of a shared machine
        falls on all of them (ratios between them are the point)."""
        best = dict.fromkeys(makes, 0.0)
        best_cpu = dict.fromkeys(makes, 0.0)
        for _ in range(repeats):
            for name, make in makes.items():
                count, wall, cpu = self._timed(make)
                best[name] = max(best[name], count / wall)
                best_cpu[name] = max(best_cpu[name], count / max(cpu, 1e-9))
                if count != expect:
                    raise SystemExit(f"{name}: got {count} samples, expected {expect}")
        for name, rate in best.items():
            self.rows[name] = rate
            self._print(name, rate, best_cpu[name])
        return best


# ------------------------------------------------------------ raw reading


def read_whole(files: list[str], total: int):
    """Every tar file read whole into one reused buffer: the ceiling of any reader (it
    yields ``total``, the samples of all the files, for the rate)."""
    buffer = bytearray(1 << 20)
    view = memoryview(buffer)
    for path in files:
        with open(path, "rb", buffering=0) as stream:
            while stream.readinto(view):
                pass
    yield from range(total)


def bare_places(index_path: str, dicts: bool):
    """The floor of reading by member places: per shard one ``pread`` per megabyte and a
    memoryview slice per member, no checks; ``dicts``: a dict per sample too (key, url,
    fields, pad flag), yielded by a minimal pipe on our base class (torch's iterator hook
    included), which no DataPipe that yields samples read this way can go below."""
    index = wd.ShardIndex.load(index_path)

    def samples():
        for shard, info in enumerate(index.shards):
            span = index.places.span(shard, 0, info.nsamples)
            url = index.url(shard)
            fd = os.open(local_path(url), os.O_RDONLY)
            view, base, end, sample, current = b"", 0, 0, None, -1
            keys = iter(span.keys)
            for field, offset, size, number in zip(span.suffixes, span.rows["data"].tolist(),
                                                   span.rows["size"].tolist(), span.rows["sample"].tolist()):
                if offset + size > base + end:
                    base, view = offset, memoryview(os.pread(fd, 1 << 20, offset))
                    end = len(view)
                if dicts:
                    if number != current:
                        if sample is not None:
                            yield sample
                        current, sample = number, {"__key__": next(keys), "__url__": url, "__pad__": False}
                    sample[field] = view[offset - base : offset - base + size]
                else:
                    view[offset - base : offset - base + size]
            if sample is not None:
                yield sample
                sample = None
            os.close(fd)
        if not dicts:
            yield from range(sum(index.sizes))

    return _BarePipe(samples) if dicts else samples()


class _BarePipe(Pipe):
    def __init__(self, samples: Callable[[], Iterable]):
        self.samples = samples

    def __iter__(self):
        yield from self.samples()


def places_index(files: list[str], path: str) -> str:
    """An index of ``files`` with member places (written again when a shard is newer, or its
    places are in an older format)."""
    if not os.path.exists(path) or any(os.path.getmtime(f) > os.path.getmtime(path) for f in files) \
            or not _places_current(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        wd.ShardIndex.from_scans(wd.build_index(files, places=True), relative_to=path).save(path)
    return path


def _places_current(path: str) -> bool:
    try:
        places = wd.ShardIndex.load(path).places
    except wd.WdsError:  # its places files are gone or unreadable: index again
        return False
    return places is not None and places.format == member_places.FORMAT


def exact_epochs(index: str, shuffle: bool, views: bool = False):
    return wd.ExactEpochs(index, batch_size=1, shuffle=shuffle, rank=0, world_size=1, views=views)


def shuffled_rates(args: argparse.Namespace) -> dict[str, float]:
    """Section 5 in this (fresh) process: shuffled raw photos, with the allocator ``args.shuffled``."""
    photos = make_photo_shards(os.path.join(args.data, "photos"), args.photos)
    index = places_index(photos, os.path.join(args.data, "index", "photos.json"))
    count_samples(wd.ShardLister(photos).load_tar())  # the page cache
    if args.shuffled == "keep_freed_memory":
        wd.keep_freed_memory()
    table = Table(args.repeats)
    with open(os.devnull, "w") as quiet:
        stdout, sys.stdout = sys.stdout, quiet
        try:
            return {
                "ours, load_tar().group_by_key().shuffle_samples(1000)": table.row(
                    "shuffle_samples", lambda: wd.ShardLister(photos).load_tar().group_by_key().shuffle_samples(1000)),
                "ours, ExactEpochs(index with member places, shuffle=True)": table.row(
                    "exact", lambda: exact_epochs(index, shuffle=True)),
                "ours, ExactEpochs(index with member places, in order)": table.row(
                    "in order", lambda: exact_epochs(index, shuffle=False)),
                "webdataset, WebDataset(shardshuffle=False).shuffle(1000)": table.row(
                    "webdataset", lambda: wds.WebDataset(photos, shardshuffle=False).shuffle(1000)),
            }
        finally:
            sys.stdout = stdout


def litdata_copy(files: list[str], folder: str) -> str:
    """The samples of ``files`` written once in LitData's own chunk format (64 MB chunks)."""
    if not os.path.exists(os.path.join(folder, "index.json")):
        writer = BinaryWriter(folder, chunk_bytes="64MB")
        for i, sample in enumerate(wd.ShardLister(files).load_tar().group_by_key()):
            writer.add_item(i, {k: v for k, v in sample.items() if not k.startswith("__")})
        writer.done()
        writer.merge()
    return folder


def front_door_rows(args: argparse.Namespace, photos: list[str], jpgs: list[bytes], turns: int):
    print(f"\n3b. every front door on 2 cores, eval crops, epochs timed from building the loader; medians of {turns} "
          "rounds in turn")
    sizes = [count_samples(wd.ShardLister([f]).load_tar().group_by_key()) for f in photos]
    lit_photos = None if litdata is None else litdata_copy(
        photos, os.path.join(args.data, "litdata", f"photos-{len(jpgs)}"))
    return timed_in_turn(front_doors(photos, jpgs, sizes, BATCH, EVAL, torchvision_transform(EVAL), bare_vision,
                                     ours_vision, through_dataloader2 if DataLoader2 is not None else None,
                                     lit_photos), count_samples, expect=len(jpgs), rounds=turns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "wds-datapipes-bench"))
    parser.add_argument("--rounds", type=int, default=5, help="turns of the rows timed in turn (sections 1, 3, 3b)")
    parser.add_argument("--quick", action="store_true",
                        help="500 photos, fewer samples elsewhere, 1 repeat, 2 rounds, data in DATA-quick: "
                             "checks that the script runs")
    parser.add_argument("--front-doors", action="store_true", help="only section 3b (every front door beside the peers)")
    parser.add_argument("--shuffled", choices=["default", "keep_freed_memory"],
                        help="only section 5's rows with this allocator (main runs it in a fresh process)")
    args = parser.parse_args()
    if args.quick:
        args.photos, args.repeats, args.rounds = min(args.photos, 500), 1, 2
        args.data = args.data if args.data.endswith("-quick") else args.data + "-quick"
    turns = args.rounds if args.quick else max(args.rounds, 5)
    torch.set_num_threads(1)  # the loaders' own threads and processes are what is measured
    if args.shuffled:
        print(json.dumps(shuffled_rates(args)))
        return

    print(f"machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
          f"python {platform.python_version()}, torch {torch.__version__}, torchvision {torchvision.__version__}"
          + ("" if litdata is None else f", litdata {litdata.__version__}"))
    photos = make_photo_shards(os.path.join(args.data, "photos"), args.photos)
    if args.front_doors:
        count_samples(wd.ShardLister(photos).load_tar())  # warm the page cache
        front_door_rows(args, photos, [s["jpg"] for s in wd.ShardLister(photos).load_tar().group_by_key()], turns)
        return
    payloads = {kb: make_payload_shards(os.path.join(args.data, "payload"), kb, count=1000 if args.quick else 4000)
                for kb in (1, 16, 100)}
    small_shards = 2 if args.quick else 8
    small = make_jpeg_shards(args.data, shards=small_shards)
    small_files = [small.replace(f"{{000000..{small_shards - 1:06d}}}", f"{i:06d}") for i in range(small_shards)]
    for files in (photos, *payloads.values(), small_files):
        count_samples(wd.ShardLister(files).load_tar())  # warm the page cache
    table = Table(args.repeats)
    row = table.row
    print(f"data: {args.photos} photos in {len(photos)} shards; payloads of 1/16/100 KB; {small_shards},000 small JPEGs. "
          f"Best of {args.repeats}; samples/s\n")

    print("1. raw grouped samples, no decoding (wall clock; this process's CPU time beside it)")
    raw = {}
    for label, files in (("photos, ~50 KB", photos), *((f"{kb} KB payloads", f) for kb, f in payloads.items())):
        total = count_samples(wd.ShardLister(files).load_tar().group_by_key())
        index = places_index(files, os.path.join(args.data, "index", f"{label.split(',')[0].replace(' ', '-')}.json"))
        makes = {
            f"ours, {label}: list_shards().load_tar().group_by_key()":
                lambda f=files: wd.ShardLister(f).load_tar().group_by_key(),
            f"ours, {label}: ExactEpochs(index with member places)": lambda i=index: exact_epochs(i, shuffle=False),
            f"ours, {label}: ExactEpochs(index with member places, views=True)":
                lambda i=index: exact_epochs(i, shuffle=False, views=True),
            f"webdataset, {label}: WebDataset(shardshuffle=False)": lambda f=files: wds.WebDataset(f, shardshuffle=False),
        }
        if litdata is not None:
            folder = litdata_copy(files, os.path.join(args.data, "litdata", f"{label.split(',')[0].replace(' ', '-')}-{total}"))
            makes[f"litdata, {label}: StreamingDataset (its own chunk format)"] = lambda d=folder: litdata.StreamingDataset(d)
        makes[f"bare loop by member places: a read per MB, a view per member (no dicts), {label}"] = \
            lambda i=index: bare_places(i, dicts=False)
        makes[f"bare loop by member places in a minimal pipe, a dict per sample, {label}"] = \
            lambda i=index: bare_places(i, dicts=True)
        makes[f"reading the tar files whole, {label}"] = lambda f=files, n=total: read_whole(f, n)
        # In turns: the ratios to reading whole are targets, and the machine's speed moves.
        rates = list(table.interleaved(makes, expect=total, repeats=turns).values())
        ours, placed, views, theirs = rates[:4]
        lit = rates[4] if litdata is not None else None
        raw[label] = (ours, placed, views, theirs, lit, *rates[-3:])

    jpgs = [s["jpg"] for s in wd.ShardLister(photos).load_tar().group_by_key()]
    print("\n2. vision, one process (wall clock, one thread): bytes -> 224x224 uint8 crops, batches of 64")
    one = {}
    for name, transform, train in (("eval", EVAL, False), ("train", TRAIN, True)):
        bare = row(f"{name}: bare loop, torchvision decode_jpeg + transform", bare_vision(jpgs, transform, 1))
        ours = row(f"{name}: ours, decode_batches(transform=...)", lambda t=transform: ours_vision(photos, t, 0))
        theirs = row(f"{name}: webdataset, decode('pil') + torchvision PIL transform",
                     lambda t=train: webdataset_vision(photos, t))
        one[name] = (ours, bare, theirs)

    print("\n3. vision, two cores (wall clock); the rows of each transform timed in turn")
    table.cpu = False
    two = {}
    fresh = {
        "DataLoader(num_workers=2)": lambda: DataLoader(ours_vision(photos, EVAL, 0), batch_size=None, num_workers=2),
    }
    if DataLoader2 is not None:
        fresh["DataLoader2 + MultiProcessingReadingService(2)"] = (
            lambda: through_dataloader2(ours_vision(photos, EVAL, 0), 2))
    loader_rates = {}
    with started_loaders(photos) as started:
        for name, transform in (("eval", EVAL), ("train", TRAIN)):
            ceiling_row = f"{name}: bare loop in 2 threads (the ceiling)"
            ours_row = f"{name}: ours, one process, decode_batches(num_threads=2, transform=...)"
            makes = {ceiling_row: bare_vision(jpgs, transform, 2), ours_row: lambda t=transform: ours_vision(photos, t, 2)}
            if name == "eval":
                makes.update({f"eval: ours under {n}, first epoch (workers start)": m for n, m in fresh.items()})
                makes.update({f"eval: ours under {n}, later epochs (workers kept)": lambda n=n: started[n]
                              for n in started})
            # The machine's speed moves 20% within seconds (CPU time of the same loop): 5 turns at least.
            rates = table.interleaved(makes, expect=len(jpgs), repeats=turns)
            two[name] = (rates[ours_row], rates[ceiling_row])
            if name == "eval":
                loader_rates = {n: (rates[f"eval: ours under {n}, first epoch (workers start)"],
                                    rates[f"eval: ours under {n}, later epochs (workers kept)"]) for n in fresh}
    wds_dl = row("eval: webdataset recipe under DataLoader(num_workers=2)",
                 lambda: DataLoader(webdataset_vision(photos, False), batch_size=None, num_workers=2))
    # One start is noise (200-420 ms for the same loader): the median of 5, loaders interleaved.
    starts: dict[str, list[float]] = {name: [] for name in fresh}
    for _ in range(5):
        for name, make in fresh.items():
            starts[name].append(first_batch_seconds(make))
    first = {name: statistics.median(seconds) for name, seconds in starts.items()}
    for name, seconds in first.items():
        print(f"  time to the first batch, {name:<52} {seconds * 1000:8.0f} ms (median of 5)")

    doors = front_door_rows(args, photos, jpgs, turns)

    print("\n4. uniform small images (256x256 JPEG), decoded into the batch (wall clock)")
    table.cpu = True
    small_jpgs = [s["jpg"] for s in wd.ShardLister(small_files).load_tar().group_by_key()]

    def bare_small():
        for jpg in small_jpgs:
            decode_image(jpg, "torchrgb8")
            yield jpg

    bare_one = row("bare decoder: decode_image(jpg, 'torchrgb8')", lambda: bare_small())
    ours_one = row("ours: decode_batches('torchrgb8', batch_size=64)",
                   lambda: wd.ShardLister(small_files).load_tar().group_by_key()
                   .decode_batches("torchrgb8", batch_size=BATCH).to_tuple("jpg", "cls"))
    table.cpu = False

    def bare_small_threads():
        with ThreadPoolExecutor(2) as pool:
            yield from pool.map(lambda j: decode_image(j, "torchrgb8"), small_jpgs, chunksize=16)

    bare_two = row("bare decoder in 2 threads", bare_small_threads)
    ours_two = row("ours: decode_batches(num_threads=2)",
                   lambda: wd.ShardLister(small_files).load_tar().group_by_key()
                   .decode_batches("torchrgb8", batch_size=BATCH, num_threads=2).to_tuple("jpg", "cls"))

    print("\n5. shuffled raw samples, photos (wall clock), each allocator in a fresh process")
    shuffled = {}
    for allocator in ("default", "keep_freed_memory"):
        run = subprocess.run([sys.executable, __file__, "--data", args.data, "--photos", str(args.photos),
                              "--repeats", str(args.repeats), "--shuffled", allocator],
                             capture_output=True, text=True, check=True)
        rates = json.loads(run.stdout.splitlines()[-1])
        for name, rate in rates.items():
            print(f"  {allocator}: {name:<58} {rate:>10,.0f}")
        shuffled[allocator] = tuple(rates.values())

    print("\nratios [targets]")
    print("  raw: ours = load_tar().group_by_key(); places = ExactEpochs by member places; views = the same, "
          "views=True")
    for label, (ours, placed, views, theirs, lit, bare, bare_pipe, whole) in raw.items():
        x_target = " [>= 10x]" if label in ("1 KB payloads", "16 KB payloads") else ""
        whole_target = {"photos, ~50 KB": " [>= 80%]", "100 KB payloads": " [>= 75%]"}.get(label, "")
        print(f"  raw, {label:<16} / webdataset: ours {ours / theirs:4.1f}x{x_target}, places {placed / theirs:4.1f}x, "
              f"views {views / theirs:4.1f}x; / reading whole: ours {ours / whole:4.0%}, places {placed / whole:4.0%}, "
              f"views {views / whole:4.0%}{whole_target}")
        print(f"  raw, {label:<16} floor / reading whole: bare loop {bare / whole:4.0%}, in a minimal pipe with "
              f"dicts {bare_pipe / whole:4.0%}; views / that pipe {views / bare_pipe:4.0%}")
        if lit is not None:
            print(f"  raw, {label:<16} / litdata: ours {ours / lit:4.2f}x, places {placed / lit:4.2f}x, "
                  f"views {views / lit:4.2f}x [> 1]; litdata / reading whole {lit / whole:4.0%}")
    for name, (ours, bare, theirs) in one.items():
        print(f"  vision {name}, one process: ours / bare loop {ours / bare:4.0%} [>= 95%], "
              f"ours / webdataset {ours / theirs:4.1f}x")
    for name, (ours, ceiling) in two.items():
        print(f"  vision {name}, two cores: ours one process / 2-thread ceiling {ours / ceiling:4.0%} [>= 90%]")
    ceiling = two["eval"][1]
    for name, (first_epoch, later) in loader_rates.items():
        target = "85%" if "DataLoader2" in name else "90%"
        print(f"  vision eval, {name}: later epochs {later / ceiling:4.0%} of the ceiling [>= {target}], "
              f"first epoch {first_epoch / ceiling:4.0%}, first batch {first[name] * 1000:.0f} ms")
    if len(first) == 2:
        dl, dl2 = first.values()
        print(f"  first batch, DataLoader2 / DataLoader {dl2 / dl:4.2f} [<= 1.00]")
    print(f"  vision eval, two cores: ours one process / webdataset recipe {two['eval'][0] / wds_dl:4.1f}x")
    (default, default_exact, default_in_order, default_wds), (kept, kept_exact, kept_in_order, kept_wds) = (
        shuffled.values())
    print(f"  shuffled raw photos, keep_freed_memory / default allocator: shuffle_samples {kept / default:4.1f}x, "
          f"ExactEpochs {kept_exact / default_exact:4.1f}x, webdataset {kept_wds / default_wds:4.1f}x; "
          f"ours / webdataset {default / default_wds:4.1f}x (default), {kept / kept_wds:4.1f}x (kept)")
    print(f"  shuffled raw photos, ExactEpochs by places: in order / shuffled {default_in_order / default_exact:4.2f}x "
          f"(default allocator), {kept_in_order / kept_exact:4.2f}x (kept)")
    ceiling_wall, ceiling_cpu = next(iter(doors.values()))
    ours_doors = {name: rates for name, rates in doors.items() if name.startswith("ours")}
    peers = {name: rates for name, rates in doors.items() if not name.startswith(("ours", "bare"))}
    best_peer = max(peers.values(), default=(0.0, 1.0))
    for name, (wall, cpu) in ours_doors.items():
        print(f"  2 cores, {name.removeprefix('ours, ')}: {wall / ceiling_wall:4.0%} of the ceiling [>= 90%], "
              f"/ best peer {wall / best_peer[0]:4.2f}x [> 1]; CPU per sample / the ceiling's {cpu / ceiling_cpu:4.2f}, "
              f"/ the thriftiest peer's {cpu / min((c for _, c in peers.values()), default=cpu):4.2f}")
    for name, (wall, cpu) in peers.items():
        print(f"  2 cores, {name.split(',')[0]}: {wall / ceiling_wall:4.0%} of the ceiling, "
              f"CPU per sample / the ceiling's {cpu / ceiling_cpu:4.2f}")
    print(f"  small images: decode_batches / bare decoder {ours_one / bare_one:4.0%} (one process), "
          f"{ours_two / bare_two:4.0%} (2 threads)")


if __name__ == "__main__":
    main()
