"""Writing one shard: its samples' members into ``<name>.part``, then a rename; its index in the same pass.

A field whose value is a :class:`FileBytes` is read by the OS from its file straight into
the shard's reused 1 MB write buffer (``os.readv``), written with the headers around it
1 MB at a time: its bytes never become a Python object. Other values are encoded by
suffix (:func:`~wds_datapipes.decoding.encoding.encode_value`).
While members are written, the shard's scan is filled: where each sample starts, and each
member's data offset and size (its places), so no second read of the shard is needed.

Before its rename, a shard gets a modification time that depends on what it holds, not on
the clock (:func:`shard_mtime`): the members' ``mtime`` setting plus a fraction of a second
drawn from its member names, their sizes and the bytes of the values encoded here. The
index records it as the shard's stamp (:mod:`~wds_datapipes.epochs.places`), so identical
runs write the same index, and a shard written over or edited since (a new mtime) is still
told apart. Files copied by the OS (:class:`FileBytes`) are not read by Python, so their
bytes are not in it: a shard rewritten with the same names and sizes and other file bytes
keeps its stamp (its places stay right; a copy tool that trusts size and mtime would not
copy it again).

A sample that fails half-way (an unreadable file, a value with no encoder, a name the
readers would split into another key) is cut back out of the shard: the shard holds
whole samples only. Then the handler decides: raise (the ``.part`` file is removed), or
skip it, recorded with its reason.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np

from ..epochs.index import ShardScan
from ..epochs.places import ShardPlaces, places_of_members, stat_stamp
from ..errors import ShardWriteError
from ..handlers import Handler, reraise_exception
from ..shards.keys import split_key
from ..tar.build import END, member_header, padding
from ..tar.headers import BLOCK
from .compress import compress_file

# The write buffer: members are gathered and written 1 MB at a time. Measured on 4,000 files of
# 50-150 KB into an ext4 page cache: 57-65 us of system time a file, against 75-91 us for a
# copy_file_range (or a read and a write) a file; 8 MB files 4.4 ms against 5.9
# (benchmarks/results/bench_write-fewer-writes-2026-11-27.md).
_BUFFER = 1 << 20

PROBLEMS = "__problems__"  # an input reader's reasons why a sample cannot be written


# The integer fields' suffixes: decoding.values' _INT, which its encoders write as decimal digits
# (tests/writing/test_encode_without_torch.py compares the two).
_DIGITS = frozenset(("cls", "cls2", "class", "count", "index", "inx", "id"))


def encode_value(suffix: str, value: Any, *, allow_pickle: bool = False) -> bytes:
    """:func:`wds_datapipes.decoding.encoding.encode_value`, imported at the first value that needs
    it: it imports torch and Pillow (2-3 s), which shards of files with text and integer labels
    (a folder, an ImageFolder tree's ``cls``) need neither of. Its first rules are taken here:
    bytes as they are, a str as UTF-8, an int in an integer field as its digits."""
    kind = type(value)
    if kind is bytes:
        return value
    if kind is str:
        return value.encode("utf-8")
    if kind is int and suffix.rpartition(".")[2].lower() in _DIGITS:  # (type is int: not a bool)
        return str(value).encode("ascii")
    return _encoding().encode_value(suffix, value, allow_pickle=allow_pickle)


@functools.cache
def _encoding():
    from ..decoding import encoding

    return encoding


class FileBytes(NamedTuple):
    """A field whose bytes are the file at ``path`` (its ``size``, where known, plans shards by bytes)."""

    path: str
    size: int | None = None


def name_problem(key: object, suffix: str) -> str | None:
    """Why ``key.suffix`` would not read back as this key and suffix, or None where it does.

    The readers split a member name at the first dot of its last path part
    (:func:`~wds_datapipes.shards.grouping.split_key`), so a key with a dot there, an empty
    key or suffix, or a ``__meta__`` name would come back as another sample or none.
    """
    if not isinstance(key, str) or not key:
        return f"the key must be a non-empty string, not {key!r}"
    if not suffix:
        return "an empty field name"
    if _plain_key(key) and "/" not in suffix and "\n" not in suffix:
        return None  # the dot after the key is the name's first in its last part: split_key's own cut
    split = split_key(f"{key}.{suffix}")
    if split != (key, suffix.lower()):
        base = key.rsplit("/", 1)[-1]
        if "." in base and split is not None:
            return (f"the key {key!r} has a dot in its last part: readers would split the member "
                    f"{key}.{suffix!s} into the key {split[0]!r}")
        return f"the member name {key}.{suffix} would not read back as key {key!r}, field {suffix.lower()!r}"
    return None


@functools.lru_cache(maxsize=1024)
def _plain_fields(suffixes: tuple[str, ...]) -> bool:
    """Whether these field names, after a plain key (:func:`_plain_key`), each read back as
    written: some, each non-empty without a slash or newline, none twice lowercased."""
    return bool(suffixes) and all(s and "/" not in s and "\n" not in s for s in suffixes) \
        and len({s.lower() for s in suffixes}) == len(suffixes)


def _plain_key(key: str) -> bool:
    """Whether ``key.<suffix>`` splits back at the dot after the key for any suffix without a
    slash or newline: a last part that is non-empty and has no dot, no newline, no ``__`` start."""
    return not key.startswith("__") and "\n" not in key and "." not in key[key.rfind("/") + 1 :] \
        and not key.endswith("/")


def check_fields(key: object, suffixes: list[str]) -> str | None:
    """Why a sample with ``key`` and these field names cannot be written, or None."""
    if type(key) is str and key and _plain_key(key) and _plain_fields(tuple(suffixes)):
        return None  # the common case, one look at the key: the loop below finds nothing for it
    if not suffixes:
        return "the sample has no fields"
    seen: set[str] = set()
    for suffix in suffixes:
        problem = name_problem(key, suffix)
        if problem is not None:
            return problem
        if suffix.lower() in seen:
            return f"two fields named {suffix.lower()!r} (field names are compared lowercased)"
        seen.add(suffix.lower())
    return None


@dataclass(frozen=True)
class MemberOptions:
    """How members are written: header mtime and mode, pickles, fsync before the rename."""

    mtime: int = 0
    mode: int = 0o444
    allow_pickle: bool = False
    fsync: bool = True
    compression: str | None = None  # gzip, bzip2, xz, zstd (:mod:`.compress`), or a plain tar


@dataclass
class ShardResult:
    """What writing one shard did: its scan (offsets and places), samples written, skips."""

    shard: int
    scan: ShardScan
    written: int
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (input, why)
    mapped: list[str | None] | None = None  # with a map: the key it gave each input (None: none written)


class _Output:
    """A shard file written through one fd and one reused buffer: headers, small members and
    files' bytes (read straight into it by the OS) are gathered there and written 1 MB at a time."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.buffer = memoryview(bytearray(_BUFFER))
        self.used = 0  # bytes in the buffer, not yet written
        self.flushed = 0  # bytes written to the file
        self.pos = 0  # flushed + used

    def write(self, data: bytes) -> None:
        size = len(data)
        if self.used + size > _BUFFER:
            self.flush()
            if size > _BUFFER:
                _write_all(self.fd, data)
                self.pos = self.flushed = self.flushed + size
                return
        self.buffer[self.used:self.used + size] = data
        self.used += size
        self.pos += size

    def flush(self) -> None:
        if self.used:
            _write_all(self.fd, self.buffer[:self.used])
            self.flushed += self.used
            self.used = 0

    def copy_file(self, name: str, path: str, options: MemberOptions) -> tuple[int, int]:
        """Writes a member holding the file at ``path`` (its size as opened); (its data offset, its size)."""
        source = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(source).st_size
            self.write(member_header(name, size, mtime=options.mtime, mode=options.mode))
            if self.used + size > _BUFFER >= size:  # a file that fits a buffer starts one: read in one call
                self.flush()
            at, left = self.pos, size
            while left:
                if self.used == _BUFFER:
                    self.flush()
                got = os.readv(source, [self.buffer[self.used:self.used + min(left, _BUFFER - self.used)]])
                if got == 0:
                    raise OSError(errno.EIO, f"the file ended {left} bytes short of its size {size} "
                                             "(changed while it was copied)")
                self.used += got
                left -= got
            self.pos = at + size
            if size % BLOCK:
                self.write(_ZEROS[: BLOCK - size % BLOCK])
            return at, size
        finally:
            os.close(source)

    def cut_back(self, to: int) -> None:
        """Forgets everything written from byte ``to`` on (a sample that failed half-way)."""
        if to >= self.flushed:
            self.used = to - self.flushed
        else:
            self.used = 0
            os.ftruncate(self.fd, to)
            os.lseek(self.fd, to, os.SEEK_SET)
            self.flushed = to
        self.pos = to

    def close(self, fsync: bool, mtime_ns: int | None = None) -> None:
        """Writes what is buffered, sets the file's modification time to ``mtime_ns`` (before the
        sync, so it reaches the disk with it), syncs where asked, closes."""
        self.flush()
        if mtime_ns is not None:
            set_mtime(self.fd if os.utime in os.supports_fd else self.path, mtime_ns, self.path)
        if fsync:
            os.fsync(self.fd)
        fd, self.fd = self.fd, -1  # closed: a failure after this must not close the number again (reused by then)
        os.close(fd)


def set_mtime(target: int | str, mtime_ns: int, path: str | None = None) -> None:
    """Sets a file's modification time (by fd or path) to ``mtime_ns``; its access time to now
    (a cleaner of old temporary files that goes by access times leaves it alone). Raises
    :class:`ShardWriteError` naming the file (``path``) where the file system refuses."""
    try:
        os.utime(target, ns=(time.time_ns(), mtime_ns))
    except OSError as exn:
        where = path if path is not None else target
        raise ShardWriteError(f"cannot set the file's modification time ({exn.strerror or exn}): the writer gives "
                              "each shard a time drawn from what it holds (its index records it, to tell a shard "
                              "changed since); write the shards to a file system that can set times "
                              "(some network and FUSE mounts cannot)", shard=str(where)) from None


def shard_mtime(mtime: int, names: list[str], sizes: np.ndarray, values_crc: int) -> int:
    """A shard's modification time, in ns: the members' ``mtime`` (seconds) plus a fraction of
    a second from the blake2b digest of its member names, their sizes and ``values_crc`` (a
    CRC-32 of the values encoded here). Shards of other names, sizes or encoded values get
    other times; the same shard, written by any run, the same time."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update("\0".join(names).encode("utf-8", "surrogatepass"))
    digest.update(np.ascontiguousarray(sizes, dtype="<i8").tobytes())
    digest.update(values_crc.to_bytes(4, "little"))
    return mtime * 1_000_000_000 + int.from_bytes(digest.digest(), "little") % 1_000_000_000


def _write_all(fd: int, data: bytes) -> None:
    written = os.write(fd, data)
    if written < len(data):
        with memoryview(data) as view:
            while written < len(data):
                written += os.write(fd, view[written:])


_ZEROS = bytes(BLOCK)


def _loaded(sample: dict) -> dict:
    """The sample with each FileBytes field read into bytes (for a user's map function)."""
    out = dict(sample)
    for name, value in sample.items():
        if isinstance(value, FileBytes):
            with open(value.path, "rb") as stream:
                out[name] = stream.read()
    return out


def write_shard(shard: int, path: str, samples: list[dict], options: MemberOptions = MemberOptions(),
                handler: Handler = reraise_exception, map_fn: Callable[[dict], dict | None] | None = None,
                checked: bool | None = None) -> ShardResult:
    """Writes ``samples`` (dicts with ``__key__``, fields, and optionally ``__source__``
    naming the input) as shard ``path``: into ``path.part``, renamed when complete.
    ``checked``: the samples' names were checked already (:func:`check_fields`)."""
    part = path + ".part"
    out = _Output(part)
    starts: list[int] = []
    members: list[tuple[str, int, int]] = []
    counts: list[int] = []  # members per written sample
    skipped: list[tuple[str, str]] = []
    keys = _Keys()
    given: list[str | None] | None = [] if map_fn is not None else None  # the key the map gave each input
    try:
        for sample in samples:
            key = sample.get("__key__")
            start, kept, last, crc = out.pos, len(members), keys.last, keys.crc
            try:
                wrote = _write_sample(out, sample, key, options, map_fn, members, skipped, checked, keys)
                if len(members) > kept:
                    starts.append(start)
                    counts.append(len(members) - kept)
                if given is not None:
                    given.append(wrote)
            except Exception as exn:  # noqa: BLE001 (any failure of one sample: cut it out, then the handler decides)
                source = str(sample.get("__source__", key))
                out.cut_back(start)
                del members[kept:]
                del keys.suffixes[kept:]
                keys.last, keys.crc = last, crc
                error = exn if isinstance(exn, ShardWriteError) else ShardWriteError(
                    f"{type(exn).__name__}: {exn}", shard=path, key=key if isinstance(key, str) else None,
                    source=source)
                handler(error)
                skipped.append((source, error.reason or str(error)))
                if given is not None:
                    given.append(None)
        out.write(END)
        count = len(members)  # (itemgetter, not zip(*members): no iterator a member for the collector to count)
        names = list(map(itemgetter(0), members))
        sizes = np.fromiter(map(itemgetter(2), members), np.int64, count)
        when = shard_mtime(options.mtime, names, sizes, keys.crc)
        out.close(options.fsync and options.compression is None, when if options.compression is None else None)
        if options.compression is not None:
            compress_file(part, part + ".z", options.compression, options.fsync)
            set_mtime(part + ".z", when, part + ".z")  # after its sync: a crash that loses it leaves a shard the record does not match
            os.replace(part + ".z", part)
    except BaseException:
        if out.fd >= 0:
            try:
                os.close(out.fd)
            except OSError:
                pass
        _remove(part)
        _remove(part + ".z")
        raise
    stamp = stat_stamp(os.stat(part))
    os.replace(part, path)  # the atomic publish: a reader sees the whole shard or none
    if options.compression is not None:  # no offsets nor places: a compressed stream is read from its start
        scan = ShardScan(path, len(starts), stamp[0], None)
    else:
        scan = ShardScan(path, len(starts), stamp[0], np.asarray(starts, dtype=np.int64),
                         places=_places(path, members, names, sizes, counts, stamp, keys))
    return ShardResult(shard, scan, len(starts), skipped, given)


class _Keys:
    """Whether the members written so far make places without a second look at their names:
    every name checked (:func:`check_fields`) and each sample's key other than the one before;
    and the names' parts as written: each written sample's key, each member's suffix."""

    def __init__(self):
        self.plain = True
        self.crc = 0  # a CRC-32 of the values encoded here, in order (for the shard's time: shard_mtime)
        self.last: object = None  # the key of the last sample written
        self.written: list[str] = []
        self.suffixes: list[str] = []
        self.mapped: dict[str, str] = {}  # with a map: the keys it gave in this shard, and their inputs

    def add(self, key: object, checked: bool) -> None:
        self.plain = self.plain and checked and key != self.last
        self.last = key


def _places(path: str, members: list[tuple[str, int, int]], names: list[str], sizes: np.ndarray,
            counts: list[int], stamp: tuple[int, int], keys: _Keys) -> ShardPlaces:
    """The shard's member places, as :func:`places_of_members` takes them from its members; built
    straight from the members (their ``names`` and ``sizes`` taken out already) where their names
    were checked and keys change from sample to sample (the same places: every name splits into
    its sample's key and a suffix of its own)."""
    if not keys.plain:
        return places_of_members(path, members, stamp)
    return ShardPlaces(names, np.fromiter(map(itemgetter(1), members), np.int64, len(members)), sizes,
                       np.repeat(np.arange(len(counts), dtype=np.int64), counts), *stamp,
                       keys=keys.written, suffixes=keys.suffixes)


def _write_sample(out: _Output, sample: dict, key: Any, options: MemberOptions, map_fn, members: list,
                  skipped: list, checked: bool | None, keys: _Keys) -> str | None:
    """Writes one sample's members; the key written (None where the map left it out)."""
    if map_fn is not None:
        source = str(sample.get("__source__", key))
        mapped = map_fn(_loaded(sample))
        if mapped is None:
            skipped.append((source, "left out by the map function"))
            return None
        sample, key = mapped, mapped.get("__key__", key)
    fields = [name for name in sample if not name.startswith("_")]
    check = map_fn is not None or checked is None
    problem = check_fields(key, fields) if check else None
    if problem is None and map_fn is not None and key in keys.mapped:  # the writer checked the input's keys
        problem = (f"the map gave it the key {key!r}, which it gave {keys.mapped[key]!r} before in this shard "
                   "(keys must be unique: readers would merge or repeat them)")
    if problem is not None:  # (the writer checked the input's names: only a map's output needs it)
        raise ShardWriteError(problem, key=key if isinstance(key, str) else None,
                              source=source if map_fn is not None else str(sample.get("__source__", key)))
    keys.add(key, check or bool(checked))
    mtime, mode = options.mtime, options.mode
    for suffix in fields:
        name = f"{key}.{suffix}"
        value = sample[suffix]
        if isinstance(value, FileBytes):
            at, size = out.copy_file(name, value.path, options)
        else:
            data = encode_value(suffix, value, allow_pickle=options.allow_pickle)
            keys.crc = zlib.crc32(data, keys.crc)
            size = len(data)
            header = member_header(name, size, mtime=mtime, mode=mode)
            at = out.pos + len(header)
            out.write(b"".join((header, data, padding(size))))
        members.append((name, at, size))
        keys.suffixes.append(suffix)
    if fields:  # written whole (a failure above leaves it out)
        keys.written.append(key)
        if map_fn is not None:
            keys.mapped[key] = source
        return key
    return None


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


__all__ = ["FileBytes", "MemberOptions", "ShardResult", "check_fields", "name_problem", "write_shard"]
