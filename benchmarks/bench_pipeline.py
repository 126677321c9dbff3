"""Throughput of wds_datapipes against its peers and against the bare loops, on the same data, in one run.

    python -m benchmarks.bench_pipeline [--photos 2000] [--rounds 5] [--front-doors] [--quick]

Writes its data once (reused between runs; --data DIR):
- photos: 2,000 photo-like JPEGs of 300-500 px per side (quality 90, ~50 KB) with a label;
- uniform small images: 8 x 1,000 256x256 JPEGs (the data of earlier tables);
- raw payloads: 4,000 samples of random bytes of 1, 16 and 100 KB.

Then times, after a warm-up read (page cache), the rows of each table in turn, --rounds
times, the order reversed every other round (a slow spell of the shared machine falls on
all of them; the machine's speed moves 20% within seconds); a row is the MEDIAN of its
rounds, and a ratio the median of each round's pair with its range:
1. raw grouped samples (no decoding): ours (load_tar().group_by_key(), and ExactEpochs
   over an index with member places, which reads no tar header), webdataset, LitData (the
   same samples in its own chunk format, written once; where litdata is installed, as
   `make bench` does) and reading the same tar files whole (the ceiling of any reader),
   per member size; with them the floor of reading by member places: a bare loop of reads
   and slices, and the same yielding a dict per sample from a minimal pipe
   (benchmarks/raw_reading.py);
2. vision, one process, one thread: bytes -> 224x224 uint8 crops in batches of 64, for
   evaluation (resize the short side to 256, centre crop) and training (random-resized
   crop + flip): the bare loop (torchvision.io.decode_jpeg + the transform over bytes in
   memory), ours (decode_batches(..., transform=...)), webdataset's usual recipe
   (decode("pil") + torchvision's PIL transforms) (benchmarks/vision_loops.py);
3. vision, two cores (wall time): the bare loop in 2 threads (the ceiling), ours in one
   process with 2 threads, ours under DataLoader(num_workers=2) and DataLoader2 + our
   MultiProcessingReadingService(2) (the same per-worker pipeline): a first epoch of a new
   loader (its workers start) and a later epoch of one whose workers are kept;
   webdataset's recipe under DataLoader(num_workers=2); and the time to each loader's
   first batch (the loaders in turn, at least 5 starts each);
3b. every front door of ours beside webdataset, wids and LitData on 2 cores
   (benchmarks/front_doors.py): the ceiling, ours in one process, under DataLoader
   (decode_batches, and the generic decode("torchrgb8").map_fields(...) recipe),
   DataLoader2 and StatefulDataLoader, and the peers decoding and cropping with the
   ceiling's decoder and transform, each epoch timed from building its loader: medians of
   the wall clock and of CPU seconds per 1,000 samples (this process and its workers);
4. uniform small images: decode_batches into the batch (no transform) against the bare
   decoder, in one and two threads;
5. shuffled raw samples (photos): shuffle_samples(1000), ExactEpochs' shuffle (and its
   in-order read) and webdataset's shuffle(1000), each allocator in a fresh process: glibc's
   default, and after wd.keep_freed_memory() (ratios there are of the two processes' medians).
Prints samples/s by the wall clock (what a user waits for; this process's CPU time beside it
where the work is this process's) and the ratios the goals name, from the wall clock.
``--front-doors`` runs section 3b alone; ``--quick`` (64 photos, fewer samples elsewhere, one
round, data in DATA-quick) proves that every section runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import warnings
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.utils.data import DataLoader

warnings.filterwarnings("ignore", message=r"(?s).*'datapipes', 'dataloader2' modules are deprecated")

import wds_datapipes as wd
from benchmarks.front_doors import CEILING, front_doors, time_doors
from benchmarks.harness import (
    PROCESS_CLOCK,
    Bench,
    Ratio,
    Timings,
    in_turn,
    median,
    python_module,
    time_in_turn,
)
from benchmarks.raw_reading import litdata, litdata_copy, places_index, raw_paths, shuffled_paths
from benchmarks.shards import make_jpeg_shards, make_payload_shards, make_photo_shards
from benchmarks.vision_loops import (
    BATCH,
    EVAL,
    TRAIN,
    DataLoader2,
    bare_vision,
    count_samples,
    counted,
    first_batch_seconds,
    ours_vision,
    started_loaders,
    through_dataloader2,
    webdataset_vision,
)
from wds_datapipes.decoding.images import decode_image


def show(timings: Timings, cpu: bool) -> None:
    """Each row's median samples/s by the wall clock; with ``cpu``, by this process's CPU time beside it."""
    for name in timings.runs:
        beside = f"   (CPU time {timings.rate(name, of='cpu'):>10,.0f})" if cpu else ""
        print(f"  {name:<70} {timings.rate(name):>10,.0f}{beside}")


def shuffled_rates(args) -> dict[str, float]:
    """Section 5 in this (fresh) process: shuffled raw photos, with the allocator ``args.shuffled``."""
    photos = make_photo_shards(os.path.join(args.data, "photos"), args.photos)
    index = places_index(photos, os.path.join(args.data, "index", "photos.json"))
    count_samples(wd.ShardLister(photos).load_tar())  # the page cache
    if args.shuffled == "keep_freed_memory":
        wd.keep_freed_memory()
    paths = {name: counted(make) for name, make in shuffled_paths(photos, index).items()}
    timings = time_in_turn(paths, args.rounds, clock=PROCESS_CLOCK)
    return {name: timings.rate(name) for name in paths}


def section_raw(args, photos: list[str], payloads: dict[int, list[str]]) -> dict[str, Timings]:
    print("1. raw grouped samples, no decoding (wall clock; this process's CPU time beside it)")
    raw = {}
    for label, files in (("photos, ~50 KB", photos), *((f"{kb} KB payloads", f) for kb, f in payloads.items())):
        total = count_samples(wd.ShardLister(files).load_tar().group_by_key())
        short = label.split(",")[0].replace(" ", "-")
        index = places_index(files, os.path.join(args.data, "index", f"{short}.json"))
        lit = None if litdata is None else litdata_copy(files, os.path.join(args.data, "litdata", f"{short}-{total}"))
        paths = {name: counted(make) for name, make in raw_paths(label, files, index, total, lit).items()}
        raw[label] = time_in_turn(paths, args.rounds, clock=PROCESS_CLOCK, expect=total)
        show(raw[label], cpu=True)
    return raw


def section_vision(args, photos: list[str], jpgs: list[bytes]) -> tuple[dict, dict, dict]:
    print("\n2. vision, one process (wall clock, one thread): bytes -> 224x224 uint8 crops, batches of 64")
    one = {}
    for name, transform, train in (("eval", EVAL, False), ("train", TRAIN, True)):
        paths = {f"{name}: bare loop, torchvision decode_jpeg + transform": counted(bare_vision(jpgs, transform, 1)),
                 f"{name}: ours, decode_batches(transform=...)": counted(lambda t=transform: ours_vision(photos, t, 0)),
                 f"{name}: webdataset, decode('pil') + torchvision PIL transform":
                     counted(lambda t=train: webdataset_vision(photos, t))}
        one[name] = time_in_turn(paths, args.rounds, clock=PROCESS_CLOCK, expect=len(jpgs))
        show(one[name], cpu=True)

    print("\n3. vision, two cores (wall clock); the rows of each transform timed in turn")
    fresh = {"DataLoader(num_workers=2)": lambda: DataLoader(ours_vision(photos, EVAL, 0), batch_size=None,
                                                             num_workers=2)}
    if DataLoader2 is not None:
        fresh["DataLoader2 + MultiProcessingReadingService(2)"] = (
            lambda: through_dataloader2(ours_vision(photos, EVAL, 0), 2))
    two = {}
    with started_loaders(photos) as started:
        for name, transform in (("eval", EVAL), ("train", TRAIN)):
            makes = {f"{name}: bare loop in 2 threads (the ceiling)": bare_vision(jpgs, transform, 2),
                     f"{name}: ours, one process, decode_batches(num_threads=2, transform=...)":
                         lambda t=transform: ours_vision(photos, t, 2)}
            if name == "eval":
                makes.update({f"eval: ours under {n}, first epoch (workers start)": m for n, m in fresh.items()})
                makes.update({f"eval: ours under {n}, later epochs (workers kept)": lambda n=n: started[n]
                              for n in started})
                makes["eval: webdataset recipe under DataLoader(num_workers=2)"] = (
                    lambda: DataLoader(webdataset_vision(photos, False), batch_size=None, num_workers=2))
            two[name] = time_in_turn({n: counted(m) for n, m in makes.items()}, args.rounds, expect=len(jpgs))
            show(two[name], cpu=False)
    starts: dict[str, list[float]] = {name: [] for name in fresh}  # one start is noise: 200-420 ms for the same loader
    for _, name in in_turn(args.rounds if args.quick else max(args.rounds, 5), list(fresh)):
        starts[name].append(first_batch_seconds(fresh[name]))
    for name, seconds in starts.items():
        print(f"  time to the first batch, {name:<52} {median(seconds) * 1000:8.0f} ms (median of {len(seconds)})")
    return one, two, starts


def section_small(args, small_files: list[str]) -> tuple[Timings, Timings]:
    print("\n4. uniform small images (256x256 JPEG), decoded into the batch (wall clock)")
    small_jpgs = [s["jpg"] for s in wd.ShardLister(small_files).load_tar().group_by_key()]

    def bare_small():
        for jpg in small_jpgs:
            decode_image(jpg, "torchrgb8")
            yield jpg

    def bare_small_threads():
        with ThreadPoolExecutor(2) as pool:
            yield from pool.map(lambda j: decode_image(j, "torchrgb8"), small_jpgs, chunksize=16)

    def ours(threads: int):
        return lambda: (wd.ShardLister(small_files).load_tar().group_by_key()
                        .decode_batches("torchrgb8", batch_size=BATCH, num_threads=threads).to_tuple("jpg", "cls"))

    one = time_in_turn({"bare decoder: decode_image(jpg, 'torchrgb8')": counted(bare_small),
                        "ours: decode_batches('torchrgb8', batch_size=64)": counted(ours(0))},
                       args.rounds, clock=PROCESS_CLOCK, expect=len(small_jpgs))
    show(one, cpu=True)
    two = time_in_turn({"bare decoder in 2 threads": counted(bare_small_threads),
                        "ours: decode_batches(num_threads=2)": counted(ours(2))}, args.rounds, expect=len(small_jpgs))
    show(two, cpu=False)
    return one, two


def section_shuffled(args) -> dict[str, dict[str, float]]:
    print("\n5. shuffled raw samples, photos (wall clock), each allocator in a fresh process")
    shuffled = {}
    for allocator in ("default", "keep_freed_memory"):
        command, env = python_module("benchmarks.bench_pipeline", "--data", args.data, "--photos", str(args.photos),
                                     "--rounds", str(args.rounds), "--shuffled", allocator,
                                     *(["--quick"] if args.quick else []))
        run = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        shuffled[allocator] = json.loads(run.stdout.splitlines()[-1])
        for name, rate in shuffled[allocator].items():
            print(f"  {allocator}: {name:<58} {rate:>10,.0f}")
    return shuffled


def front_door_rows(args, photos: list[str], jpgs: list[bytes]) -> Timings:
    print(f"\n3b. every front door on 2 cores, eval crops, epochs timed from building the loader; medians of "
          f"{args.rounds} rounds in turn")
    sizes = [count_samples(wd.ShardLister([f]).load_tar().group_by_key()) for f in photos]
    lit_photos = None if litdata is None else litdata_copy(
        photos, os.path.join(args.data, "litdata", f"photos-{len(jpgs)}"))
    return time_doors(front_doors(photos, jpgs, sizes, lit_photos), expect=len(jpgs), rounds=args.rounds)


def main(argv: list[str] | None = None) -> None:
    bench = Bench("bench_pipeline", __doc__, peers=("webdataset", "wids", "litdata"), rounds=5)
    bench.parser.add_argument("--photos", type=int, default=2000)
    bench.parser.add_argument("--front-doors", action="store_true",
                              help="only section 3b (every front door beside the peers)")
    bench.parser.add_argument("--shuffled", choices=["default", "keep_freed_memory"],
                              help="only section 5's rows with this allocator, as JSON (main runs it in a fresh process)")
    args = bench.parse(argv)
    if args.quick:
        args.photos = min(args.photos, 64)
    torch.set_num_threads(1)  # the loaders' own threads and processes are what is measured
    if args.shuffled:
        print(json.dumps(shuffled_rates(args)))
        return
    photos = make_photo_shards(os.path.join(args.data, "photos"), args.photos)
    count_samples(wd.ShardLister(photos).load_tar())  # warm the page cache
    jpgs = [s["jpg"] for s in wd.ShardLister(photos).load_tar().group_by_key()]
    if args.front_doors:
        with bench.results(args, variant="front-doors"):
            print(f"data: {args.photos} photos in {len(photos)} shards; samples/s by the wall clock\n")
            front_door_ratios(bench, front_door_rows(args, photos, jpgs))
        return
    payloads = {kb: make_payload_shards(os.path.join(args.data, "payload"), kb, count=200 if args.quick else 4000,
                                        per_shard=50 if args.quick else 500) for kb in (1, 16, 100)}
    small_shards = 2 if args.quick else 8
    small = make_jpeg_shards(args.data, shards=small_shards, per_shard=100 if args.quick else 1000)
    small_files = [small.replace(f"{{000000..{small_shards - 1:06d}}}", f"{i:06d}") for i in range(small_shards)]
    for files in (*payloads.values(), small_files):
        count_samples(wd.ShardLister(files).load_tar())  # warm the page cache
    with bench.results(args):
        print(f"data: {args.photos} photos in {len(photos)} shards; payloads of 1/16/100 KB; "
              f"{len(small_files)} shards of small JPEGs. Medians of {args.rounds} rounds; samples/s\n")
        raw = section_raw(args, photos, payloads)
        one, two, starts = section_vision(args, photos, jpgs)
        doors = front_door_rows(args, photos, jpgs)
        small_one, small_two = section_small(args, small_files)
        shuffled = section_shuffled(args)
        print("\nratios, the median of the rounds' pairs (range) [goals]")
        raw_ratios(bench, raw)
        vision_ratios(bench, one, two, starts)
        shuffled_ratios(bench, shuffled)
        front_door_ratios(bench, doors)
        names = list(small_one.runs), list(small_two.runs)
        bench.ratio("small images, one process: decode_batches / bare decoder",
                    small_one.ratio(names[0][1], names[0][0]), percent=True)
        bench.ratio("small images, 2 threads: decode_batches / bare decoder",
                    small_two.ratio(names[1][1], names[1][0]), percent=True)


def raw_ratios(bench: Bench, raw: dict[str, Timings]) -> None:
    """Ours (through tar headers), places (ExactEpochs by member places) and views (the same,
    views=True) against webdataset, reading whole, the floor and LitData, for each member size."""
    for label, timings in raw.items():
        names = list(timings.runs)
        ours, places, views, theirs = names[:4]
        lit = names[4] if litdata is not None else None
        bare, pipe, whole = names[-3:]
        x_goal = ">= 10" if label in ("1 KB payloads", "16 KB payloads") else None
        whole_goal = {"photos, ~50 KB": ">= 80%", "100 KB payloads": ">= 75%"}.get(label)
        for short, name in (("ours", ours), ("places", places), ("views", views)):
            bench.ratio(f"raw, {label}: {short} / webdataset", timings.ratio(name, theirs),
                        x_goal if short == "ours" else None)
        for short, name in (("ours", ours), ("places", places), ("views", views)):
            bench.ratio(f"raw, {label}: {short} / reading whole", timings.ratio(name, whole),
                        whole_goal if short == "views" else None, percent=True)
        bench.ratio(f"raw, {label}: floor, bare loop / reading whole", timings.ratio(bare, whole), percent=True)
        bench.ratio(f"raw, {label}: floor, minimal pipe with dicts / reading whole", timings.ratio(pipe, whole),
                    percent=True)
        bench.ratio(f"raw, {label}: views / that minimal pipe", timings.ratio(views, pipe), percent=True)
        if lit is not None:
            for short, name in (("ours", ours), ("places", places), ("views", views)):
                bench.ratio(f"raw, {label}: {short} / litdata", timings.ratio(name, lit),
                            "> 1" if short == "views" else None)
            bench.ratio(f"raw, {label}: litdata / reading whole", timings.ratio(lit, whole), percent=True)


def vision_ratios(bench: Bench, one: dict[str, Timings], two: dict[str, Timings], starts: dict) -> None:
    for name, timings in one.items():
        bare, ours, theirs = timings.runs
        bench.ratio(f"vision {name}, one process: ours / bare loop", timings.ratio(ours, bare), ">= 95%", percent=True)
        bench.ratio(f"vision {name}, one process: ours / webdataset", timings.ratio(ours, theirs))
    for name, timings in two.items():
        ceiling, ours = list(timings.runs)[:2]
        bench.ratio(f"vision {name}, two cores: ours one process / 2-thread ceiling", timings.ratio(ours, ceiling),
                    ">= 90%", percent=True)
    timings = two["eval"]
    ceiling = "eval: bare loop in 2 threads (the ceiling)"
    for loader, seconds in starts.items():
        goal = ">= 85%" if "DataLoader2" in loader else ">= 90%"
        bench.ratio(f"vision eval, {loader}: later epochs / the ceiling",
                    timings.ratio(f"eval: ours under {loader}, later epochs (workers kept)", ceiling), goal, percent=True)
        bench.ratio(f"vision eval, {loader}: first epoch / the ceiling",
                    timings.ratio(f"eval: ours under {loader}, first epoch (workers start)", ceiling), percent=True,
                    note=f"first batch {median(seconds) * 1000:.0f} ms")
    if len(starts) == 2:
        dl, dl2 = starts.values()
        bench.ratio("first batch, DataLoader2 / DataLoader (seconds)", Ratio.of(b / a for a, b in zip(dl, dl2)),
                    "<= 1.00")
    bench.ratio("vision eval, two cores: ours one process / webdataset recipe under DataLoader",
                timings.ratio("eval: ours, one process, decode_batches(num_threads=2, transform=...)",
                              "eval: webdataset recipe under DataLoader(num_workers=2)"))


def shuffled_ratios(bench: Bench, shuffled: dict[str, dict[str, float]]) -> None:
    (default, default_exact, default_in_order, default_wds), (kept, kept_exact, kept_in_order, kept_wds) = (
        list(rates.values()) for rates in shuffled.values())
    for label, a, b in (("shuffle_samples", kept, default), ("ExactEpochs", kept_exact, default_exact),
                        ("webdataset", kept_wds, default_wds)):
        bench.ratio(f"shuffled raw photos, keep_freed_memory / default allocator: {label}", a / b)
    bench.ratio("shuffled raw photos, shuffle_samples / webdataset (default allocator)", default / default_wds)
    bench.ratio("shuffled raw photos, shuffle_samples / webdataset (kept)", kept / kept_wds)
    bench.ratio("shuffled raw photos, ExactEpochs in order / shuffled (default allocator)",
                default_in_order / default_exact)
    bench.ratio("shuffled raw photos, ExactEpochs in order / shuffled (kept)", kept_in_order / kept_exact)


def front_door_ratios(bench: Bench, doors: Timings) -> None:
    ours = [name for name in doors.runs if name.startswith("ours")]
    peers = [name for name in doors.runs if not name.startswith(("ours", "bare"))]
    best_peer = max(peers, key=doors.rate, default=None)
    thriftiest = min(peers, key=doors.cpu_per, default=None)
    for name in ours:
        short = name.removeprefix("ours, ")
        bench.ratio(f"2 cores, {short}: / the ceiling", doors.ratio(name, CEILING), ">= 90%", percent=True)
        if best_peer is not None:
            bench.ratio(f"2 cores, {short}: / best peer ({best_peer.split(',')[0]})", doors.ratio(name, best_peer),
                        "> 1")
        bench.ratio(f"2 cores, {short}: CPU per sample, the ceiling's / its", doors.ratio(name, CEILING, of="cpu"))
        if thriftiest is not None:
            bench.ratio(f"2 cores, {short}: CPU per sample, the thriftiest peer's / its",
                        doors.ratio(name, thriftiest, of="cpu"))
    for name in peers:
        bench.ratio(f"2 cores, {name.split(',')[0]}: / the ceiling", doors.ratio(name, CEILING), percent=True)
        bench.ratio(f"2 cores, {name.split(',')[0]}: CPU per sample, the ceiling's / its",
                    doors.ratio(name, CEILING, of="cpu"))


if __name__ == "__main__":
    main()
