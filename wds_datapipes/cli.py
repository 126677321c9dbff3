"""The command line: ``python -m wds_datapipes index | inspect | verify | create | profile``.

- ``index URLS -o index.json``: count every shard's samples (and where each starts) into a
  shard index; several shards at a time, a progress bar, and a restart that skips the
  shards an interrupted run finished. ``--places`` also records where each member's bytes
  lie (see :mod:`wds_datapipes.epochs.places`).
- ``inspect index.json|URL``: what is in a dataset or a shard, like ``tar tv``: shards,
  samples, fields and their sizes.
- ``verify index.json``: every shard readable, its samples and size as the index says,
  keys unique; exit status 1 naming the shard and member otherwise. ``verify --cache``
  checks the local shard cache (``$WDS_CACHE_DIR``, or ``--cache-dir``): each complete
  copy's size and CRC-32 as downloaded, and that it is a whole tar; a bad copy is removed
  (it is fetched again). A directory that does not exist (or another user's): exit status 2.
- ``create SOURCE -o out/train-%06d.tar``: write shards and their index in one pass from
  folders, manifests or shards (:mod:`wds_datapipes.writing.command`).
- ``profile SHARDS --recipe NAME``: each stage alone and the pipeline whole with 1 and N
  loader workers, measured by ``wd.stats``; which stage limits (:mod:`wds_datapipes.tools.profile`).

Each takes ``--endpoint URL`` and ``--store-option KEY=VALUE`` for its ``s3://``, ``gs://``
and ``az://`` URLs (:mod:`wds_datapipes.storage.store_options`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from .storage.store_options import add_store_arguments, store_of_arguments
from .tools.profile import add_profile_command
from .writing.command import add_create_command

if TYPE_CHECKING:
    from .epochs.index import ShardIndex, ShardScan
    from .storage.cloud_settings import PipelineStores

# The verbs import what they use when they run: ``--help`` and the writer start without numpy or
# torch (tests/test_startup.py). The names this module has held (docs/layout.md) are found where
# they live, on first use.
_KEPT = {
    "ShardIndex": "epochs.index", "ShardScan": "epochs.index", "build_index": "epochs.index",
    "check_scan_against": "epochs.index", "scan_shard": "epochs.index", "ShardPlaces": "epochs.places",
    "WdsError": "errors", "group_members": "shards.grouping", "expand_url_spec": "shards.listing",
    "list_urls": "shards.openers", "open_shard": "shards.openers", "resolve_local": "shards.openers",
    "url_scheme": "shards.openers", "iter_tar_members": "tar",
}


def __getattr__(name: str):
    if name in _KEPT:
        return getattr(importlib.import_module(f"{__package__}.{_KEPT[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Runs the command line (``wds-datapipes``, ``python -m wds_datapipes``) on ``argv``
    (default: ``sys.argv[1:]``); returns the exit status."""
    parser = _parser(prog)
    args = parser.parse_args(argv)
    from .errors import WdsError

    try:
        return args.run(args)
    except (WdsError, OSError, ValueError, ImportError) as exn:  # ImportError: an extra not installed
        print(f"error: {exn}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    index = commands.add_parser(
        "index", help="write a shard index (samples per shard, sample offsets)",
        description="Count the samples of every shard (webdataset's key rule) and record where each sample "
        "starts, into a wids-format JSON index plus a binary offsets file beside it. An interrupted run "
        "continues where it stopped when run again with the same output (OUTPUT.partial holds its progress).",
    )
    index.add_argument("urls", nargs="+", metavar="URL",
                       help="shard URLs: brace patterns (train-{000..099}.tar), globs, directories, "
                       "http(s)://, ais://, or any scheme a plugin registers")
    index.add_argument("-o", "--output", required=True, help="the index file to write (e.g. index.json)")
    index.add_argument("-j", "--jobs", type=int, default=8, help="shards read at a time (default 8)")
    index.add_argument("--no-offsets", action="store_true", help="write no offsets file")
    index.add_argument("--places", action="store_true",
                       help="also record where each member's bytes lie in its shard (uncompressed shards whose "
                       "size and version are known): ExactEpochs then reads them without parsing tar headers, ~2x faster raw "
                       "(a remote shard once the shard cache holds it)")
    index.add_argument("--restart", action="store_true", help="ignore the progress of an interrupted run")
    index.add_argument("--quiet", action="store_true", help="no progress bar")
    add_store_arguments(index)
    index.set_defaults(run=_index)

    inspect = commands.add_parser(
        "inspect", help="show what a dataset or shard holds",
        description="For an index: its shards, samples, bytes, and the fields of the first samples. "
        "For a shard URL: its members (name and size, like tar tv) and a summary of its fields.",
    )
    inspect.add_argument("target", help="an index (.json) or a shard URL")
    inspect.add_argument("-n", "--samples", type=int, default=10, help="samples to list or sample (default 10)")
    inspect.add_argument("--shards", type=int, default=10, help="shards of an index to list (default 10)")
    add_store_arguments(inspect)
    inspect.set_defaults(run=_inspect)

    verify = commands.add_parser(
        "verify", help="check every shard against its index",
        description="Read every shard of an index: each must be a complete archive, hold the number of "
        "samples and bytes the index says (and the same sample offsets and member places), and have unique keys. "
        "Prints each problem with its shard and member, and exits with status 1 if there is any.",
    )
    verify.add_argument("index", nargs="?", help="the index file")
    verify.add_argument("--cache", action="store_true", help="check the local shard cache ($WDS_CACHE_DIR) too")
    verify.add_argument("--cache-dir", help="the shard cache to check (implies --cache)")
    verify.add_argument("-j", "--jobs", type=int, default=8, help="shards read at a time (default 8)")
    verify.add_argument("--across-shards", action="store_true",
                        help="also check that no key appears in two shards (holds every key in memory)")
    verify.add_argument("--allow-pipe", action="store_true", help="let the index's URLs be pipe: commands")
    add_store_arguments(verify)
    verify.set_defaults(run=_verify)
    add_create_command(commands)
    add_profile_command(commands)
    return parser


# ------------------------------------------------------------ index


def expand_urls(specs: Iterable[str], stores: PipelineStores | None = None) -> list[str]:
    """Shard URLs from what a user typed: braces, then what each scheme's back end lists
    (local globs and directories, an object store's glob or prefix: ``backend_for(url).list``),
    object-store URLs carrying ``stores`` (``--endpoint``, ``--store-option``) where given."""
    from .shards.listing import expand_url_spec
    from .shards.openers import list_urls
    from .storage.cloud_settings import with_stores

    return [listed for spec in specs for url in expand_url_spec(spec) for listed in list_urls(with_stores(url, stores))]


def _index(args: argparse.Namespace) -> int:
    from .epochs.index import ShardIndex, build_index
    from .errors import WdsError
    from .storage.cloud_settings import PipelineStores

    stores = PipelineStores.of(store_of_arguments(args))
    urls = expand_urls(args.urls, stores)
    if not urls:
        raise WdsError(f"no shard matched {args.urls}")
    listed = set(urls)  # once: a set per finished shard made a resume quadratic (30,000 shards: 93 s)
    if len(listed) != len(urls):
        raise WdsError("a shard is listed twice: " + next(u for u in urls if urls.count(u) > 1))
    partial = args.output + ".partial"
    done = {} if args.restart else {url: scan for url, scan in _read_partial(partial).items() if url in listed}
    if args.places:  # shards an earlier run indexed without places are scanned again
        done = {url: scan for url, scan in done.items() if scan.places is not None}
    if done:
        print(f"continuing an interrupted run: {len(done)} of {len(urls)} shards already indexed", file=sys.stderr)
    with _Progress(len(urls), len(done), quiet=args.quiet) as progress, open(partial, "a") as log:
        def record(scan: ShardScan) -> None:
            log.write(json.dumps(_scan_to_json(scan)) + "\n")
            log.flush()
            progress.advance(scan.nsamples)

        failed: dict[str, WdsError] = {}
        scans = build_index(urls, jobs=args.jobs, done=done,
                            on_scan=record, places=args.places, failed=failed, store=stores)
    if not scans:
        for error in failed.values():
            print(error, file=sys.stderr)
        raise WdsError(f"none of the {len(urls)} shards could be read; no index written")
    index = ShardIndex.from_scans(scans, relative_to=args.output)
    index.save(args.output, offsets=not args.no_offsets)
    print(f"{args.output}: {len(scans)} shards, {index.total} samples"
          + ("" if args.no_offsets or not index.has_offsets else ", with sample offsets")
          + _places_summary(index, args.places), file=sys.stderr)
    if failed:  # the readable ones are indexed; a run after they are mended scans only them
        for error in failed.values():
            print(error)
        print(f"{len(failed)} of {len(urls)} shards could not be read and are not in {args.output}; mend them "
              f"and run the same command again (it scans only those: {partial} holds the others)", file=sys.stderr)
        return 1
    os.remove(partial)
    return 0


def _places_summary(index: ShardIndex, asked: bool) -> str:
    if not asked:
        return ""
    placed = 0 if index.places is None else sum(index.places.has(i) for i in range(len(index)))
    return f", member places for {placed} of {len(index)} shards (uncompressed, of a known size and version)"


def _scan_to_json(scan: ShardScan) -> dict:
    return scan.to_json()


def _read_partial(path: str) -> dict[str, ShardScan]:
    from .epochs.index import ShardScan

    done: dict[str, ShardScan] = {}
    if not os.path.exists(path):
        return done
    with open(path) as lines:
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line cut by the interruption
            done[entry["url"]] = ShardScan.from_json(entry)
    return done


class _Progress:
    """A tqdm bar on stderr where tqdm is installed, else a line every few seconds."""

    def __init__(self, total: int, done: int, quiet: bool):
        self.total, self.done, self.samples, self.quiet = total, done, 0, quiet
        self.bar = None
        if not quiet:
            try:
                from tqdm import tqdm

                # delay: no bar for a run over in a moment; leave=False: no stale bar above an error
                self.bar = tqdm(total=total, initial=done, unit="shard", file=sys.stderr, delay=1.0, leave=False)
            except ImportError:
                pass

    def advance(self, samples: int) -> None:
        self.done += 1
        self.samples += samples
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(samples=self.samples, refresh=False)
        elif not self.quiet:
            print(f"{self.done}/{self.total} shards", file=sys.stderr)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()


# ------------------------------------------------------------ inspect


def _inspect(args: argparse.Namespace) -> int:
    if args.target.endswith(".json"):
        return _inspect_index(args)
    return _inspect_shard(args)


def _inspect_index(args: argparse.Namespace) -> int:
    from .epochs.index import ShardIndex

    index = ShardIndex.load(args.target, store=store_of_arguments(args))
    sizes = [s.filesize for s in index.shards if s.filesize is not None]
    print(f"index {args.target}: {len(index)} shards, {index.total} samples"
          + (f", {_bytes(sum(sizes))}" if sizes else "")
          + (", sample offsets: yes" if index.has_offsets else ", sample offsets: no"))
    if len(index):
        counts = index.sizes
        print(f"samples per shard: min {counts.min()}, mean {counts.mean():.1f}, max {counts.max()}")
    for i in range(min(args.shards, len(index))):
        info = index.shards[i]
        print(f"  {info.nsamples:>9}  {_bytes(info.filesize) if info.filesize is not None else '?':>10}  {index.url(i)}")
    if len(index) > args.shards:
        print(f"  ... {len(index) - args.shards} more shards")
    if len(index):
        print(f"fields of the first {args.samples} samples of {index.url(0)}:")
        _print_fields(_samples(index.url(0), args.samples))
    return 0


def _inspect_shard(args: argparse.Namespace) -> int:
    from .shards.grouping import group_members
    from .shards.openers import open_shard
    from .storage.cloud_settings import PipelineStores, with_stores
    from .tar import iter_tar_members

    url = with_stores(args.target, PipelineStores.of(store_of_arguments(args)))
    stream = open_shard(url)
    sizes: list[dict] = []  # per sample: field -> bytes
    try:
        for sample in group_members(url, iter_tar_members(stream, url)):
            fields = {k: len(v) for k, v in sample.items() if not k.startswith("__")}
            if len(sizes) < args.samples:
                for field, size in fields.items():
                    print(f"{size:>12}  {sample['__key__']}.{field}")
            sizes.append(fields)
    finally:
        stream.close()
    if len(sizes) > args.samples:
        print(f"  ... {len(sizes) - args.samples} more samples")
    print(f"shard {url}: {len(sizes)} samples")
    _print_fields(sizes, sizes_given=True)
    return 0


def _samples(url: str, limit: int) -> list[dict]:
    from .shards.grouping import group_members
    from .shards.openers import open_shard
    from .tar import iter_tar_members

    stream = open_shard(url)
    try:
        out = []
        for sample in group_members(url, iter_tar_members(stream, url)):
            out.append(sample)
            if len(out) >= limit:
                break
        return out
    finally:
        stream.close()


def _print_fields(samples: list[dict], sizes_given: bool = False) -> None:
    fields: dict[str, list[int]] = {}
    for sample in samples:
        for field, value in sample.items():
            if not field.startswith("__"):
                fields.setdefault(field, []).append(value if sizes_given else len(value))
    print(f"  {'field':<16} {'in samples':>10} {'min':>10} {'mean':>10} {'max':>10}")
    for field, lengths in sorted(fields.items()):
        print(f"  {field:<16} {len(lengths):>10} {_bytes(min(lengths)):>10} "
              f"{_bytes(sum(lengths) / len(lengths)):>10} {_bytes(max(lengths)):>10}")


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


# ------------------------------------------------------------ verify


def _verify(args: argparse.Namespace) -> int:
    if args.cache or args.cache_dir:
        from .cache.layer import CacheSettings, get_cache, verify_cache
        from .errors import CacheDirectoryError

        settings = CacheSettings(os.path.abspath(args.cache_dir), 0) if args.cache_dir else get_cache()
        if settings is None:
            print("no shard cache to check: set WDS_CACHE_DIR or give --cache-dir", file=sys.stderr)
            return 2
        try:
            bad = verify_cache(settings)
        except CacheDirectoryError as exn:  # a mistyped --cache-dir is not made, nor passed
            print(f"verify: {exn}", file=sys.stderr)
            return 2
        for problem in bad:
            print(f"cache: {problem} (removed)")
        print(f"{settings.directory}: {len(bad)} bad cached shard{'s' * (len(bad) != 1)}", file=sys.stderr)
        if args.index is None or bad:
            return 1 if bad else 0
    if args.index is None:
        print("verify: give an index, or --cache", file=sys.stderr)
        return 2
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from .epochs.index import ShardIndex, check_scan_against, scan_shard
    from .errors import WdsError

    index = ShardIndex.load(args.index, allow_pipe=args.allow_pipe, store=store_of_arguments(args))
    offsets = index.offsets_array()
    problems: list[str] = []
    owners: dict[str, str] = {}
    def check(i: int) -> tuple[int, ShardScan | None, str | None]:
        try:
            places = index.places is not None and index.places.has(i)
            return i, scan_shard(index.url(i), keys=args.across_shards, places=places), None
        except WdsError as exn:
            return i, None, f"shard {index.url(i)!r} cannot be read: {exn}"

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for i, scan, error in pool.map(check, range(len(index))):
            url = index.url(i)
            if error is not None:
                problems.append(error)
                continue
            assert scan is not None  # check() gives a scan or an error
            problems.extend(check_scan_against(index.shards[i], url, scan))
            if offsets is not None and scan.offsets is not None and scan.nsamples == index.shards[i].nsamples:
                mine = offsets[int(index.firsts[i]) : int(index.firsts[i]) + scan.nsamples]
                if not np.array_equal(mine, scan.offsets):
                    problems.append(f"shard {url!r}: its sample offsets differ from the index's; index it again")
            index_places = index.places  # scanned for places only where the index has them
            if scan.places is not None and index_places is not None and not index_places.matches(i, scan.places):
                problems.append(f"shard {url!r}: its member places differ from the index's; index it again")
            elif (scan.places is not None and index_places is not None
                  and (scan.places.filesize, scan.places.version) != index_places.stamp(i)):
                problems.append(f"shard {url!r} was modified since its member places were taken (its modification "
                                "time or version differs): it is read through its headers until it is indexed again")
            for key in scan.keys or ():
                if key in owners:
                    problems.append(f"key {key!r} is in shard {owners[key]!r} and in shard {url!r}")
                owners.setdefault(key, url)
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} problem{'s' * (len(problems) != 1)} in {args.index}", file=sys.stderr)
        return 1
    print(f"{args.index}: ok: {len(index)} shards, {index.total} samples", file=sys.stderr)
    return 0
