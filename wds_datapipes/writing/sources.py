"""Inputs as samples for :func:`~wds_datapipes.writing.write_shards`: folder trees, ImageFolder
trees, JSONL/CSV manifests and existing shards.

Each yields sample dicts in a deterministic order (sorted names, manifest order, shard
order), with ``__source__`` naming the input in errors and in the report. Files become
:class:`~wds_datapipes.writing.shard_file.FileBytes` fields (copied by the OS, never read
here). An input that cannot become a proper sample (two files for one field of a key, a
manifest line without a key) carries its reasons in ``__problems__``: the writer hands
those to its handler (an error naming the input, or a listed skip).
"""

from __future__ import annotations

import csv
import fnmatch
import json
import os
from collections.abc import Iterable, Iterator, Sequence

from ..shards.grouping import group_members
from ..shards.listing import expand_url_spec
from ..shards.openers import list_urls, open_shard
from ..storage.cloud_settings import PipelineStores, StoreArg, with_stores
from ..tar import iter_tar_members
from .shard_file import PROBLEMS, FileBytes


def _files(root: str) -> Iterator[tuple[str, os.DirEntry]]:
    """(path relative to ``root``, entry) of every file under ``root``, sorted, hidden ones left out."""
    with os.scandir(root) as scan:
        entries = sorted(scan, key=lambda e: e.name)
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if entry.is_dir(follow_symlinks=True):
            for relative, inner in _files(entry.path):
                yield os.path.join(entry.name, relative), inner
        elif entry.is_file(follow_symlinks=True):
            yield entry.name, entry


def read_fields_file(path: str, names: Sequence[str]) -> dict[str, dict]:
    """Per key, its fields from a whitespace-separated list file (``key v1 v2 ...``, ``#`` comments:
    the Oxford-IIIT Pets ``annotations/list.txt``), as text: a column named ``cls`` reads
    back as an int, any other as its suffix's decoder reads it."""
    fields: dict[str, dict] = {}
    with open(path) as lines:
        for line in lines:
            parts = line.split()
            if not parts or parts[0].startswith("#"):
                continue
            fields[parts[0]] = dict(zip(names, parts[1:]))
    return fields


def folder_samples(root: str, *, extensions: Iterable[str] | None = None, fields_file: str | None = None,
                   field_names: Sequence[str] = ()) -> Iterator[dict]:
    """Samples of files grouped by basename across a tree (``images/a.jpg`` and
    ``annotations/trimaps/a.png`` make sample ``a`` with fields ``jpg`` and ``png``), in
    key order; the suffix is what follows the basename's first dot. ``extensions``: only
    files whose suffix is one of these. ``fields_file`` (with ``field_names``): more fields
    per key from a list file."""
    wanted = None if extensions is None else {e.lower().lstrip(".") for e in extensions}
    skip = os.path.abspath(fields_file) if fields_file else None
    groups: dict[str, dict] = {}
    for relative, entry in _files(root):
        if skip is not None and os.path.abspath(entry.path) == skip:
            continue
        key, dot, suffix = entry.name.partition(".")
        if not dot:
            continue
        if wanted is not None and suffix.lower() not in wanted:
            stem, _, extension = entry.name.rpartition(".")
            if extension.lower() in wanted:  # a dot in the basename (photo.v2.jpg): not silently left out
                why = (f"a dot in its basename: readers would split {entry.name!r} into the key {key!r} and the "
                       f"field {suffix.lower()!r}, not the key {stem!r} and the field {extension.lower()!r}")
                groups.setdefault(stem, {"__key__": stem, "__source__": os.path.join(root, relative), PROBLEMS: [why]})
            continue
        sample = groups.setdefault(key, {"__key__": key, "__source__": os.path.join(root, relative)})
        if suffix.lower() in sample:
            sample.setdefault(PROBLEMS, []).append(
                f"two files for field {suffix.lower()!r}: {sample[suffix.lower()].path} and {entry.path}")
            continue
        sample[suffix.lower()] = FileBytes(entry.path, entry.stat().st_size)
    extra = read_fields_file(fields_file, field_names) if fields_file else {}
    for key in sorted(groups):
        sample = groups[key]
        sample.update(extra.get(key, {}))
        yield sample


def imagefolder_samples(root: str) -> Iterator[dict]:
    """Samples of an ImageFolder tree: each subfolder a class (numbered in sorted order, as
    torchvision does), each file in it a sample ``<class>/<name>`` with its image field and
    ``cls``. A file name with more than one dot makes a key with a dot: reported as a bad
    input by the writer."""
    with os.scandir(root) as scan:
        classes = sorted(e.name for e in scan if e.is_dir() and not e.name.startswith("."))
    for number, name in enumerate(classes):
        for relative, entry in _files(os.path.join(root, name)):
            stem, dot, extension = relative.rpartition(".")
            if not dot:
                continue
            yield {"__key__": f"{name}/{stem}", "__source__": entry.path,
                   extension.lower(): FileBytes(entry.path, entry.stat().st_size), "cls": number}


def manifest_samples(path: str) -> Iterator[dict]:
    """Samples of a JSONL or CSV manifest: one line a sample, its key in ``__key__`` or
    ``key``; a column ``<suffix>_path`` names a file (relative to the manifest) that
    becomes field ``<suffix>``; other columns are values, encoded by their suffix."""
    base = os.path.dirname(os.path.abspath(path))
    if path.endswith(".csv"):
        with open(path, newline="") as stream:
            rows: Iterable = list(csv.DictReader(stream))
        lines = ((f"{path}:{n + 2}", row) for n, row in enumerate(rows))
    else:
        lines = _jsonl(path)
    for where, row in lines:
        if not isinstance(row, dict):
            yield {"__source__": where, PROBLEMS: [f"not a JSON object: {row!r}"]}
            continue
        key = row.get("__key__", row.get("key"))
        sample: dict = {"__key__": key, "__source__": where}
        if key in (None, ""):
            sample[PROBLEMS] = ["no key (a __key__ or key column)"]
        for name, value in row.items():
            if name in ("__key__", "key") or value in (None, ""):
                continue
            if name.endswith("_path"):
                file = os.path.join(base, str(value))
                try:
                    sample[name[:-5]] = FileBytes(file, os.stat(file).st_size)
                except OSError as exn:
                    sample.setdefault(PROBLEMS, []).append(f"field {name[:-5]!r}: cannot read {file!r} "
                                                           f"({exn.strerror or exn})")
            else:
                sample[name] = value
        yield sample


def _jsonl(path: str) -> Iterator[tuple[str, object]]:
    with open(path) as lines:
        for number, line in enumerate(lines, 1):
            if line.strip():
                try:
                    yield f"{path}:{number}", json.loads(line)
                except ValueError as exn:
                    yield f"{path}:{number}", f"bad JSON ({exn})"


def shard_samples(specs: Iterable[str], keys: str | None = None, where: Sequence[str] = (),
                  select: Sequence[str] | None = None, store: StoreArg = None) -> Iterator[dict]:
    """The samples of existing shards (URL specs: braces, globs, folders; several are
    concatenated in their order), in shard order, their fields as bytes. ``keys``: only keys
    matching this glob; ``where``: only samples passing each test (``name``: it has the
    field; ``name=value``: the field's text is ``value``; ``name!=value``); ``select``: only
    these fields (a sample left without any is dropped). ``store``: object-store settings
    for the ``s3://``, ``gs://``, ``az://`` shards (a glob or prefix of them is listed), as
    ``ShardLister``'s."""
    tests = [_field_test(text) for text in where]
    stores = PipelineStores.of(store)
    for spec in specs:
        for expanded in expand_url_spec(spec):
            for url in list_urls(with_stores(expanded, stores)):
                stream = open_shard(url)
                try:
                    for sample in group_members(url, iter_tar_members(stream, url)):
                        if keys is not None and not fnmatch.fnmatchcase(sample["__key__"], keys):
                            continue
                        if not all(test(sample) for test in tests):
                            continue
                        if select is not None:
                            sample = {k: v for k, v in sample.items() if k.startswith("_") or k in select}
                            if all(k.startswith("_") for k in sample):
                                continue
                        sample["__source__"] = f"{url}:{sample['__key__']}"
                        del sample["__url__"]
                        yield sample
                finally:
                    stream.close()


def _field_test(text: str):
    """A test of a sample's fields: ``name`` (present), ``name=value`` or ``name!=value`` (its UTF-8 text)."""
    for operator in ("!=", "="):
        name, found, value = text.partition(operator)
        if found:
            name = name.strip().lower()
            if operator == "=":
                return lambda sample: name in sample and _text(sample[name]) == value
            return lambda sample: name not in sample or _text(sample[name]) != value
    name = text.strip().lower()
    return lambda sample: name in sample


def _text(value: object) -> str:
    return bytes(value).decode("utf-8", "replace").strip() if isinstance(value, (bytes, bytearray, memoryview)) \
        else str(value)


__all__ = ["folder_samples", "imagefolder_samples", "manifest_samples", "read_fields_file", "shard_samples"]
