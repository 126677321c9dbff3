"""The shard index: each shard's URL and number of samples, and where each sample starts.

The JSON file is webdataset's ``wids`` format, so an index made by either tool works in
both::

    {"wids_version": 1,
     "shardlist": [{"url": "train-000000.tar", "nsamples": 1000, "filesize": 10485760}, ...],
     "wds_datapipes": {"offsets": "index.offsets", "dtype": "<u4", "unit": 512}}

Relative URLs are relative to the index's own location (as in wids). The optional
offsets file lies beside the JSON: one little-endian uint32 per sample, in shard order,
giving the tar block (512 bytes) at which the sample's first header starts; 0xFFFFFFFF
where a shard cannot be entered in the middle (gzip). Four bytes a sample: 4 GB for 10^9
samples, memory-mapped, so a reader touches only the pages it needs. A reader then
starts mid-shard with one seek or one HTTP Range request.

A sample is counted as the readers count them (:func:`wds_datapipes.shards.grouping.group_members`):
a run of members sharing a key, ``__meta__`` members and names without a dot left out.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import posixpath
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ..errors import IndexMismatchError, ShardOpenError, WdsError
from ..shards.keys import split_key
from ..shards.openers import LocalPath, open_shard, open_source, stream_size, url_scheme
from ..storage.cloud_settings import PipelineStores, StoreArg, with_stores
from ..tar import iter_tar_places
from .places import MemberPlaces, ShardPlaces, places_of_members, shard_stamp

WIDS_VERSION = 1
OFFSET_DTYPE = np.dtype("<u4")
OFFSET_UNIT = 512
NO_OFFSET = 0xFFFFFFFF


@dataclass(frozen=True)
class ShardInfo:
    """One shard of an index: its URL as written in the index, its samples and bytes."""

    url: str
    nsamples: int
    filesize: int | None = None


@dataclass
class ShardScan:
    """What reading one shard's headers found: samples, their offsets, keys seen twice."""

    url: str
    nsamples: int
    filesize: int | None
    offsets: np.ndarray | None  # bytes; None for a shard that cannot be entered mid-way
    repeated_keys: list[tuple[str, str]] = field(default_factory=list)  # (key, member)
    keys: list[str] | None = None  # every key, when asked for
    places: ShardPlaces | None = None  # its member places, when asked for

    def to_json(self) -> dict:
        """A JSON-able form (an interrupted ``index`` or writer run keeps its scans in it)."""
        offsets = None
        if self.offsets is not None:
            offsets = base64.b64encode((self.offsets // OFFSET_UNIT).astype("<u4").tobytes()).decode()
        places = None if self.places is None else self.places.to_json()
        return {"url": str.__str__(self.url), "nsamples": self.nsamples, "filesize": self.filesize,
                "offsets": offsets, "places": places}

    @classmethod
    def from_json(cls, entry: dict) -> ShardScan:
        """The scan :meth:`to_json` wrote."""
        offsets = None
        if entry["offsets"] is not None:
            offsets = np.frombuffer(base64.b64decode(entry["offsets"]), dtype="<u4").astype(np.int64) * OFFSET_UNIT
        places = None if entry.get("places") is None else ShardPlaces.from_json(entry["places"])
        return cls(entry["url"], entry["nsamples"], entry["filesize"], offsets, places=places)


def scan_shard(url: str, keys: bool = False, places: bool = False) -> ShardScan:
    """Reads a shard's tar headers (never its payloads) and counts its samples (and takes
    its member places, see :mod:`wds_datapipes.epochs.places`)."""
    stream = open_shard(url)
    try:
        filesize = stream_size(stream)
        stamp = shard_stamp(stream, url) if places else None  # before the headers: a later change is seen
        starts: list[int | None] = []
        repeated: list[tuple[str, str]] = []
        seen: set[str] = set()
        previous = None
        members: list[tuple[str, int | None, int]] = []
        for name, offset, data, size in iter_tar_places(stream, url):
            if places:
                members.append((name, data, size))
            split = split_key(name)
            if split is None or split[0] == previous:
                continue
            previous = split[0]
            if previous in seen:
                repeated.append((previous, name))
            seen.add(previous)
            starts.append(offset)
    finally:
        stream.close()
    offsets = None if (starts and starts[0] is None) else np.asarray(starts, dtype=np.int64)
    return ShardScan(url, len(starts), filesize, offsets, repeated, list(seen) if keys else None,
                     places_of_members(url, members, stamp) if places else None)


class ShardIndex:
    """The shards of a dataset, their sample counts, and (optionally) each sample's offset.

    Args:
        shards: the shards, in dataset order.
        base: the index's location; relative shard URLs are read against it.
        offsets: per sample, in shard order, its byte offset (``-1`` where a shard cannot
            be entered mid-way); or None.
        places: where each member's bytes lie (:mod:`wds_datapipes.epochs.places`), or None.
        allow_pipe: let shard URLs of the index be ``pipe:`` commands. An index is data, often
            from elsewhere, so by default it cannot run commands.

    Example:
        >>> index = ShardIndex.load("data/index.json")
        >>> index.total, index.sizes[:3]
    """

    def __init__(self, shards: Sequence[ShardInfo], *, base: str | None = None,
                 offsets: np.ndarray | None = None, allow_pipe: bool = False,
                 places: MemberPlaces | None = None):
        self.shards = list(shards)
        self.base = base
        self.allow_pipe = allow_pipe
        self.sizes = np.asarray([s.nsamples for s in self.shards], dtype=np.int64)
        if (self.sizes < 0).any():
            raise ValueError("nsamples must be >= 0")
        self.firsts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]) if len(self.sizes) else self.sizes
        self._offsets_file: str | None = None
        self._offsets: np.ndarray | None = None
        self.places = places
        if offsets is not None:
            self._set_offsets(np.asarray(offsets))
        self._urls = [self._resolve(s.url) for s in self.shards]

    # ------------------------------------------------------------ reading and writing

    @classmethod
    def load(cls, location: str, *, allow_pipe: bool = False, store: StoreArg = None) -> ShardIndex:
        """Reads an index (a local path or any URL a shard opener handles) and its offsets;
        ``store``: object-store settings for it and its shards (:meth:`with_store`)."""
        stores = PipelineStores.of(store)
        try:
            data = _read_bytes(with_stores(location, stores))
        except ShardOpenError as exn:
            raise WdsError(f"cannot read the index {location!r}: {exn.reason or exn}") from None
        try:
            spec = json.loads(data)
        except ValueError as exn:
            raise WdsError(f"{location!r} is not an index: {_what_it_is(data, exn)}; an index is the JSON file "
                           "that python -m wds_datapipes index writes (webdataset's wids format)") from None
        if not isinstance(spec, dict) or spec.get("wids_version") != WIDS_VERSION:
            raise WdsError(f"index {location!r}: not a wids index (wids_version {WIDS_VERSION})")
        if spec.get("datasets"):
            raise WdsError(f"index {location!r}: sub-datasets ('datasets') are not supported; "
                           "list the shards in 'shardlist'")
        try:
            shards = [ShardInfo(str(s["url"]), int(s["nsamples"]),
                                None if s.get("filesize") is None else int(s["filesize"]))
                      for s in spec.get("shardlist", [])]
        except (KeyError, TypeError, ValueError) as exn:
            raise WdsError(f"index {location!r}: a shard entry lacks url or nsamples ({exn!r})") from None
        base = _base_of(location)
        if spec.get("base"):
            base = _join(base, str(spec["base"]).rstrip("/") + "/")
        index = cls(shards, base=base, allow_pipe=allow_pipe)
        extra = spec.get("wds_datapipes") or {}
        if extra.get("offsets"):
            index._attach_offsets(with_stores(_join(_base_of(location), extra["offsets"]), stores), extra, location)
        if extra.get("places") and url_scheme(location) == "file":  # memory-mapped: local indexes only
            index.places = MemberPlaces.load(_base_of(location), extra["places"], [s.nsamples for s in shards],
                                             location)
        return index.with_store(stores)

    def with_store(self, store: StoreArg) -> ShardIndex:
        """This index read with a pipeline's own object-store settings: a copy whose ``s3://``,
        ``gs://`` and ``az://`` shard URLs carry them (``ShardLister``'s ``store``); this
        index itself where ``store`` is None. What it saves is unchanged (no settings in it)."""
        stores = PipelineStores.of(store)
        if stores is None:
            return self
        carried = copy.copy(self)
        carried._urls = [with_stores(url, stores) for url in self._urls]
        return carried

    def save(self, path: str, *, offsets: bool = True) -> None:
        """Writes the JSON index, and beside it the offsets file (when there are offsets) and
        the member places' files (when there are places)."""
        spec: dict = {"wids_version": WIDS_VERSION, "shardlist": [
            {"url": s.url, "nsamples": s.nsamples, **({"filesize": s.filesize} if s.filesize is not None else {})}
            for s in self.shards
        ]}
        folder = os.path.dirname(path) or "."
        stem = os.path.splitext(os.path.basename(path))[0]
        extra: dict = {}
        offsets_array = self.offsets_array() if offsets else None
        if offsets_array is not None:
            blocks = np.where(offsets_array < 0, NO_OFFSET, offsets_array // OFFSET_UNIT)
            if (offsets_array[offsets_array >= 0] % OFFSET_UNIT).any() or (blocks > NO_OFFSET).any():
                raise ValueError("offsets must be multiples of 512 below 2 TiB")
            _write_atomically(os.path.join(folder, stem + ".offsets"), blocks.astype(OFFSET_DTYPE).tobytes())
            extra.update({"offsets": stem + ".offsets", "dtype": OFFSET_DTYPE.str, "unit": OFFSET_UNIT})
        if self.places is not None:
            extra["places"], files = self.places.files(stem)
            for name, data in files.items():
                _write_atomically(os.path.join(folder, name), data)
        if extra:
            spec["wds_datapipes"] = extra
        _write_atomically(path, (json.dumps(spec, indent=1) + "\n").encode())

    def _attach_offsets(self, location: str, extra: dict, index_location: str) -> None:
        if extra.get("dtype", OFFSET_DTYPE.str) != OFFSET_DTYPE.str or extra.get("unit", OFFSET_UNIT) != OFFSET_UNIT:
            raise WdsError(f"index {index_location!r}: unknown offsets format {extra!r}")
        if url_scheme(location) == "file" and os.path.exists(location):
            self._offsets_file = location
            blocks = np.memmap(location, dtype=OFFSET_DTYPE, mode="r")
        else:
            blocks = np.frombuffer(_read_bytes(location), dtype=OFFSET_DTYPE)
        if len(blocks) != self.total:
            raise IndexMismatchError(f"index {index_location!r}: its offsets file {location!r} holds "
                                     f"{len(blocks)} offsets for {self.total} samples")
        self._offsets = blocks

    def _set_offsets(self, offsets: np.ndarray) -> None:
        if len(offsets) != self.total:
            raise ValueError(f"{len(offsets)} offsets for {self.total} samples")
        blocks = np.where(offsets < 0, NO_OFFSET, offsets // OFFSET_UNIT).astype(OFFSET_DTYPE)
        self._offsets = blocks

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if self._offsets_file is not None:
            state["_offsets"] = None  # memory-mapped again where it is unpickled, not copied
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self._offsets_file is not None and self._offsets is None:
            self._offsets = np.memmap(self._offsets_file, dtype=OFFSET_DTYPE, mode="r")

    # ------------------------------------------------------------ questions

    def __repr__(self) -> str:
        return f"ShardIndex({self.base or '(in memory)'!r}, {len(self):,} shards, {self.total:,} samples)"

    def __len__(self) -> int:
        return len(self.shards)

    @property
    def total(self) -> int:
        """The number of samples in all the shards."""
        return int(self.sizes.sum())

    @property
    def has_offsets(self) -> bool:
        """Whether the index holds each sample's byte offset (readers can then start mid-shard)."""
        return self._offsets is not None

    def url(self, shard: int) -> str:
        """Shard ``shard``'s URL, ready to open (relative ones read against the index)."""
        return self._urls[shard]

    def sample_offset(self, shard: int, sample: int) -> int | None:
        """The byte at which sample ``sample`` of shard ``shard`` starts, if the index knows it."""
        if self._offsets is None:
            return None
        if not 0 <= sample < self.sizes[shard]:
            raise IndexError(f"shard {shard} has {self.sizes[shard]} samples, not {sample + 1}")
        block = int(self._offsets[int(self.firsts[shard]) + sample])
        return None if block == NO_OFFSET else block * OFFSET_UNIT

    def offsets_array(self) -> np.ndarray | None:
        """All offsets in bytes (``-1`` where unknown), or None."""
        if self._offsets is None:
            return None
        blocks = np.asarray(self._offsets, dtype=np.int64)
        return np.where(blocks == NO_OFFSET, -1, blocks * OFFSET_UNIT)

    def _resolve(self, url: str) -> str:
        if url_scheme(url) == "pipe":
            if not self.allow_pipe:
                raise WdsError(f"index shard {url!r} is a pipe: command; an index runs none unless "
                               "loaded with allow_pipe=True")
            return url
        if url_scheme(url) != "file" or url.startswith("file://"):
            return url  # a URL: http(s)://, ais://, file://
        if self.base is not None and url_scheme(self.base) != "file":
            return _join(self.base, url)  # a relative name in an index read over the network
        if self.base is not None and not os.path.isabs(url):
            url = os.path.join(self.base, url)
        return LocalPath(os.path.normpath(url))  # a path: never a command, whatever its name

    # ------------------------------------------------------------ building

    @classmethod
    def from_scans(cls, scans: Sequence[ShardScan], *, relative_to: str | None = None) -> ShardIndex:
        """An index of scanned shards; URLs written relative to ``relative_to`` where local."""
        shards = [ShardInfo(_relative(s.url, relative_to), s.nsamples, s.filesize) for s in scans]
        base = os.path.dirname(os.path.abspath(relative_to)) if relative_to else None
        offsets = None
        if any(s.offsets is not None for s in scans):  # gzipped shards among them get -1s
            offsets = np.concatenate([s.offsets if s.offsets is not None else np.full(s.nsamples, -1)
                                      for s in scans])
        places = None
        if scans and all(s.places is not None for s in scans):
            places = MemberPlaces.from_shards([s.places for s in scans])
        return cls(shards, base=base, offsets=offsets, allow_pipe=True, places=places)


def build_index(urls: Iterable[str], *, jobs: int = 8, done: dict[str, ShardScan] | None = None,
                on_scan: Callable[[ShardScan], None] | None = None, places: bool = False,
                failed: dict[str, WdsError] | None = None, store: StoreArg = None) -> list[ShardScan]:
    """Scans shards ``jobs`` at a time; ``done`` holds scans from an earlier, interrupted run.

    ``places``: take each shard's member places too (scans in ``done`` without them are
    scanned again). ``failed``: where to put the error of each shard that cannot be read
    (they are left out of the result); without it, the first such error is raised. ``store``:
    object-store settings for these URLs, ahead of the process's (as ``ShardLister``'s).
    """
    stores = PipelineStores.of(store)
    urls = [with_stores(url, stores) for url in urls]
    done = {u: s for u, s in (done or {}).items() if s.places is not None or not places}
    todo = [u for u in urls if u not in done]

    def scan(url: str) -> ShardScan | WdsError:
        try:
            return scan_shard(url, places=places)
        except WdsError as exn:
            if failed is None:
                raise
            return exn

    with ThreadPoolExecutor(max(1, jobs), thread_name_prefix="wds-index") as pool:
        for url, result in zip(todo, pool.map(scan, todo)):
            if isinstance(result, WdsError):
                failed[url] = result
                continue
            done[result.url] = result
            if on_scan is not None:
                on_scan(result)
    return [done[u] for u in urls if u in done]


# ------------------------------------------------------------ helpers


def _what_it_is(data: bytes, error: ValueError) -> str:
    """What a file that is not JSON holds, for the message that says so."""
    if data[257:262] == b"ustar" or (len(data) >= 512 and data[148:156].strip(b" \0").isdigit()):
        return "it is a tar archive (a shard: inspect shows its members)"
    for magic, kind in ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd")):
        if data.startswith(magic):
            return f"it is {kind}-compressed data (a compressed shard?)"
    if not data.strip():
        return "it is empty"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return "it holds binary data, not JSON text"
    return f"its text is not JSON ({error})"


def _read_bytes(location: str) -> bytes:
    stream = open_source(location)  # an index and its side files: read once, from the source, never cached
    try:
        chunks = []
        while chunk := stream.read(1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        stream.close()


def _base_of(location: str) -> str:
    if url_scheme(location) == "file":
        path = location.removeprefix("file://")
        return os.path.dirname(os.path.abspath(path))
    return location.rsplit("/", 1)[0] + "/"


def _join(base: str, url: str) -> str:
    if url_scheme(base) == "file" and url_scheme(url) == "file":
        return os.path.join(base, url)
    if url_scheme(url) != "file" or url.startswith("pipe:"):
        return url
    base = base if base.endswith("/") else base + "/"
    scheme = url_scheme(base)
    if scheme not in urllib.parse.uses_relative:  # ais://, s3://, ...: urljoin would drop the base
        return scheme + urllib.parse.urljoin("http" + base[len(scheme):], posixpath.normpath(url))[4:]
    return urllib.parse.urljoin(base, posixpath.normpath(url))


def _relative(url: str, index_path: str | None) -> str:
    """A local shard's path relative to the index's folder (``./`` kept where the name
    alone would read as a URL); other URLs as they are."""
    if index_path is None or url_scheme(url) != "file" or url.startswith("file://"):
        return str.__str__(url)
    path = str.__str__(url) if not isinstance(url, LocalPath) else url[url.prefix_length :]
    relative = os.path.relpath(os.path.abspath(path), os.path.dirname(os.path.abspath(index_path)))
    if url_scheme(relative) != "file" or relative.startswith("pipe:"):
        relative = "./" + relative
    return relative


def _write_atomically(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as out:
        out.write(data)
    os.replace(tmp, path)


def check_scan_against(info: ShardInfo, url: str, scan: ShardScan) -> list[str]:
    """What differs between an index entry and a fresh scan of its shard."""
    problems = []
    if scan.nsamples != info.nsamples:
        problems.append(f"shard {url!r} has {scan.nsamples} samples, the index says {info.nsamples}")
    if info.filesize is not None and scan.filesize is not None and scan.filesize != info.filesize:
        problems.append(f"shard {url!r} has {scan.filesize} bytes, the index says {info.filesize}")
    for key, member in scan.repeated_keys:
        problems.append(f"shard {url!r}: key {key!r} comes back at member {member!r} after other keys")
    return problems


__all__ = [
    "ShardIndex",
    "ShardInfo",
    "ShardScan",
    "build_index",
    "check_scan_against",
    "scan_shard",
]
