"""A writer's progress record: its settings, frozen and tagged, then a line per shard written.

One JSON-lines file per rank, beside the index (``index.json.rank0-of-1.progress``). Its
first line is the :class:`WriterSettings`; each further line is one shard published (its
:class:`Plan`: samples, first and last key, each sample's key and field sizes as the input
gave them and their digest; what was written and skipped; its scan with sample offsets and
member places). A line is appended only after its shard was renamed to its final name, so
a run killed at any moment leaves every shard of the record complete; a shard renamed but
not yet recorded is written again, to the same bytes. A last line marks the rank's end and
how many shards the whole plan has; then the record is written again in shard order (the
same bytes however many workers finished shards in whatever order, and whether the run was
killed and resumed). :func:`join_index` merges the ranks' records into the index once every
rank has ended, with no read of the shards.

A resume checks each recorded shard's plan against the input's (:meth:`ProgressLog.check_plan`:
count, keys, field names and sizes) and, at the end, that the input still fills every shard
the earlier run wrote (:func:`~.earlier.check_no_more_shards`); either difference is refused,
naming the shard. With a ``map``, each shard's line also holds the keys the map gave
(``"mapped"``), which :class:`GivenKeys` keeps unique over the whole output: the shards of
this run, of the run it resumes (:func:`~.writer.write_shards` adds them as it reaches them)
and of every rank (:func:`join_index`). What a run that does not resume does with an earlier run's shards (a
restart removes the writer's own): :mod:`.earlier`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from itertools import chain, repeat
from operator import itemgetter
from typing import NamedTuple

import numpy as np

from ..epochs.index import ShardIndex, ShardScan, _write_atomically
from ..errors import ShardWriteError, WdsError
from ..shards.openers import backend_for, url_scheme
from ..storage.cloud_settings import PipelineStores, with_stores
from .earlier import refuse_foreign_beside, settle_earlier

FORMAT = "wds_datapipes.writer_progress/3"  # /3: a map run's shard lines hold the keys the map gave
_WITHOUT_MAP = "wds_datapipes.writer_progress/2"  # /2: the same lines where there is no map (read still)


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
    def from_json(cls, entry: dict, where: str = "the progress record") -> WriterSettings:
        """The settings of a record's first line; raises :class:`ShardWriteError` for a record of
        another format (an older version's records hold no digest of each shard's samples, so a
        resume could not check that the input is the same)."""
        found = entry.get("format")
        if found != FORMAT and not (found == _WITHOUT_MAP and entry.get("map_name") is None):
            raise ShardWriteError(f"{where} is of format {found!r}, not {FORMAT!r} (written by another "
                                  "version of wds-datapipes): a resume cannot check it against the input "
                                  "(nor, with a map, the keys it gave); "
                                  "restart=True (--restart) writes everything again")
        return cls(**{k: v for k, v in entry.items() if k != "format"})


class Plan(NamedTuple):
    """One shard's planned samples, as the input gave them: count, first and last key, and
    ``samples`` (for the record: each sample's key, its fields' names, how many, and their
    sizes before ``map``), with their ``digest``: a resume compares it with the record's."""

    planned: int
    first: str | None
    last: str | None
    digest: str
    samples: dict

    @classmethod
    def of(cls, facts: list) -> Plan:
        """The plan of the samples whose ``(key, [(field, size), ...])`` are ``facts``: taken
        apart into flat lists and arrays by C loops (no Python work a sample here)."""
        keys = list(map(itemgetter(0), facts))
        fields = list(map(itemgetter(1), facts))
        pairs = list(chain.from_iterable(fields))
        counts = np.fromiter(map(len, fields), np.int64, len(fields)).astype("<i8")
        sizes = np.fromiter(map(itemgetter(1), pairs), np.int64, len(pairs)).astype("<i8")
        names = list(map(itemgetter(0), pairs))
        digest = hashlib.blake2b(digest_size=16)
        for part in ("\0".join(keys), "\0".join(names)):
            digest.update(part.encode("utf-8", "surrogatepass") + b"\1")
        digest.update(counts.tobytes())
        digest.update(sizes.tobytes())
        samples = {"keys": keys, "fields": names, "counts": base64.b64encode(counts.tobytes()).decode(),
                   "sizes": base64.b64encode(sizes.tobytes()).decode()}
        return cls(len(keys), keys[0] if keys else None, keys[-1] if keys else None, digest.hexdigest(), samples)

    def entry(self) -> dict:
        """The plan's part of a shard's record line."""
        return {"planned": self.planned, "first": self.first, "last": self.last, "digest": self.digest,
                "samples": self.samples}


def _per_sample(samples: dict) -> list[tuple[str, list[tuple[str, int]]]]:
    """A record's ``samples`` as (key, [(field, size), ...]) per sample."""
    counts = np.frombuffer(base64.b64decode(samples["counts"]), "<i8").tolist()
    sizes = np.frombuffer(base64.b64decode(samples["sizes"]), "<i8").tolist()
    out, at = [], 0
    for key, count in zip(samples["keys"], counts):
        out.append((key, list(zip(samples["fields"][at:at + count], sizes[at:at + count]))))
        at += count
    return out


def plan_difference(entry: dict, plan: Plan) -> str | None:
    """What differs between a recorded shard's plan (``entry``) and this run's, in words; None where nothing does."""
    if entry.get("digest") == plan.digest:
        return None
    was = _per_sample(entry["samples"]) if isinstance(entry.get("samples"), dict) else []
    for at, (old, new) in enumerate(zip(was, _per_sample(plan.samples))):
        if old != new:
            if old[0] != new[0]:
                return f"its sample {at} was {old[0]!r}, the input now gives {new[0]!r} there"
            return (f"its sample {at}, {new[0]!r}, had the fields and sizes {_fields(old[1])}, "
                    f"the input now gives {_fields(new[1])}")
    if len(was) != plan.planned:
        return (f"it held {len(was)} samples ({entry.get('first')!r}..{entry.get('last')!r}), the input now "
                f"gives it {plan.planned} ({plan.first!r}..{plan.last!r})")
    return f"its samples' digest was {entry.get('digest')}, the input's is now {plan.digest}"


def _fields(sizes: list) -> str:
    return ", ".join(f"{name} {size} bytes" for name, size in sizes) or "none"


class GivenKeys:
    """The keys a ``map`` gave, each with the shard it went to, over every shard added: a key in
    two shards is refused (:meth:`add`), whatever the handler (both shards are written by then).

    A key costs one slot of a dict (about 40-70 bytes: tests/writing/test_map_keys_everywhere.py
    measures it); the key's string and the shards' lists are the record's own (a shard's
    record line holds them: ``"mapped"``, and the input keys of its plan)."""

    def __init__(self):
        self.shard_of: dict[str, int] = {}
        self.shards: dict[int, tuple[list, list, str]] = {}  # shard -> (input keys, keys given, its URL)

    def add(self, shard: int, inputs: list[str], given: list[str | None], url: str) -> None:
        """Adds the keys the map gave in ``shard`` (``given``: one a planned input, None where it
        wrote none; ``inputs``: the plan's input keys; ``url``: the shard). Raises
        :class:`ShardWriteError` naming the key, both inputs and both shards where one of them is
        in a shard added before (the keys of this one are then not added)."""
        keys = list(filter(None, given))  # (a key is never empty: check_fields refuses it)
        if not self.shard_of.keys().isdisjoint(keys):  # a C loop over the keys; the lookup below only on a repeat
            at, key = next((at, key) for at, key in enumerate(given) if key is not None and key in self.shard_of)
            first = self.shard_of[key]
            first_inputs, first_given, first_url = self.shards[first]
            raise ShardWriteError(
                f"the map gave the key {key!r} to the input {inputs[at]!r} in shard {shard} ({url}) and to "
                f"{first_inputs[first_given.index(key)]!r} in shard {first} ({first_url}) (keys must be unique: "
                "readers would repeat them; a repeat across shards stops the run whatever the handler)",
                shard=url, key=key, source=inputs[at])
        self.shard_of.update(zip(keys, repeat(shard)))
        self.shards[shard] = (inputs, given, url)

    def add_entry(self, entry: dict) -> None:
        """Adds a recorded shard's keys (its record line's ``"mapped"``)."""
        if entry.get("mapped") is None:
            raise ShardWriteError(f"shard {entry['shard']}'s record holds no keys the map gave (written by another "
                                  "version of wds-datapipes): they cannot be checked unique; restart=True "
                                  "(--restart) writes everything again", shard=entry["scan"]["url"])
        self.add(entry["shard"], entry["samples"]["keys"], entry["mapped"], entry["scan"]["url"])


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
        self.resumed = False  # whether an earlier run's record was read, to go on from
        self.earlier_end: int | None = None
        self.texts: dict[int, str] = {}  # each complete shard's record line, as written
        self.given: GivenKeys | None = None  # with a map: the keys it gave in this rank's shards (the writer's)
        read = _read(path) if os.path.exists(path) else []
        lines = [entry for entry, _ in read]
        self.removed: list[str] = []  # a restart: the earlier run's shards it removed
        if restart or not lines:
            first = lines[0] if lines else {}
            recorded = {e["scan"]["url"]: e["scan"].get("filesize") for e in lines[1:] if "shard" in e and "scan" in e}
            self.removed = settle_earlier(settings.pattern, settings.rank, settings.world, restart, stores,
                                          earlier_pattern=first.get("pattern"), earlier_mtime=first.get("mtime"),
                                          recorded=recorded, mtime=settings.mtime)
            self._start()
            return
        earlier = WriterSettings.from_json(lines[0], repr(path))
        self.resumed = True
        if earlier != settings:
            changed = {k: (v, getattr(settings, k)) for k, v in asdict(earlier).items() if getattr(settings, k) != v}
            raise ShardWriteError(f"an earlier run with other settings left {path!r} ({changed}, earlier -> now); "
                                  "run with the same settings to resume, or restart=True (--restart) to start over")
        refuse_foreign_beside(settings.pattern, settings.rank, settings.world,
                              [e["scan"]["url"] for e in lines[1:] if "shard" in e and "scan" in e], settings.mtime)
        with open(path, "rb") as raw:
            whole = raw.read()
        if whole.count(b"\n") != len(lines) or not whole.endswith(b"\n"):
            # a line cut by the interruption: keep the whole lines before it, so that what
            # this run appends is read again (after a cut line nothing would be)
            _write_atomically(path, "".join(text + "\n" for _, text in read).encode())
        for entry, text in read[1:]:
            if "shard" in entry:
                if _still_there(entry, stores):
                    self.done[entry["shard"]], self.texts[entry["shard"]] = entry, text
            elif "end" in entry:
                self.ended = entry["shards"]
        self.earlier_end = self.ended  # the earlier run's plan, where it ended
        self._out = open(path, "a")  # noqa: SIM115 (held for the run, closed by close())

    def _start(self) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        _write_atomically(self.path, (json.dumps(self.settings.to_json()) + "\n").encode())
        self._out = open(self.path, "a")  # noqa: SIM115 (held for the run)

    def check_plan(self, shard: int, plan: Plan) -> None:
        """Raises where a complete shard's planned samples differ from this run's plan (the input changed)."""
        entry = self.done[shard]
        what = plan_difference(entry, plan)
        if what is not None:
            raise ShardWriteError(f"the input changed since the earlier run: shard {shard}: {what}; "
                                  "restart=True (--restart) writes everything again", shard=entry["scan"]["url"])

    def record(self, shard: int, plan: Plan, written: int, skipped: list[tuple[str, str]], scan: ShardScan,
               given: list[str | None] | None = None) -> None:
        """Appends a shard published (``given``: with a map, the keys it gave, one a planned input)."""
        entry = {"shard": shard, **plan.entry(), "written": written, "skipped": skipped, "scan": scan.to_json(),
                 **({} if given is None else {"mapped": given})}
        line = json.dumps(entry)
        self._append(line)
        self.done[shard], self.texts[shard], self.scans[shard] = entry, line, scan

    def end(self, shards: int) -> None:
        """Marks this rank complete, in a plan of ``shards`` shards; then writes the record again
        in shard order (the same bytes for any order the shards finished in)."""
        end = json.dumps({"end": True, "shards": shards})
        self._append(end)
        self.ended = shards
        lines = [json.dumps(self.settings.to_json()), *(self.texts[n] for n in sorted(self.done)), end]
        _write_atomically(self.path, "".join(line + "\n" for line in lines).encode())

    def _append(self, line: str) -> None:
        """Appends one line (a shard's, or the end) and syncs it."""
        self._out.write(line + "\n")
        self._out.flush()
        os.fsync(self._out.fileno())

    def close(self) -> None:
        self._out.close()


def _lines(path: str) -> list[dict]:
    return [entry for entry, _ in _read(path)]


def _read(path: str) -> list[tuple[dict, str]]:
    """Each whole line of a record, parsed, and its text (up to a line cut by an interruption)."""
    entries = []
    with open(path) as lines:
        for line in lines:
            try:
                entries.append((json.loads(line), line.rstrip("\n")))
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
    (its scans of this run as written, with the keys and suffixes the writer made). Where
    the run had a map, the keys it gave are checked unique over every shard (no index is
    written where one is in two: the error names the key and both shards); those of the shards ``own`` checked
    already (its ``given``) are not added again."""
    scans: dict[int, ShardScan] = {}
    entries: dict[int, dict] = {}
    totals = set()
    mapped = False
    for rank in range(world):
        if own is not None and own.ended is not None and own.settings.rank == rank and own.settings.world == world:
            totals.add(own.ended)
            scans.update({n: own.scans[n] if n in own.scans else ShardScan.from_json(e["scan"])
                          for n, e in own.done.items()})
            entries.update(own.done)
            mapped = mapped or own.settings.map_name is not None
            continue
        path = progress_path(index, rank, world)
        if not os.path.exists(path):
            raise ShardWriteError(f"rank {rank} of {world} has not started: no {path!r}")
        lines = _lines(path)
        ends = [e["shards"] for e in lines[1:] if "end" in e]
        if not ends:
            raise ShardWriteError(f"rank {rank} of {world} has not finished ({path!r} has no end line)")
        totals.add(ends[-1])
        mapped = mapped or lines[0].get("map_name") is not None
        for entry in lines[1:]:
            if "shard" in entry:
                scans[entry["shard"]] = ShardScan.from_json(entry["scan"])
                entries[entry["shard"]] = entry
    if len(totals) != 1:
        raise ShardWriteError(f"the ranks planned different numbers of shards: {sorted(totals)} (different input?)")
    total = totals.pop()
    missing = [n for n in range(total) if n not in scans]
    if missing:
        raise ShardWriteError(f"shards {missing[:10]} of {total} are in no rank's record")
    if mapped:
        check_given_keys([entries[n] for n in range(total)], own.given if own is not None else None)
    result = ShardIndex.from_scans([scans[n] for n in range(total)], relative_to=index)
    result.save(index)
    return result


def check_given_keys(entries: list[dict], given: GivenKeys | None = None) -> None:
    """Raises where a key a map gave is in two of these shards' record lines (in shard order;
    those ``given`` holds already are not added again)."""
    given = given if given is not None else GivenKeys()
    for entry in entries:
        if entry["shard"] not in given.shards:
            given.add_entry(entry)


__all__ = ["FORMAT", "GivenKeys", "Plan", "ProgressLog", "WriterSettings", "check_given_keys", "join_index",
           "progress_path"]
