"""Compressed shards: which compression a shard pattern names, and a plain tar compressed, deterministically.

A shard is written as a plain tar first (members copied or encoded, its sample offsets
taken), then compressed into its final name: gzip (``.tar.gz``, ``.tgz``), bzip2
(``.tar.bz2``), xz (``.tar.xz``) or zstd (``.tar.zst``, the ``[zstd]`` extra): every
compression the readers decompress (:mod:`wds_datapipes.tar.sources`). The bytes depend on
the input and settings alone: gzip's header holds mtime 0 and no file name; bzip2, xz
and zstd store no time.

A compressed stream cannot be entered in the middle, so the index of compressed shards
holds their sample counts and sizes but no sample offsets and no member places (as the
``index`` command writes it for them): readers stream such a shard from its start.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import shutil
from typing import BinaryIO

COMPRESSIONS = ("gzip", "bzip2", "xz", "zstd")
_SUFFIXES = ((".tar.gz", "gzip"), (".tgz", "gzip"), (".tar.bz2", "bzip2"), (".tbz2", "bzip2"),
             (".tar.xz", "xz"), (".txz", "xz"), (".tar.zst", "zstd"), (".tzst", "zstd"))
_CHUNK = 1 << 20


def compression_of(pattern: str) -> str | None:
    """The compression a shard name's suffix names (``.tar.gz`` -> ``"gzip"``); None for a plain tar."""
    lowered = pattern.lower()
    for suffix, kind in _SUFFIXES:
        if lowered.endswith(suffix):
            return kind
    return None


def check_compression(kind: str | None) -> str | None:
    """``kind`` where it is one we write (and can write here), else a ValueError naming the choices."""
    if kind is None:
        return None
    if kind not in COMPRESSIONS:
        raise ValueError(f"unknown compression {kind!r}: one of {', '.join(COMPRESSIONS)} (or none)")
    if kind == "zstd":
        _zstandard()
    return kind


def _zstandard():
    try:
        import zstandard
    except ImportError as exn:
        raise ImportError("writing .tar.zst shards needs the zstandard package: "
                          "pip install 'wds-datapipes[zstd]' (or zstandard)") from exn
    return zstandard


def _writer(kind: str, raw: BinaryIO) -> BinaryIO:
    if kind == "gzip":
        return gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6)
    if kind == "bzip2":
        return bz2.BZ2File(raw, mode="wb", compresslevel=9)
    if kind == "xz":
        return lzma.LZMAFile(raw, mode="wb", preset=6)
    return _zstandard().ZstdCompressor(level=3).stream_writer(raw, closefd=False)


def compress_file(source: str, target: str, kind: str, fsync: bool = True) -> None:
    """Writes ``source``'s bytes compressed with ``kind`` into ``target`` (created or truncated)."""
    with open(source, "rb") as plain, open(target, "wb") as raw:
        with _writer(kind, raw) as out:
            shutil.copyfileobj(plain, out, _CHUNK)
        raw.flush()
        if fsync:
            os.fsync(raw.fileno())


__all__ = ["COMPRESSIONS", "check_compression", "compress_file", "compression_of"]
