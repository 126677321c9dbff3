"""Parquet input on several ranks: planned by place from the footers (``maxcount`` alone), each
rank reads only the row groups of its own shards, and the ranks' shards join into the one-rank
result byte for byte; with ``maxsize`` every rank still reads everything (and says so)."""

from __future__ import annotations

import logging
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wds_datapipes import ShardLister
from wds_datapipes.handlers import ignore_and_continue
from wds_datapipes.writing import join_index, write_shards
from wds_datapipes.writing.parquet import parquet_samples
from wds_datapipes.writing.plan import groups_to_read

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

MAXCOUNT = 10
FILES = ((83, 7), (50, 5), (1, 1))  # (rows, row group size): groups straddle shards and files


def _write_inputs(folder, keyed: bool = True, bad: bool = False) -> list[tuple[int, list[int]]]:
    """Parquet files of many row groups; returns each file's (rows, row group sizes). ``bad``:
    rows without a jpg, without a key, and keys repeated across row groups and shards."""
    folder.mkdir()
    layout = []
    for number, (n, group) in enumerate(FILES):
        rng = random.Random(number)
        rows = []
        for i in range(n):
            row = {"jpg": rng.randbytes(rng.randrange(0, 700)), "txt": f"caption {number} {i}"}
            if keyed:
                row = {"key": f"{number}-{i:04d}", **row}
            if bad and i % 13 == 5:
                row["jpg"] = None
            if bad and keyed and i % 17 == 3:
                row["key"] = "0-0001" if i % 2 else None  # a repeat of an earlier row's key, or no key
            rows.append(row)
        pq.write_table(pa.Table.from_pylist(rows), folder / f"part-{number}.parquet", row_group_size=group)
        layout.append((n, [min(group, n - start) for start in range(0, n, group)]))
    return layout


def _spy(monkeypatch) -> list[tuple[int, int, tuple]]:
    """Every read_row_group call: (the file's rows, the group, the columns)."""
    calls: list[tuple[int, int, tuple]] = []
    original = pq.ParquetFile.read_row_group

    def spy(self, i, columns=None, **kw):
        calls.append((self.metadata.num_rows, i, tuple(columns)))
        return original(self, i, columns=columns, **kw)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    return calls


def _model_groups(layout, rank: int, world: int) -> set[tuple[int, int]]:
    """The row groups rank reads: those with a row r whose shard r // MAXCOUNT is rank's (round robin)."""
    wanted, start = set(), 0
    for rows, groups in layout:
        for i, size in enumerate(groups):
            if any((r // MAXCOUNT) % world == rank for r in range(start, start + size)):
                wanted.add((rows, i))
            start += size
    return wanted


def _tars(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.tar"))}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("keyed", [True, False])
@pytest.mark.parametrize("world", [2, 3])
def test_each_rank_reads_only_the_row_groups_of_its_shards_and_the_shards_are_the_one_rank_ones(
        tmp_path, monkeypatch, world, keyed):
    """oracle: a one-rank run's shards and index offsets (byte for byte), and the same input written
    from a plain list of its samples (the plan by size: equal where nothing is skipped); a model of the
    row groups each rank needs (a group holding a row r of shard r // maxcount, shard % world == rank),
    against a spy on pyarrow's ParquetFile.read_row_group: each rank reads exactly those groups' columns
    (every group read by some rank), and of the others the key column alone (nothing without one)."""
    layout = _write_inputs(tmp_path / "in", keyed)
    write_shards(parquet_samples([str(tmp_path / "in")]), str(tmp_path / "one/s-%04d.tar"), maxcount=MAXCOUNT,
                 fsync=False)
    write_shards(list(parquet_samples([str(tmp_path / "in")])), str(tmp_path / "plain/s-%04d.tar"),
                 maxcount=MAXCOUNT, fsync=False)
    calls = _spy(monkeypatch)
    full = ("key", "jpg", "txt") if keyed else ("jpg", "txt")
    reports, union = [], set()
    for rank in range(world):
        calls.clear()
        reports.append(write_shards(parquet_samples([str(tmp_path / "in")]), str(tmp_path / "many/s-%04d.tar"),
                                    maxcount=MAXCOUNT, rank=rank, world=world, fsync=False))
        read = {(rows, i) for rows, i, columns in calls if columns == full}
        assert read == _model_groups(layout, rank, world)
        assert len(read) < sum(len(groups) for _, groups in layout)  # fewer than all: the point
        others = [(rows, i) for rows, i, columns in calls if columns != full]
        assert all(columns == ("key",) for *_, columns in calls if columns != full) and (keyed or not others)
        assert len(set(others)) == len(others) and not read & set(others)  # each group read once
        union |= read
    assert union == {(rows, i) for rows, groups in layout for i in range(len(groups))}
    total = sum(rows for rows, _ in layout)
    assert sum(r.read for r in reports) == sum(r.written for r in reports) == total
    joined = join_index(str(tmp_path / "many/index.json"), world)
    assert _tars(tmp_path / "many") == _tars(tmp_path / "one") == _tars(tmp_path / "plain")
    assert len(_tars(tmp_path / "one")) == -(-total // MAXCOUNT) and joined.total == total
    assert (tmp_path / "many/index.offsets").read_bytes() == (tmp_path / "one/index.offsets").read_bytes()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_skipped_and_repeated_rows_keep_their_places_so_the_ranks_agree_with_one_rank(tmp_path, world):
    """Rows without a jpg or a key, and keys repeated across row groups and shards, skipped.
    oracle: a model of the plan by place (row r in shard r // maxcount; a row is written unless its key
    is missing, its jpg is missing, or its key was in an earlier row, written or not) over pyarrow's
    read_table, against the one-rank run read back by our reader; the ranks' shards byte for byte;
    each rank's counts add up (read == written + skipped), and over the ranks to the input's rows."""
    _write_inputs(tmp_path / "in", bad=True)
    common = {"maxcount": MAXCOUNT, "require": ["jpg"], "handler": ignore_and_continue, "fsync": False}
    one = write_shards(parquet_samples([str(tmp_path / "in")]), str(tmp_path / "one/s-%04d.tar"), **common)
    reports = [write_shards(parquet_samples([str(tmp_path / "in")]), str(tmp_path / "many/s-%04d.tar"),
                            rank=rank, world=world, **common) for rank in range(world)]
    seen, model, row = set(), {}, 0
    for number in range(len(FILES)):
        for values in pq.read_table(tmp_path / "in" / f"part-{number}.parquet").to_pylist():
            if values["key"] is not None and values["jpg"] is not None and values["key"] not in seen:
                model.setdefault(row // MAXCOUNT, []).append(values["key"])
            if values["key"] is not None:
                seen.add(values["key"])
            row += 1
    got: dict[int, list[str]] = {}
    for sample in ShardLister(str(tmp_path / "one")).load_tar().group_by_key():
        got.setdefault(int(sample["__url__"].rsplit("-", 1)[1][:4]), []).append(sample["__key__"])
    assert got == model and len(_tars(tmp_path / "one")) == -(-row // MAXCOUNT)
    assert one.read == row == one.written + len(one.skipped) and len(one.skipped) > 8
    for report in reports:
        assert report.read == report.written + len(report.skipped)
    assert sum(r.read for r in reports) == row and sum(r.written for r in reports) == one.written
    assert sorted(s for r in reports for s in r.skipped) == sorted(one.skipped)
    join_index(str(tmp_path / "many/index.json"), world)
    assert _tars(tmp_path / "many") == _tars(tmp_path / "one")
    assert (tmp_path / "many/index.offsets").read_bytes() == (tmp_path / "one/index.offsets").read_bytes()


@pytest.mark.timeout(120)
def test_with_maxsize_every_rank_reads_every_row_group_and_says_so(tmp_path, monkeypatch, caplog):
    """oracle: the one-rank run's shards (byte for byte); the spy sees every rank read every row group
    whole; the warning names the reason."""
    layout = _write_inputs(tmp_path / "in")
    write_shards(parquet_samples([str(tmp_path / "in")]), str(tmp_path / "one/s-%04d.tar"), maxsize=6000,
                 fsync=False)
    calls = _spy(monkeypatch)
    groups = sum(len(g) for _, g in layout)
    for rank in range(2):
        calls.clear()
        with caplog.at_level(logging.WARNING, logger="wds_datapipes"):
            write_shards(parquet_samples([str(tmp_path / "in")]), str(tmp_path / "two/s-%04d.tar"), maxsize=6000,
                         rank=rank, world=2, fsync=False)
        assert len({(rows, i) for rows, i, columns in calls if columns == ("key", "jpg", "txt")}) == groups
    assert "reads every Parquet row group" in caplog.text
    join_index(str(tmp_path / "two/index.json"), 2)
    assert _tars(tmp_path / "two") == _tars(tmp_path / "one") and len(_tars(tmp_path / "one")) > 3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 12), max_size=12), st.one_of(st.none(), st.integers(1, 9)), st.integers(1, 4),
       st.data())
def test_groups_to_read_are_those_holding_a_row_of_the_ranks_shards(sizes, maxcount, world, data):
    """oracle: the rule spelled out row by row (row r is in shard r // maxcount, or 0 without maxcount)."""
    rank = data.draw(st.integers(0, world - 1))
    start, model = 0, []
    for size in sizes:
        model.append(any(((r // maxcount) if maxcount else 0) % world == rank for r in range(start, start + size)))
        start += size
    assert groups_to_read(sizes, maxcount, rank, world) == model


def test_a_shard_whose_every_row_was_skipped_is_an_empty_tar_that_joins_verifies_and_resumes(tmp_path):
    """oracle: the plan by place spelled out (rows 2 and 3, shard 1's two places, lack their jpg);
    tarfile reads shard 1 as an archive of no member; `verify` over the joined index; a second run
    of each rank resumes every shard."""
    import tarfile

    from wds_datapipes.cli import main

    pq.write_table(pa.Table.from_pylist([{"key": f"k{i}", "jpg": None if i in (2, 3) else b"x" * i}
                                         for i in range(8)]), tmp_path / "a.parquet", row_group_size=3)
    common = {"maxcount": 2, "require": ["jpg"], "handler": ignore_and_continue, "fsync": False}
    for rank in range(2):
        write_shards(parquet_samples([str(tmp_path / "a.parquet")]), str(tmp_path / "out/s-%02d.tar"),
                     rank=rank, world=2, **common)
    joined = join_index(str(tmp_path / "out/index.json"), 2)
    assert [int(n) for n in joined.sizes] == [2, 0, 2, 2]
    with tarfile.open(tmp_path / "out/s-01.tar") as tar:
        assert tar.getmembers() == []
    assert main(["verify", str(tmp_path / "out/index.json")]) == 0
    again = write_shards(parquet_samples([str(tmp_path / "a.parquet")]), str(tmp_path / "out/s-%02d.tar"),
                         rank=1, world=2, **common)
    assert (again.resumed, again.read, again.written, len(again.skipped)) == (2, 4, 2, 2)
