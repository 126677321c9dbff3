"""A writer's progress record: its settings, frozen and tagged, then a line per shard written.

One JSON-lines file per rank, beside the index (``index.json.rank0-of-1.progress``). Its
first line is the :class:`WriterSettings`; each further line is one shard published (its
plan: samples, first and last key; what was written and skipped; its scan with sample
offsets and member places). A line is appended only after its shard was renamed to its
final name, so a run killed at any moment leaves every shard of the record complete; a
shard renamed but not yet recorded is written again, to the same bytes. A last line marks
the rank's end and how many shards the whole plan has; :func:`join_index` merges the
ranks' records into the index once every rank has ended, with no read of the shards.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from ..epochs.index import ShardIndex, ShardScan, _write_atomically
from ..errors import ShardWriteError, WdsError
from ..shards.openers import backend_for, url_scheme
from ..storage.cloud_settings import PipelineStores, with_stores

FORMAT = "wds_datapipes.writer_progress/1"


@dataclass(frozen=True)
class WriterSettings:
    """What decides the bytes a run writes (worker count does not), checked again on resume."""

    pattern: str
    maxcount: int | None
    maxsize: int | None
    rank: int
    world: int
    mtime: int = 0
    mode: int = 0o444
    allow_pickle: bool = False
    map_name: str | None = None  # the map function's qualified name, where there is one
    compression: str | None = None  # of the shards (gzip, bzip2, xz, zstd), None for plain tars

    def __post_init__(self):
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is not in a world of {self.world}")
        if "%" not in self.pattern:
            raise ValueError(f"the shard pattern {self.pattern!r} needs a % field for the shard number "
                             "(e.g. out/train-%06d.tar)")

    def to_json(self) -> dict:
        """The settings as a progress record's first line holds them (:meth:`from_json` reads it)."""
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, entry: dict) -> WriterSettings:
        """The settings of a record's first line (what :meth:`to_json` gave); raises ValueError for a
        record of another format."""
        if entry.get("format") != FORMAT:
            raise ValueError(f"not a writer progress record of format {FORMAT}: {entry.get('format')!r}")
        return cls(**{k: v for k, v in entry.items() if k != "format"})


def progress_path(index: str, rank: int, world: int) -> str:
    """Where rank ``rank`` of ``world`` keeps its progress, beside the index."""
    return f"{index}.rank{rank}-of-{world}.progress"


class ProgressLog:
    """The progress of one rank: shards already complete, read from an earlier run's record,
    and the appends that record this run's. ``stores``: the run's own object-store settings,
    for the HEADs that check that the remote shards it records are still there."""

    def __init__(self, path: str, settings: WriterSettings, restart: bool = False,
                 stores: PipelineStores | None = None):
        self.path = path
        self.settings = settings
        self.done: dict[int, dict] = {}
        self.scans: dict[int, ShardScan] = {}  # the scans this run recorded, as written
        self.ended: int | None = None
        if restart or not os.path.exists(path):
            self._start()
            return
        lines = _lines(path)
        if not lines:
            self._start()
            return
        earlier = WriterSettings.from_json(lines[0])
        if earlier != settings:
            changed = {k: (v, getattr(settings, k)) for k, v in asdict(earlier).items() if getattr(settings, k) != v}
            raise ShardWriteError(f"an earlier run with other settings left {path!r} ({changed}, earlier -> now); "
                                  "run with the same settings to resume, or restart=True (--restart) to start over")
        with open(path, "rb") as raw:
            whole = raw.read()
        if whole.count(b"\n") != len(lines) or not whole.endswith(b"\n"):
            # a line cut by the interruption: keep the whole lines before it, so that what
            # this run appends is read again (after a cut line nothing would be)
            _write_atomically(path, "".join(json.dumps(entry) + "\n" for entry in lines).encode())
        for entry in lines[1:]:
            if "shard" in entry:
                if _still_there(entry, stores):
                    self.done[entry["shard"]] = entry
            elif "end" in entry:
                self.ended = entry["shards"]
        self._out = open(path, "a")  # noqa: SIM115 (held for the run, closed by close())

    def _start(self) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        _write_atomically(self.path, (json.dumps(self.settings.to_json()) + "\n").encode())
        self._out = open(self.path, "a")  # noqa: SIM115 (held for the run)

    def check_plan(self, shard: int, planned: int, first: str, last: str) -> None:
        """Raises where a complete shard's planned samples differ from this run's plan (the input changed)."""
        entry = self.done[shard]
        if (entry["planned"], entry["first"], entry["last"]) != (planned, first, last):
            raise ShardWriteError(
                f"the input changed since the interrupted run: shard {shard} had {entry['planned']} samples "
                f"{entry['first']!r}..{entry['last']!r}, the plan now gives {planned} {first!r}..{last!r}; "
                "restart=True (--restart) writes everything again", shard=entry["scan"]["url"])

    def record(self, shard: int, planned: int, first: str, last: str, written: int,
               skipped: list[tuple[str, str]], scan: ShardScan) -> None:
        entry = {"shard": shard, "planned": planned, "first": first, "last": last, "written": written,
                 "skipped": skipped, "scan": scan.to_json()}
        self._append(entry)
        self.done[shard] = entry
        self.scans[shard] = scan

    def end(self, shards: int) -> None:
        """Marks this rank complete, in a plan of ``shards`` shards."""
        self._append({"end": True, "shards": shards})
        self.ended = shards

    def _append(self, entry: dict) -> None:
        self._out.write(json.dumps(entry) + "\n")
        self._out.flush()
        os.fsync(self._out.fileno())

    def close(self) -> None:
        self._out.close()


def _lines(path: str) -> list[dict]:
    entries = []
    with open(path) as lines:
        for line in lines:
            try:
                entries.append(json.loads(line))
            except ValueError:
                break  # a line cut by the interruption: what follows it cannot be trusted
    return entries


def _still_there(entry: dict, stores: PipelineStores | None = None) -> bool:
    """Whether a recorded shard is still on disk as it was written (size and mtime)."""
    scan = entry["scan"]
    if url_scheme(scan["url"]) != "file":
        return object_still_there(entry, stores)
    try:
        stat = os.stat(scan["url"])
    except OSError:
        return False
    places = scan.get("places") or {}
    return stat.st_size == scan["filesize"] and places.get("mtime_ns", stat.st_mtime_ns) == stat.st_mtime_ns


def object_still_there(entry: dict, stores: PipelineStores | None = None) -> bool:
    """Whether a recorded shard is still in its store as it was uploaded (size and version,
    as its back end's ``stamp`` says them, asked with ``stores``'s settings where given; size
    alone where the store has no version)."""
    scan = entry["scan"]
    try:
        stamp = backend_for(scan["url"]).stamp
        now = stamp(with_stores(scan["url"], stores), None) if stamp is not None else None
    except (WdsError, OSError):
        return False  # gone, or not to be trusted: written again, to the same bytes
    if now is None:
        return False
    version = (scan.get("places") or {}).get("version")
    return now[0] == scan["filesize"] and (version is None or now[1] is None or str(now[1]) == str(version))


def join_index(index: str, world: int, own: ProgressLog | None = None) -> ShardIndex:
    """The index of a finished multi-rank (or one-rank) run, from its ranks' progress
    records, saved to ``index``; raises naming the ranks or shards still missing. ``own``:
    the ended log of the rank that joins, whose record is taken from memory, not read again
    (its scans of this run as written, with the keys and suffixes the writer made)."""
    scans: dict[int, ShardScan] = {}
    totals = set()
    for rank in range(world):
        if own is not None and own.ended is not None and own.settings.rank == rank and own.settings.world == world:
            totals.add(own.ended)
            scans.update({n: own.scans[n] if n in own.scans else ShardScan.from_json(e["scan"])
                          for n, e in own.done.items()})
            continue
        path = progress_path(index, rank, world)
        if not os.path.exists(path):
            raise ShardWriteError(f"rank {rank} of {world} has not started: no {path!r}")
        lines = _lines(path)
        ends = [e["shards"] for e in lines[1:] if "end" in e]
        if not ends:
            raise ShardWriteError(f"rank {rank} of {world} has not finished ({path!r} has no end line)")
        totals.add(ends[-1])
        for entry in lines[1:]:
            if "shard" in entry:
                scans[entry["shard"]] = ShardScan.from_json(entry["scan"])
    if len(totals) != 1:
        raise ShardWriteError(f"the ranks planned different numbers of shards: {sorted(totals)} (different input?)")
    total = totals.pop()
    missing = [n for n in range(total) if n not in scans]
    if missing:
        raise ShardWriteError(f"shards {missing[:10]} of {total} are in no rank's record")
    result = ShardIndex.from_scans([scans[n] for n in range(total)], relative_to=index)
    result.save(index)
    return result


__all__ = ["FORMAT", "ProgressLog", "WriterSettings", "join_index", "progress_path"]
