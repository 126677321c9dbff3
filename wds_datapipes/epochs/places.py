"""Member places: where each member's bytes lie in its shard, so an index reader skips the headers.

An optional part of a shard index (``python -m wds_datapipes index --places``). For every
member that belongs to a sample, in shard order: the byte offset of its data, its size,
the number of its sample within the shard, and its name (its sample's key and its
suffix). :mod:`.placed_reads` reads samples by them without parsing a tar header, and
:mod:`.placed_shuffle` reads a shuffled share sample by sample at them.

Places are only as good as the shard they were taken from. Each shard's size and
version are recorded beside its places: a local file's modification time, a remote
object's version as its source gave it (ETag, Last-Modified, the AIS object's version).
The writer gives each shard a modification time drawn from what it holds, not from the
clock (:func:`wds_datapipes.writing.shard_file.shard_mtime`), so identical runs record the
same stamps, and a shard written over or edited since still gets a new one.
A shard whose size differs is an :class:`IndexMismatchError` (as without places), one
whose version differs is read through its headers again, with a warning. A remote shard
is read by its places from its complete copy in the shard cache
(:func:`~wds_datapipes.cache.layer.cached_copy`), and through its headers until there is
one. Compressed shards, sparse members and shards whose size or version their source does
not tell (``pipe:``, servers without ETag) have no places and are always read through their
headers.

Files, beside the index's JSON (named in its ``"wds_datapipes"`` entry), format 2 (3 where
a shard's stamp is a remote object's version, which format 2 readers could not check):

- ``<stem>.places.json``: per shard, its member count, size and ``mtime_ns`` (a local
  file) or ``version`` (a remote object; null where its source gave none), or null; and
  the table of the suffixes the members have, as written (``"suffixes"``);
- ``<stem>.places``: one record per member (little-endian): data offset ``u8``, size
  ``u8``, sample within the shard ``u4``, number of its suffix in the table ``u4``, first
  byte of its sample's key in the keys file ``u8``;
- ``<stem>.keys``: the samples' keys, UTF-8, each followed by a NUL.

A member's name is its sample's key, a dot and its suffix. A reader takes a span's keys
with one split and its field names from the table (lowercased once per index): nothing
is split per member, which cost 0.9 us of a 2-member photo sample's 5 us (format 1, still
read: names instead of keys, and each record the start of its member's name; its names
are split as they are read).

The two binary files are memory-mapped: a reader touches only the pages of its spans.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import IndexMismatchError, WdsError
from ..shards.keys import split_key
from ..shards.openers import file_mtime, stream_stamp, url_scheme

ROW = np.dtype([("data", "<u8"), ("size", "<u8"), ("sample", "<u4"), ("suffix", "<u4"), ("key", "<u8")])
ROW_1 = np.dtype([("data", "<u8"), ("size", "<u8"), ("sample", "<u4"), ("name", "<u8")])  # format 1, read only
FORMAT = 2  # written where every stamp is a local file's; 1, 2 and 3 are read
FORMAT_REMOTE = 3  # written where a stamp is a remote object's version (format 2 readers could not tell it)
_SAMPLE_KEYS = ("__key__", "__url__")  # what group_members puts in a sample before its fields


@dataclass
class ShardPlaces:
    """One shard's places, as a scan found them; ``names`` None where the shard has none."""

    names: list[str] | None
    data: np.ndarray | None = None  # offsets of the members' bytes
    sizes: np.ndarray | None = None
    samples: np.ndarray | None = None  # each member's sample number within the shard
    filesize: int | None = None
    version: int | str | None = None  # a local file's mtime_ns, a remote object's version (or None)
    # Where the writer made the names: each sample's key and each member's suffix as written,
    # which MemberPlaces.from_shards takes instead of splitting the names again (not in to_json).
    keys: list[str] | None = field(default=None, compare=False, repr=False)
    suffixes: list[str] | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict:
        """A JSON-able form (an interrupted index run keeps its scans in it)."""
        if self.names is None:
            return {"names": None}
        return {"names": self.names, "filesize": self.filesize, **_version_json(self.version),
                **{key: base64.b64encode(np.asarray(getattr(self, key), dtype="<i8").tobytes()).decode()
                   for key in ("data", "sizes", "samples")}}

    @classmethod
    def from_json(cls, entry: dict) -> ShardPlaces:
        if entry.get("names") is None:
            return cls(None)
        arrays = {key: np.frombuffer(base64.b64decode(entry[key]), dtype="<i8").astype(np.int64)
                  for key in ("data", "sizes", "samples")}
        return cls(list(entry["names"]), filesize=int(entry["filesize"]), version=_version_of(entry), **arrays)


def shard_stamp(stream, url: str) -> tuple[int, int | str] | None:
    """The stamp of an opened shard, taken before its headers are read (so a later change is
    seen): (size, mtime_ns) of a local file, (size, version) of a remote object, as the
    stream says them (a copy in the shard cache says its source's); None where either is
    not known (a ``pipe:`` command's output, a server that sends no ETag): places that
    nothing could check are not taken."""
    if url_scheme(url) == "file":
        try:
            return stat_stamp(os.fstat(stream.fileno()))
        except (AttributeError, OSError, ValueError):  # a cached copy: the file it was made from
            size, version = stream_stamp(stream, url)
            mtime = file_mtime(version)
            return None if size is None or mtime is None else (size, mtime)
    size, version = stream_stamp(stream, url)
    return None if size is None or version is None else (size, version)


def places_of_members(url: str, members: Sequence[tuple[str, int | None, int]],
                      stamp: tuple[int, int] | None) -> ShardPlaces:
    """The places of one shard from its (name, data offset, size) members, in order, and the
    shard's ``stamp`` (:func:`shard_stamp`, taken when it was opened).

    Members outside samples (no suffix, ``__meta__``) are left out, samples counted as
    :func:`~wds_datapipes.shards.grouping.group_members` makes them. A shard with a member whose
    bytes are no single run (sparse, compressed), a name with a NUL, or a suffix twice in
    a sample (an error ``group_by_key`` reports) gets no places.
    """
    if stamp is None:
        return ShardPlaces(None)
    names, data, sizes, samples = [], [], [], []
    previous, number, suffixes = None, -1, set()
    for name, offset, size in members:
        split = split_key(name)
        if split is None:
            continue
        if offset is None or "\0" in name:
            return ShardPlaces(None)
        if split[0] != previous:
            previous, number, suffixes = split[0], number + 1, set()
        elif split[1] in suffixes or split[1] in _SAMPLE_KEYS:  # group_by_key's SampleError:
            return ShardPlaces(None)                              # the headers' reader raises it
        suffixes.add(split[1])
        names.append(name)
        data.append(offset)
        sizes.append(size)
        samples.append(number)
    return ShardPlaces(names, np.asarray(data, dtype=np.int64), np.asarray(sizes, dtype=np.int64),
                       np.asarray(samples, dtype=np.int64), *stamp)


@dataclass
class SpanPlaces:
    """The places of a run of whole samples: a record per member (``data``, ``size``,
    ``sample``), each sample's key, each member's field name (its suffix, lowercased)."""

    rows: np.ndarray
    keys: list[str]
    suffixes: list[str]
    spelled: Callable[[int], str]  # member -> its suffix as written (for names in errors)

    def name(self, member: int) -> str:
        """The name of member ``member`` of the span, as its shard has it."""
        numbers = self.rows["sample"]
        return f"{self.keys[int(numbers[member]) - int(numbers[0])]}.{self.spelled(member)}"

    def member_at(self, offset: int) -> int:
        """The member whose bytes start at ``offset`` (members lie in shard order)."""
        return int(np.searchsorted(self.rows["data"], offset))


class MemberPlaces:
    """The member places of an index's shards (see the module's description).

    Args:
        rows: one ``ROW`` record per member of every shard with places, in shard order
            (``ROW_1`` records where ``suffixes`` is None: format 1).
        text: the keys file's bytes (NUL after each key); format 1: the names file's.
        shards: per shard of the index, (member count, size, version), or None (the version:
            a local file's mtime_ns, a remote object's version or None).
        suffixes: the table of suffixes as written that the records number (format 2).
    """

    def __init__(self, rows: np.ndarray, text: bytes | np.ndarray, shards: Sequence[tuple[int, int, int] | None],
                 suffixes: Sequence[str] | None = None):
        self.rows = rows
        self.text = text
        self.shards = list(shards)
        self.suffixes = None if suffixes is None else list(suffixes)
        # The suffixes' field names (lowercased), an array: a span's are one lookup.
        self.fields = None if suffixes is None else np.array(_fields(self.suffixes), dtype=object)
        counts = [0 if s is None else s[0] for s in self.shards]
        self.firsts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        if self.firsts[-1] != len(rows):
            raise IndexMismatchError(f"member places: {len(rows)} records for the {self.firsts[-1]} members "
                                     "their shards list")
        self._files: dict[str, tuple[str, tuple[int, int]]] = {}  # memory-mapped files and their stamps

    @classmethod
    def from_shards(cls, shards: Sequence[ShardPlaces]) -> MemberPlaces:
        rows, keys, entries, table, at = [], [], [], {}, 0
        for shard in shards:
            if shard.names is None:
                entries.append(None)
                continue
            samples = np.asarray(shard.samples, dtype=np.int64)
            if shard.keys is not None and shard.suffixes is not None:
                sample_keys, suffixes = shard.keys, shard.suffixes
            else:  # the scan kept names with a key, a sample's members share it: split each sample's first
                firsts = _sample_starts(samples)
                sample_keys = [split_key(shard.names[f])[0] for f in firsts]
                cuts = np.repeat([len(key) + 1 for key in sample_keys],
                                 np.diff(firsts + [len(shard.names)])).tolist() if firsts else []
                suffixes = [name[cut:] for name, cut in zip(shard.names, cuts)]
            encoded = [key.encode("utf-8", "surrogateescape") + b"\0" for key in sample_keys]
            ends = np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)))
            starts = at + np.concatenate([[0], ends[:-1]])
            at += int(ends[-1]) if len(ends) else 0
            part = np.empty(len(shard.names), dtype=ROW)
            part["data"], part["size"], part["sample"] = shard.data, shard.sizes, samples
            number = table.setdefault
            part["suffix"] = [number(suffix, len(table)) for suffix in suffixes]
            part["key"] = starts[samples - samples[0]] if len(samples) else starts[:0]
            rows.append(part)
            keys.extend(encoded)
            entries.append((len(shard.names), shard.filesize, shard.version))
        return cls(np.concatenate(rows) if rows else np.empty(0, dtype=ROW), b"".join(keys), entries, list(table))

    def shard_places(self, shard: int) -> ShardPlaces:
        """Shard ``shard``'s places as a scan gives them."""
        entry = self.shards[shard]
        if entry is None:
            return ShardPlaces(None)
        return _as_scanned(self._span(int(self.firsts[shard]), int(self.firsts[shard + 1])), entry)

    # ------------------------------------------------------------ files

    def files(self, stem: str) -> tuple[dict, dict[str, bytes]]:
        """The index's JSON entry for the places, and {file name: bytes} of the files it names
        (format 2 or 3, whichever format they were loaded from)."""
        if self.suffixes is None:
            return MemberPlaces.from_shards([self.shard_places(i) for i in range(len(self.shards))]).files(stem)
        entry = {"shards": f"{stem}.places.json", "rows": f"{stem}.places", "keys": f"{stem}.keys"}
        shards = [None if s is None else {"members": s[0], "filesize": s[1], **_version_json(s[2])}
                  for s in self.shards]
        return entry, {
            entry["shards"]: json.dumps({"format": self.format, "shards": shards, "suffixes": self.suffixes}).encode(),
            entry["rows"]: np.ascontiguousarray(self.rows, dtype=ROW).tobytes(),
            entry["keys"]: bytes(self.text),
        }

    @classmethod
    def load(cls, folder: str, entry: dict, nsamples: Sequence[int], index_location: str) -> MemberPlaces:
        """The places an index's JSON entry names (files in ``folder``, memory-mapped), checked
        against the index's sample counts ``nsamples``."""
        try:
            with open(os.path.join(folder, entry["shards"]), "rb") as meta:
                spec = json.load(meta)
            if spec.get("format") not in (1, 2, 3):
                raise WdsError(f"index {index_location!r}: unknown member places format {spec.get('format')!r}")
            shards = [None if s is None else (int(s["members"]), int(s["filesize"]), _version_of(s))
                      for s in spec["shards"]]
            suffixes = None if spec["format"] == 1 else [str(s) for s in spec["suffixes"]]
            rows = _map(os.path.join(folder, entry["rows"]), ROW_1 if suffixes is None else ROW)
            text_file = entry["names" if suffixes is None else "keys"]
            text = _map(os.path.join(folder, text_file), np.uint8)
        except (OSError, KeyError, TypeError, ValueError) as exn:
            raise WdsError(f"index {index_location!r}: its member places cannot be read ({exn!r}); "
                           "index again, or remove 'places' from the index's wds_datapipes entry") from None
        if len(shards) != len(nsamples):
            raise IndexMismatchError(f"index {index_location!r}: member places for {len(shards)} shards, "
                                     f"the index has {len(nsamples)}")
        try:
            places = cls(rows, text, shards, suffixes)
        except IndexMismatchError as exn:
            raise IndexMismatchError(f"index {index_location!r}: {exn}") from None
        for shard, (first, last) in enumerate(zip(places.firsts[:-1].tolist(), places.firsts[1:].tolist())):
            counted = int(rows["sample"][last - 1]) + 1 if last > first else 0
            if shards[shard] is not None and counted != nsamples[shard]:
                raise IndexMismatchError(f"index {index_location!r}: the member places of shard {shard} hold "
                                         f"{counted} samples, the index says {nsamples[shard]}; index again")
        for key, name in (("rows", entry["rows"]), ("text", text_file)):
            path = os.path.join(folder, name)
            places._files[key] = (path, stat_stamp(os.stat(path)))
        return places

    # ------------------------------------------------------------ questions

    @property
    def format(self) -> int:
        """The format of the files these places were loaded from (or would be written in)."""
        if self.suffixes is None:
            return 1
        return FORMAT_REMOTE if any(s is not None and isinstance(s[2], str) for s in self.shards) else FORMAT

    def has(self, shard: int) -> bool:
        return self.shards[shard] is not None

    def stamp(self, shard: int) -> tuple[int, int | str | None] | None:
        """(size, version) shard ``shard`` had when its places were taken; None without places."""
        entry = self.shards[shard]
        return None if entry is None else entry[1:]

    def span(self, shard: int, start: int, stop: int) -> SpanPlaces:
        """The places of samples ``start`` .. ``stop - 1`` of shard ``shard``."""
        first, last = int(self.firsts[shard]), int(self.firsts[shard + 1])
        numbers = self.rows["sample"][first:last]
        a = first + int(np.searchsorted(numbers, start, "left"))
        b = first + int(np.searchsorted(numbers, stop, "left"))
        return self._span(a, b)

    def _span(self, a: int, b: int) -> SpanPlaces:
        """The places of records ``a`` .. ``b - 1`` (whole samples)."""
        rows = np.asarray(self.rows[a:b])
        if a == b:
            return SpanPlaces(rows, [], [], str)
        if self.suffixes is None:
            return self._span_1(a, b, rows)
        numbers = rows["sample"]
        end = int(self.rows["key"][b]) if b < len(self.rows) else len(self.text)
        keys = bytes(self.text[int(rows["key"][0]) : end]).decode("utf-8", "surrogateescape").split("\0")[:-1]
        ids = rows["suffix"]
        if len(keys) != int(numbers[-1]) - int(numbers[0]) + 1 or int(ids.max()) >= len(self.suffixes):
            raise IndexMismatchError(f"member places: records {a} .. {b - 1} do not match their keys or suffixes; "
                                     "index again")
        suffixes = self.suffixes
        return SpanPlaces(rows, keys, self.fields[ids].tolist(), lambda m: suffixes[int(ids[m])])

    def _span_1(self, a: int, b: int, rows: np.ndarray) -> SpanPlaces:
        """Format 1: the names are split here."""
        end = int(self.rows["name"][b]) if b < len(self.rows) else len(self.text)
        text = bytes(self.text[int(rows["name"][0]) : end]).decode("utf-8", "surrogateescape")
        names = text.split("\0")[:-1]
        if len(names) != len(rows):
            raise IndexMismatchError(f"member places: {len(names)} names for {len(rows)} members (rows {a} .. "
                                     f"{b - 1}); index again")
        splits = [split_key(name) for name in names]  # the scan kept names with a key
        common: dict[str, str] = {}  # one string per distinct field name
        return SpanPlaces(rows, [splits[f][0] for f in _sample_starts(rows["sample"])],
                          [common.setdefault(f, f) for _, f in splits], lambda m: names[m][len(splits[m][0]) + 1 :])

    def matches(self, shard: int, scanned: ShardPlaces) -> bool:
        """Whether shard ``shard``'s places are those a fresh scan of it found."""
        if self.shards[shard] is None or scanned.names is None:
            return self.shards[shard] is None and scanned.names is None
        span = self._span(int(self.firsts[shard]), int(self.firsts[shard + 1]))
        mine = _as_scanned(span, self.shards[shard])
        return (mine.names == scanned.names and np.array_equal(mine.data, scanned.data)
                and np.array_equal(mine.sizes, scanned.sizes) and np.array_equal(mine.samples, scanned.samples)
                and _keys_in_step(span))

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for key, (path, stamp) in self._files.items():
            state[key] = ("memmap", path, state[key].dtype, stamp)  # mapped again where unpickled, not copied
        return state

    def __setstate__(self, state: dict) -> None:
        for key in ("rows", "text"):
            value = state[key]
            if isinstance(value, tuple) and value and value[0] == "memmap":
                _, path, dtype, stamp = value
                if stat_stamp(os.stat(path)) != stamp:  # another index written over it since it was loaded
                    raise IndexMismatchError(f"member places file {path!r} changed after its index was loaded; "
                                             "load the index again")
                state[key] = _map(path, dtype)
        self.__dict__.update(state)


def _as_scanned(span: SpanPlaces, entry: tuple[int, int, int]) -> ShardPlaces:
    """A whole shard's ``span`` as a scan gives its places (``entry``: its count and stamp)."""
    rows = span.rows
    return ShardPlaces([span.name(m) for m in range(len(rows))], rows["data"].astype(np.int64),
                       rows["size"].astype(np.int64), rows["sample"].astype(np.int64), *entry[1:])


def _keys_in_step(span: SpanPlaces) -> bool:
    """Whether each record of ``span`` points at its own sample's key (format 2: a span is
    read from its first record's key on, so a wrong one mid-shard would cut keys)."""
    rows = span.rows
    if "key" not in rows.dtype.names or not len(rows):
        return True
    lengths = [len(key.encode("utf-8", "surrogateescape")) + 1 for key in span.keys]
    starts = int(rows["key"][0]) + np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)[:-1]])
    numbers = rows["sample"].astype(np.int64)
    return bool(np.array_equal(rows["key"].astype(np.int64), starts[numbers - numbers[0]]))


def _sample_starts(numbers: np.ndarray) -> list[int]:
    """Per sample, the index of its first member, from the members' sample numbers."""
    return np.flatnonzero(np.diff(numbers.astype(np.int64), prepend=-1)).tolist()


def _fields(suffixes: list[str]) -> list[str]:
    """The field names of a suffix table: lowercased, one string per distinct name."""
    common: dict[str, str] = {}
    return [common.setdefault(suffix.lower(), suffix.lower()) for suffix in suffixes]


def _version_json(version: int | str | None) -> dict:
    """A shard's version in the places' JSON: a local file's ``mtime_ns``, a remote object's ``version``."""
    return {"mtime_ns": version} if isinstance(version, int) else {"version": version}


def _version_of(entry: dict) -> int | str | None:
    return int(entry["mtime_ns"]) if "mtime_ns" in entry else entry.get("version")


def stat_stamp(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_size, stat.st_mtime_ns


def _map(path: str, dtype) -> np.ndarray:
    """The file at ``path`` memory-mapped, as a plain array (np.memmap's slices cost ~10 us a span)."""
    if os.path.getsize(path) == 0:
        return np.empty(0, dtype=dtype)
    return np.asarray(np.memmap(path, dtype=dtype, mode="r"))  # the view keeps the mapping

