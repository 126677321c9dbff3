"""Parquet files as samples: img2dataset's and Hugging Face's outputs, read with pyarrow (the ``[parquet]`` extra).

Each file is read one row group at a time (the next one read by a thread while this one's
rows are written: at most two in memory), and only the columns used (the key column and
the fields asked for): a file is never in memory whole, and its other columns are never
read. A row becomes a sample: its key from the key column (``key`` or ``__key__`` by
default; else ``<file stem>/<row number>``), one field per column:

- a binary column (img2dataset's ``jpg``): its bytes;
- a struct of ``bytes`` and ``path`` (Hugging Face's ``Image()``): the bytes, else the
  file at ``path`` (relative to the Parquet file); not renamed, the field is named by the
  path's extension (``image`` with path ``0001.jpg`` becomes field ``jpg``);
- a string column named ``<suffix>_path``: the file it names, as field ``<suffix>``;
- text: UTF-8; numbers and booleans: their text (``cls`` reads back as an int); lists and
  other structs: JSON;
- a null: no field (``require=`` then reports the sample).

``columns`` picks and renames: ``["jpg", "caption:txt", "image:png"]``. The samples go to
:func:`~wds_datapipes.writing.write_shards` like any others: each goes to the one worker
process that writes its shard, never to every worker.
"""

from __future__ import annotations

import functools
import glob
import json
import os
from collections.abc import Iterable, Iterator, Sequence

from ..threads import ordered_map, worker_threads
from .shard_file import PROBLEMS, FileBytes

PARQUET_SUFFIXES = (".parquet", ".parq")
_BATCH = 1024


def _pyarrow_parquet():
    try:
        import pyarrow.parquet as pq
    except ImportError as exn:
        raise ImportError("reading Parquet input needs pyarrow: pip install 'wds-datapipes[parquet]' "
                          "(or pyarrow)") from exn
    return pq


def parquet_files(specs: Iterable[str]) -> list[str]:
    """The Parquet files of ``specs`` (files, folders of ``*.parquet``, globs), each spec's in sorted order."""
    files: list[str] = []
    for spec in specs:
        if os.path.isdir(spec):
            files += sorted(os.path.join(spec, n) for n in os.listdir(spec) if n.endswith(PARQUET_SUFFIXES))
        elif any(c in spec for c in "*?["):
            files += sorted(glob.glob(spec))
        else:
            files.append(spec)
    return files


def parquet_rows(specs: Iterable[str]) -> int:
    """How many rows the files hold, from their footers alone (for a progress bar's ETA)."""
    pq = _pyarrow_parquet()
    return sum(pq.ParquetFile(path).metadata.num_rows for path in parquet_files(specs))


def _columns(names: Sequence[str], columns: Sequence[str] | None, key: str | None) -> tuple[str | None, dict]:
    """(the key column, {column: field name or None to name it by its path's extension})."""
    if key is None:
        key = next((name for name in ("__key__", "key") if name in names), None)
    elif key not in names:
        raise ValueError(f"no key column {key!r}: the file has {list(names)}")
    fields: dict[str, str | None] = {}
    for spec in columns if columns is not None else [n for n in names if n != key]:
        column, _, field = spec.partition(":")
        if column not in names:
            raise ValueError(f"no column {column!r}: the file has {list(names)}")
        fields[column] = field or None
    return key, fields


def parquet_samples(specs: Iterable[str], *, columns: Sequence[str] | None = None,
                    key: str | None = None) -> Iterator[dict]:
    """Samples of the rows of Parquet files (files, folders, globs), in file and row order,
    read a row group at a time, projected to the key column and ``columns``
    (``"name"`` or ``"name:field"``; default: every column)."""
    pq = _pyarrow_parquet()
    for path in parquet_files(specs):
        reader = pq.ParquetFile(path)
        try:
            key_column, fields = _columns(reader.schema_arrow.names, columns, key)
            read = ([key_column] if key_column is not None else []) + [c for c in fields if c != key_column]
            base = os.path.dirname(os.path.abspath(path))
            stem = os.path.basename(path).split(".")[0]
            row = 0
            with worker_threads(1, "wds-parquet") as pool:  # the next row group is read while this one is written
                for _, future in ordered_map(functools.partial(reader.read_row_group, columns=read),
                                             range(reader.num_row_groups), pool, window=2):
                    table = future.result()
                    for batch in table.to_batches(_BATCH):
                        for values in batch.to_pylist():
                            yield _sample(values, key_column, fields, f"{path}:{row}", stem, row, base)
                            row += 1
                    del table, future
        finally:
            reader.close()


def _sample(values: dict, key_column: str | None, fields: dict, source: str, stem: str, row: int,
            base: str) -> dict:
    key = values[key_column] if key_column is not None else f"{stem}/{row:09d}"
    sample: dict = {"__key__": key if key is None or isinstance(key, str) else str(key), "__source__": source}
    if key in (None, ""):
        sample[PROBLEMS] = [f"no key in column {key_column!r}"]
    for column, field in fields.items():
        value = values[column]
        if value is None:
            continue
        name = field or column
        if isinstance(value, dict) and set(value) <= {"bytes", "path"} and "bytes" in value:
            picked = value.get("path")
            if field is None and isinstance(picked, str) and "." in os.path.basename(picked):
                name = os.path.basename(picked).rsplit(".", 1)[-1].lower()
            if value["bytes"] is not None:
                value = value["bytes"]
            elif picked:
                value, name = os.path.join(base, picked), name + "_path"
            else:
                continue
        if name.endswith("_path") and isinstance(value, str):
            name = name[: -len("_path")]
            value = os.path.join(base, value)
            try:
                value = FileBytes(value, os.stat(value).st_size)
            except OSError as exn:
                sample.setdefault(PROBLEMS, []).append(f"field {name!r}: cannot read {value!r} "
                                                       f"({exn.strerror or exn})")
                continue
        elif isinstance(value, (bool, int, float)):
            value = str(value)
        elif isinstance(value, (dict, list)):
            value = json.dumps(value, sort_keys=True, default=str)
        elif not isinstance(value, (bytes, str)):
            value = str(value)  # dates, decimals: their text
        sample[name] = value
    return sample


__all__ = ["PARQUET_SUFFIXES", "parquet_files", "parquet_rows", "parquet_samples"]
