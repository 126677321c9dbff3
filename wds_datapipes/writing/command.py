"""``python -m wds_datapipes create``: folders, manifests or shards in, indexed shards out.

The command's arguments, its input readers (:mod:`.sources`), a progress bar with
samples/s and bytes/s, and the report at the end (every skipped input with its reason).
Rank and world come from ``--rank``/``--world``, else from the launcher's environment
(torchrun, SLURM: :func:`~wds_datapipes.topology.launcher_rank_world`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator

from ..handlers import ignore_and_continue, reraise_exception
from ..storage.store_options import add_store_arguments, store_of_arguments
from ..topology import launcher_rank_world
from .compress import compression_of

# The readers and the writer are imported when the command runs: ``create --help`` starts without
# numpy (tests/test_startup.py).

LAYOUTS = ("auto", "folder", "imagefolder", "manifest", "parquet", "shards")
_LISTED = 1000  # the most left-out files the report names one by one


def add_create_command(commands) -> None:
    """Adds ``create`` to the command line's subcommands."""
    create = commands.add_parser(
        "create", help="write indexed shards from folders, manifests or shards",
        description="Convert a folder tree (files grouped by basename, e.g. images/*.jpg + annotations/*.png), "
        "an ImageFolder tree (subfolders are classes), a JSONL/CSV manifest, or existing shards (reshard, "
        "filter by key) into tar shards and their index (index.json with sample offsets and member places) in "
        "one pass. Deterministic; an interrupted run continues where it stopped when run again.",
    )
    create.add_argument("sources", nargs="+", metavar="SOURCE", help="a folder, a manifest (.jsonl/.csv), or shard URLs")
    create.add_argument("-o", "--output", required=True, help="the shards' pattern, e.g. out/train-%%06d.tar")
    create.add_argument("--layout", choices=LAYOUTS, default="auto", help="how to read SOURCE (default: guess)")
    create.add_argument("--maxcount", type=int, help="most samples per shard")
    create.add_argument("--maxsize", type=_size, help="most bytes per shard (e.g. 1G, 500M)")
    create.add_argument("-j", "--workers", type=int, default=1, help="worker processes (default 1)")
    create.add_argument("--index", help="the index to write (default: index.json beside the shards)")
    create.add_argument("--fields", help="a list file of more fields per key ('key v1 v2 ...', # comments)")
    create.add_argument("--field-names", default="cls", help="names of the list file's columns after the key")
    create.add_argument("--extensions", help="only files with these suffixes (comma-separated): the folder layout; "
                        "imagefolder: these instead of torchvision's image extensions")
    create.add_argument("--require", default="", help="fields every sample must have (comma-separated)")
    create.add_argument("--keys", help="shards layout: only keys matching this glob")
    create.add_argument("--where", action="append", default=[], metavar="TEST",
                        help="shards layout: only samples with field NAME, or NAME=VALUE, NAME!=VALUE (repeatable)")
    create.add_argument("--select", help="shards layout: only these fields (comma-separated)")
    create.add_argument("--shuffle-seed", type=int, help="shuffle the whole input with this seed (a local dSort: "
                        "two passes through temporary files beside the output)")
    create.add_argument("--shuffle-memory", type=_size, default=1 << 30,
                        help="the most input bytes one shuffle bucket holds in memory (default 1G)")
    create.add_argument("--columns", help="parquet layout: the columns to write, each NAME or NAME:FIELD "
                        "(e.g. jpg,caption:txt,image:png; default: all)")
    create.add_argument("--key-column", help="parquet layout: the key column (default: key or __key__, "
                        "else <file>/<row>)")
    create.add_argument("--skip-bad", action="store_true", help="skip bad inputs (listed at the end) "
                        "instead of stopping at the first")
    create.add_argument("--allow-outside", action="store_true", help="take files that manifest or Parquet paths, "
                        "or symbolic links in a folder, name outside the input's folder (refused by default: "
                        "see docs/security.md)")
    create.add_argument("--rank", type=int, help="this machine's rank (default: torchrun's or SLURM's)")
    create.add_argument("--world", type=int, help="how many machines write (default: torchrun's or SLURM's)")
    create.add_argument("--join", action="store_true", help="only join the ranks' finished records into the index")
    create.add_argument("--restart", action="store_true",
                        help="start over: remove the shards an earlier run left in the output folder (only the "
                             "writer's own, with their .part files: a file named like a shard that the writer did "
                             "not leave is refused, never removed), then write everything again; refused at an "
                             "object store that holds earlier shards (nothing there is deleted)")
    create.add_argument("--compress", choices=("gzip", "bzip2", "xz", "zstd"),
                        help="compress the shards (default: as the output's suffix says: .tar.gz, .tar.zst, ...)")
    create.add_argument("--max-field-bytes", type=_size, help="a field (file) bigger than this is a bad input")
    create.add_argument("--mtime", type=_when, metavar="WHEN",
                        help="the members' and shard files' modification time: seconds since 1970, or a date "
                             "(2024-06-01, 2024-06-01T12:00Z; UTC unless it says). Default: $SOURCE_DATE_EPOCH, "
                             "else 0 (1970), which a scratch file system's purge by modification time takes for "
                             "old: give a date of your own (the dataset's release, the run's first day), the "
                             "same on a resume; see docs/writing-resume.md")
    create.add_argument("--no-fsync", action="store_true", help="do not sync shards to disk before renaming")
    create.add_argument("--spool", help="where shards for ais:// (s3://, ...) are built before their upload "
                        "(default: the temp folder)")
    create.add_argument("--uploads", type=int, default=2, help="uploads at once to a remote -o (default 2)")
    create.add_argument("--quiet", action="store_true", help="no progress bar")
    add_store_arguments(create)
    create.set_defaults(run=run_create)


def _size(text: str) -> int:
    units = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
    text = text.strip().lower().removesuffix("b")
    return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)


def _when(text: str) -> int:
    """Whole seconds since 1970 from ``text``: a number of them, or an ISO 8601 date or date
    and time (UTC where it names no zone)."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    from datetime import datetime, timezone

    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither seconds since 1970 nor a date "
                                         "(2024-06-01, 2024-06-01T12:00:00Z)") from None
    return int((when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)).timestamp())


def _source_date_epoch() -> int:
    """The reproducible-builds convention's ``SOURCE_DATE_EPOCH`` (seconds since 1970), else 0."""
    text = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not text:
        return 0
    if not text.isdigit():
        raise ValueError(f"SOURCE_DATE_EPOCH={text!r} is not a whole number of seconds since 1970")
    return int(text)


def _layout(args: argparse.Namespace) -> str:
    if args.layout != "auto":
        return args.layout
    first = args.sources[0]
    if first.endswith((".jsonl", ".json", ".csv")):
        return "manifest"
    if first.endswith((".parquet", ".parq")) or (os.path.isdir(first) and any(
            name.endswith((".parquet", ".parq")) for name in os.listdir(first))):
        return "parquet"
    if not os.path.isdir(first) or any(name.endswith(".tar") or compression_of(name)
                                       for name in os.listdir(first)):
        return "shards"
    entries = [e for e in os.scandir(first) if not e.name.startswith(".")]
    if entries and all(e.is_dir() for e in entries) and args.fields is None and args.extensions is None:
        subfolders = [os.listdir(e.path) for e in entries]
        if all(all(not os.path.isdir(os.path.join(e.path, n)) for n in names) for e, names in zip(entries, subfolders)):
            return "imagefolder"
    return "folder"


def _samples(args: argparse.Namespace, layout: str, store=None,
             left_out: list[str] | None = None) -> tuple[Iterator[dict], int | None]:
    """The input's samples, and how many there will be where that is cheap to know (for the ETA);
    ``left_out`` gets the files an ImageFolder tree holds that are not images."""
    from .parquet import parquet_rows, parquet_samples
    from .sources import (
        IMAGE_EXTENSIONS,
        folder_samples,
        imagefolder_samples,
        manifest_samples,
        shard_samples,
    )

    outside = args.allow_outside
    if layout == "parquet":
        columns = None if args.columns is None else [c for c in args.columns.split(",") if c]
        return (parquet_samples(args.sources, columns=columns, key=args.key_column, allow_outside=outside),
                parquet_rows(args.sources))
    if layout == "shards":
        select = None if args.select is None else [f.strip().lower() for f in args.select.split(",") if f.strip()]
        return shard_samples(args.sources, keys=args.keys, where=args.where, select=select, store=store), None
    if len(args.sources) != 1:
        raise ValueError(f"the {layout} layout reads one SOURCE, not {len(args.sources)}")
    source = args.sources[0]
    if layout == "manifest":
        return manifest_samples(source, allow_outside=outside), None
    extensions = [e.strip() for e in (args.extensions or "").split(",") if e.strip(" .")] or None
    if layout == "imagefolder":  # file names and sizes only: the bytes are read later
        listed = list(imagefolder_samples(source, extensions=extensions or IMAGE_EXTENSIONS, allow_outside=outside,
                                          left_out=left_out))
        return iter(listed), len(listed)
    names = [n for n in args.field_names.split(",") if n]
    listed = list(folder_samples(source, extensions=extensions, fields_file=args.fields, field_names=names,
                                 allow_outside=outside))
    return iter(listed), len(listed)


def _buckets(args: argparse.Namespace, layout: str) -> int:
    """How many buckets a shuffle takes so that one holds about ``--shuffle-memory`` bytes.
    A folder's or an ImageFolder tree's samples are listed in memory before the shuffle, and
    its buckets hold only their files' names: one bucket (their files' bytes are never in a
    bucket, and counting them would stat every file again, links to nothing included)."""
    if layout in ("folder", "imagefolder"):
        return 1
    return max(1, -(-_input_bytes(args, layout) // args.shuffle_memory))


def _input_bytes(args: argparse.Namespace, layout: str) -> int:
    """The input's size on disk (what a shuffle's buckets hold, about; compressed shards grow when read;
    a manifest's files are names in its buckets: the manifest's own size)."""
    from ..shards.openers import resolve_local
    from ..shards.url_specs import expand_url_spec

    if layout == "shards":
        urls = [u for spec in args.sources for e in expand_url_spec(spec) for u in resolve_local(e)]
        return sum(os.path.getsize(u) * (1 if u.endswith(".tar") else 4) for u in urls if os.path.exists(u))
    total = 0
    for source in args.sources:
        for folder, _, names in os.walk(source) if os.path.isdir(source) else [("", [], [source])]:
            total += sum(os.path.getsize(os.path.join(folder, n)) for n in names)
    return total


def run_create(args: argparse.Namespace) -> int:
    from .destination import is_remote, join_any
    from .reshuffle import shuffled
    from .writer import shards_folder, write_shards

    found = launcher_rank_world() or (0, 1)
    rank = args.rank if args.rank is not None else found[0]
    world = args.world if args.world is not None else found[1]
    index = args.index or os.path.join(shards_folder(args.output), "index.json")
    store = store_of_arguments(args)  # for the sources', the shards' and the index's object-store URLs
    if args.join:
        joined = join_any(index, world, args.spool, store)
        print(f"{index}: {len(joined)} shards, {joined.total} samples", file=sys.stderr)
        return 0
    mtime = args.mtime if args.mtime is not None else _source_date_epoch()
    layout = _layout(args)
    left_out: list[str] = []
    samples, total = _samples(args, layout, store, left_out)
    if args.shuffle_seed is not None:
        buckets = _buckets(args, layout)
        samples = shuffled(samples, args.shuffle_seed, buckets,
                           workdir=args.spool if is_remote(args.output) else shards_folder(args.output))
    with _Bar(args.quiet, total, world) as bar:
        report = write_shards(
            samples, args.output, maxcount=args.maxcount, maxsize=args.maxsize, index=index,
            workers=args.workers, handler=ignore_and_continue if args.skip_bad else reraise_exception,
            require=[n for n in args.require.split(",") if n], rank=rank, world=world, restart=args.restart,
            fsync=not args.no_fsync, progress=bar.advance, compression=args.compress,
            max_field_bytes=args.max_field_bytes, spool=args.spool, uploads=args.uploads, store=store,
            mtime=mtime)
    print(f"{layout} {' '.join(args.sources)} -> {args.output} (rank {rank} of {world})", file=sys.stderr)
    print(report.summary(), file=sys.stderr)
    if left_out:
        from .sources import IMAGE_EXTENSIONS

        taken = (f"--extensions {args.extensions}" if args.extensions else
                 f"torchvision's ImageFolder extensions: {' '.join(IMAGE_EXTENSIONS)}")
        print(f"left out {len(left_out)} file(s) or folder(s): hidden, beside the class folders, or not images "
              f"({taken}):", file=sys.stderr)
        print("".join(f"  left out {path}\n" for path in left_out[:_LISTED]), end="", file=sys.stderr)
        if len(left_out) > _LISTED:
            print(f"  ... and {len(left_out) - _LISTED} more", file=sys.stderr)
    if mtime == 0 and not is_remote(args.output):
        print("the shard files are dated 1970-01-01 (--mtime 0, the default): a purge of old files by modification "
              "time (scratch file systems) would take them for old; --mtime DATE dates them (docs/writing-resume.md)",
              file=sys.stderr)
    if report.index is not None:
        print(f"{index}: {len(report.index)} shards, {report.index.total} samples", file=sys.stderr)
    elif world > 1:
        print(f"when every rank has finished: python -m wds_datapipes create --join --world {world} "
              f"-o {args.output} {' '.join(args.sources)}", file=sys.stderr)
    return 0


class _Bar:
    """A tqdm bar of samples on stderr, where tqdm is installed: samples/s, MB/s, and the ETA
    where the input's size is known (``total`` samples: folders, Parquet footers)."""

    def __init__(self, quiet: bool, total: int | None = None, world: int = 1):
        self.bar = None
        self.bytes = 0
        if not quiet:
            try:
                from tqdm import tqdm

                share = None if total is None else -(-total // world)  # a rank's part, about
                self.bar = tqdm(unit="sample", file=sys.stderr, delay=1.0, leave=False, smoothing=0.1, total=share)
            except ImportError:
                pass

    def advance(self, samples: int, nbytes: int) -> None:
        self.bytes += nbytes
        if self.bar is not None:
            self.bar.update(samples)
            rate = self.bytes / max(self.bar.format_dict["elapsed"], 1e-9)
            self.bar.set_postfix_str(f"{rate / 1e6:.1f} MB/s", refresh=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()


__all__ = ["add_create_command", "run_create"]
