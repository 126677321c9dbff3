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
the earlier run wrote (:func:`check_no_more_shards`); either difference is refused, naming
the shard.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
from dataclasses import asdict, dataclass
from itertools import chain
from operator import itemgetter
from typing import NamedTuple

import numpy as np

from ..epochs.index import ShardIndex, ShardScan, _write_atomically
from ..errors import ShardWriteError, WdsError
from ..shards.openers import backend_for, list_urls, url_scheme
from ..storage.cloud_settings import PipelineStores, with_stores

logger = logging.getLogger("wds_datapipes")

FORMAT = "wds_datapipes.writer_progress/2"  # /2: each shard's plan holds its samples' keys and sizes


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
        if found != FORMAT:
            raise ShardWriteError(f"{where} is of format {found!r}, not {FORMAT!r} (written by another "
                                  "version of wds-datapipes): a resume cannot check it against the input; "
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
        self.earlier_shards: list[str] = []  # a restart: the shards the record it replaces held
        self.earlier_pattern: str | None = None  # ... and that run's pattern
        self.texts: dict[int, str] = {}  # each complete shard's record line, as written
        read = _read(path) if os.path.exists(path) else []
        lines = [entry for entry, _ in read]
        self.removed: list[str] = []  # a restart: the earlier run's shards it removed
        if restart or not lines:
            if lines:
                self.earlier_pattern = lines[0].get("pattern")
                self.earlier_shards = [e["scan"]["url"] for e in lines[1:] if "shard" in e and "scan" in e]
            self.removed = settle_earlier(settings.pattern, settings.rank, settings.world, self, restart, stores)
            self._start()
            return
        earlier = WriterSettings.from_json(lines[0], repr(path))
        self.resumed = True
        if earlier != settings:
            changed = {k: (v, getattr(settings, k)) for k, v in asdict(earlier).items() if getattr(settings, k) != v}
            raise ShardWriteError(f"an earlier run with other settings left {path!r} ({changed}, earlier -> now); "
                                  "run with the same settings to resume, or restart=True (--restart) to start over")
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

    def record(self, shard: int, plan: Plan, written: int, skipped: list[tuple[str, str]], scan: ShardScan) -> None:
        entry = {"shard": shard, **plan.entry(), "written": written, "skipped": skipped, "scan": scan.to_json()}
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


# ------------------------------------------------------------ what an earlier run left

_FIELD = re.compile(r"%%|%(0?\d*)[di]")


def listed_shards(pattern: str, rank: int = 0, world: int = 1, stores: PipelineStores | None = None,
                  parts: bool = False) -> dict[int, str] | None:
    """The shards named ``pattern % n`` that are there now (a local folder's files, a bucket's
    objects as their back end lists them), of rank ``rank``'s numbers (``n % world``): {n: URL}.
    ``parts``: the local ``.part`` files a kill left instead ({n: path}). None where that
    cannot be listed: the number is not in the pattern's last part, the back end lists
    nothing, or the listing failed (a warning says why)."""
    head, slash, tail = pattern.rpartition("/")
    fields = [m for m in _FIELD.finditer(tail) if m.group() != "%%"]
    if len(fields) != 1 or any(m.group() != "%%" for m in _FIELD.finditer(head)):
        return None
    before, after = tail[: fields[0].start()].replace("%%", "%"), tail[fields[0].end():].replace("%%", "%")
    folder = head.replace("%%", "%") if slash else "."
    if url_scheme(pattern) == "file":
        try:
            names = os.listdir(folder or "/")
        except FileNotFoundError:
            names = []
    elif parts:
        return {}
    else:
        spec = with_stores(f"{folder}/{before}*{after}", stores)
        if backend_for(spec).list is None or any(c in before + after for c in "*?["):
            return None  # (a glob character in the name would make the listing match other names)
        try:
            names = [str.__str__(url).rpartition("/")[2] for url in list_urls(spec)]
        except (WdsError, OSError) as exn:
            if getattr(exn, "reason", None) == "no object matches":  # an object store's empty listing
                return {}
            logger.warning("%s: cannot list the destination to look for an earlier run's shards (%s)", spec, exn)
            return None
    number = re.compile(re.escape(before) + r"(\d+)" + re.escape(after) + (r"\.part(?:\.z)?" if parts else ""))
    found: dict[int, str] = {}
    for name in sorted(names):
        match = number.fullmatch(name)
        if match is not None and int(match.group(1)) % world == rank:
            n = int(match.group(1))
            if name.startswith(tail % n):  # the pattern's own spelling of n (its width), not another's
                found[n if not parts else len(found)] = pattern % n + name[len(tail % n):]
    return found


def settle_earlier(pattern: str, rank: int, world: int, log, restart: bool,
                   stores: PipelineStores | None = None) -> list[str]:
    """Before a run: the shards an earlier run left under ``pattern`` (and under the pattern of
    the record a restart replaces), of this rank's numbers. A resume keeps them (they are
    checked as it goes, and at its end by :func:`check_no_more_shards`); a restart removes
    them from a local folder, with any ``.part`` file a kill left, and returns them, but
    refuses where they are objects (no back end here deletes objects); a fresh run (no
    record) refuses them: they would mix with its own."""
    if log.resumed:
        return []
    patterns = [pattern] + ([log.earlier_pattern] if restart and log.earlier_pattern not in (None, pattern) else [])
    urls: set[str] = set()
    for each in patterns:
        listed = listed_shards(each, rank, world, stores)
        if listed is None:
            logger.warning("%s: the shards of an earlier run cannot be listed there; a run leaves any of them it "
                           "does not write over", each)
        urls.update(listed.values() if listed else ())
    local = url_scheme(pattern) == "file"
    urls.update(url for url in getattr(log, "earlier_shards", ()) if local and os.path.exists(url))
    found = sorted(urls)
    if not found:
        return _remove_parts(patterns, rank, world) if restart and local else []
    named = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    if restart and local:
        for path in found:
            os.remove(path)
        _remove_parts(patterns, rank, world)
        logger.info("restart: removed %d shards of an earlier run (%s)", len(found), named)
        return found
    if restart:
        raise ShardWriteError(f"a restart cannot remove the {len(found)} shards an earlier run left there ({named}): "
                              "no back end here deletes objects. Remove them, then run again with restart=True "
                              "(--restart)", shard=found[0])
    raise ShardWriteError(f"{len(found)} shards named like this run's are there already ({named}) and no progress "
                          "record accounts for them: a run would leave those it does not write over beside its own. "
                          "Remove them, or restart=True (--restart) to replace them", shard=found[0])


def _remove_parts(patterns: list[str], rank: int, world: int) -> list[str]:
    """Removes the ``.part`` files of these local patterns' shards of this rank (a kill's leftovers)."""
    for each in patterns:
        for path in (listed_shards(each, rank, world, parts=True) or {}).values():
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
    return []


def check_no_more_shards(pattern: str, rank: int, world: int, log, total: int,
                         stores: PipelineStores | None = None) -> None:
    """After a resume planned ``total`` shards: raises where the earlier run planned more, or
    left (recorded or not) a shard of this rank's numbers past ``total``: the input shrank or
    changed, and those shards hold samples it no longer has."""
    if not log.resumed:
        return
    why = "the input shrank or changed since the earlier run"
    again = "restart=True (--restart) writes everything again and removes the earlier run's shards"
    extra = {n: entry["scan"]["url"] for n, entry in dict.items(log.done) if n >= total}
    extra.update({n: url for n, url in (listed_shards(pattern, rank, world, stores) or {}).items() if n >= total})
    if extra:
        first = min(extra)
        raise ShardWriteError(f"{why}: it now plans {total} shards, but that run wrote shard {first} "
                              f"({extra[first]}; {len(extra)} such shards), with samples the input no longer has; "
                              f"{again}", shard=extra[first])
    if log.earlier_end is not None and log.earlier_end > total:
        raise ShardWriteError(f"{why}: that run planned {log.earlier_end} shards, the input now {total}; {again}",
                              shard=pattern % total)


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


__all__ = ["FORMAT", "Plan", "ProgressLog", "WriterSettings", "check_no_more_shards", "join_index", "listed_shards",
           "progress_path", "settle_earlier"]
