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
- a path of either kind that resolves outside the Parquet file's folder (absolute, ``..``,
  a symbolic link leading out) makes its row a bad input, unless ``allow_outside``;
- text: UTF-8; numbers and booleans: their text (``cls`` reads back as an int); lists and
  other structs: JSON;
- a null: no field (``require=`` then reports the sample).

``columns`` picks and renames: ``["jpg", "caption:txt", "image:png"]``. The samples go to
:func:`~wds_datapipes.writing.write_shards` like any others: each goes to the one worker
process that writes its shard, never to every worker. Without ``maxsize`` the writer plans
them by place from the footers' row counts (row ``r`` in shard ``r // maxcount``), and a
rank of several reads only the row groups holding rows of its own shards, and the key
column alone of the others (:meth:`ParquetSamples.for_rank`).
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence

from ..threads import ordered_map, worker_threads
from .plan import Counted, groups_to_read, row_shard, writes_shard
from .shard_file import PROBLEMS
from .sources import path_field

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
                    key: str | None = None, allow_outside: bool = False) -> ParquetSamples:
    """Samples of the rows of Parquet files (files, folders, globs), in file and row order,
    read a row group at a time, projected to the key column and ``columns``
    (``"name"`` or ``"name:field"``; default: every column). An iterator; given to
    :func:`~wds_datapipes.writing.write_shards` without ``maxsize``, a rank of several reads
    only the row groups of its own shards (:meth:`ParquetSamples.for_rank`). ``allow_outside``:
    take files that a path column names outside the Parquet file's folder (refused by default)."""
    return ParquetSamples(specs, columns=columns, key=key, allow_outside=allow_outside)


class ParquetSamples:
    """The rows of Parquet files as samples (an iterator over all of them), and a row source
    for the writer's plan by place: :meth:`for_rank` reads only the row groups holding rows of
    one rank's shards and yields a :class:`~.plan.Counted` (its key only) for each other row."""

    def __init__(self, specs: Iterable[str], *, columns: Sequence[str] | None = None, key: str | None = None,
                 allow_outside: bool = False):
        self.specs, self.columns, self.key, self.allow_outside = list(specs), columns, key, allow_outside
        self._all: Iterator[dict] | None = None

    def __iter__(self) -> ParquetSamples:
        return self

    def __next__(self) -> dict:
        if self._all is None:
            self._all = self._rows(None)
        return next(self._all)

    def for_rank(self, rank: int, world: int, maxcount: int | None) -> Iterator[dict | Counted]:
        """Every row, in order, planned by place (``maxcount`` rows a shard): a sample where its
        row group holds a row of a shard ``rank`` writes (:func:`~.plan.groups_to_read`), else a
        :class:`~.plan.Counted` with its key (the key column alone is read, where there is one)."""
        pq = _pyarrow_parquet()
        files = parquet_files(self.specs)
        sizes = []
        for path in files:
            metadata = pq.read_metadata(path)
            sizes.append([metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)])
        wanted = iter(groups_to_read([n for groups in sizes for n in groups], maxcount, rank, world))
        return self._rows([[next(wanted) for _ in groups] for groups in sizes], files,
                          lambda row: writes_shard(row_shard(row, maxcount), rank, world))

    def _rows(self, wanted: list[list[bool]] | None, files: list[str] | None = None,
              mine: Callable[[int], bool] | None = None) -> Iterator[dict | Counted]:
        """The rows of each file; with ``wanted`` (per file, per row group), a group not wanted
        yields a :class:`~.plan.Counted` per row, its key column read alone; so does a row
        of a group read for which ``mine`` (of the row's number in the whole input) is false."""
        pq = _pyarrow_parquet()
        counted = 0  # rows of the files before this one
        for number, path in enumerate(files if files is not None else parquet_files(self.specs)):
            reader = pq.ParquetFile(path)
            try:
                key_column, fields = _columns(reader.schema_arrow.names, self.columns, self.key)
                read = ([key_column] if key_column is not None else []) + [c for c in fields if c != key_column]
                groups = [True] * reader.num_row_groups if wanted is None else wanted[number]
                base = os.path.dirname(os.path.abspath(path))
                place = (base, os.path.realpath(base), self.allow_outside)  # where its path columns may lead
                stem = os.path.basename(path).split(".")[0]
                row = 0

                def group(i: int, reader=reader, read=read, key_column=key_column, groups=groups):
                    if groups[i]:
                        return reader.read_row_group(i, columns=read)
                    if key_column is not None:
                        return reader.read_row_group(i, columns=[key_column])
                    return reader.metadata.row_group(i).num_rows  # keys made of the row numbers: nothing read

                with worker_threads(1, "wds-parquet") as pool:  # the next row group is read while this one is written
                    for i, future in ordered_map(group, range(reader.num_row_groups), pool, window=2):
                        table = future.result()
                        if not groups[i]:
                            for key_value in (table.column(0).to_pylist() if not isinstance(table, int)
                                              else [None] * table):
                                yield Counted(_key(key_value, key_column, stem, row))
                                row += 1
                            continue
                        for batch in table.to_batches(_BATCH):
                            for values in batch.to_pylist():
                                if mine is None or mine(counted + row):
                                    yield _sample(values, key_column, fields, f"{path}:{row}", stem, row, place)
                                else:  # another rank's row in a group that straddles shards
                                    yield Counted(_key(values[key_column] if key_column is not None else None,
                                                       key_column, stem, row))
                                row += 1
                        del table, future
                counted += row
            finally:
                reader.close()


def _key(value: object, key_column: str | None, stem: str, row: int) -> str | None:
    """A row's key: its key column's value as text, else ``<file stem>/<row number>``."""
    key = value if key_column is not None else f"{stem}/{row:09d}"
    return key if key is None or isinstance(key, str) else str(key)


def _sample(values: dict, key_column: str | None, fields: dict, source: str, stem: str, row: int,
            place: tuple[str, str, bool]) -> dict:
    base, root, allow_outside = place
    key = _key(values[key_column] if key_column is not None else None, key_column, stem, row)
    sample: dict = {"__key__": key, "__source__": source}
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
                value, name = picked, name + "_path"
            else:
                continue
        if name.endswith("_path") and isinstance(value, str):
            name = name[: -len("_path")]
            try:
                value = path_field(base, value, root, allow_outside)
            except ValueError as exn:
                sample.setdefault(PROBLEMS, []).append(f"field {name!r}: {exn}")
                continue
            except OSError as exn:
                sample.setdefault(PROBLEMS, []).append(f"field {name!r}: cannot read {os.path.join(base, value)!r} "
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


__all__ = ["PARQUET_SUFFIXES", "ParquetSamples", "parquet_files", "parquet_rows", "parquet_samples"]
