"""Parquet input: img2dataset- and Hugging Face-style files to shards, by row group, column-projected."""

from __future__ import annotations

import random
import sys

import pytest

from wds_datapipes import ShardLister
from wds_datapipes.cli import main
from wds_datapipes.handlers import ignore_and_continue
from wds_datapipes.writing import write_shards
from wds_datapipes.writing.parquet import parquet_samples

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _ours(folder) -> list[dict]:
    return [{k: v for k, v in s.items() if k != "__url__"}
            for s in ShardLister(str(folder)).load_tar().group_by_key()]


def _img2dataset_like(path, n: int, seed: int, row_group_size: int = 7) -> None:
    """img2dataset's Parquet output: key, jpg bytes, txt, and metadata columns (url, width, status)."""
    rng = random.Random(seed)
    rows = [{"key": f"{seed:03d}{i:06d}", "jpg": rng.randbytes(rng.randrange(0, 4000)) if i % 11 else None,
             "txt": f"a caption {i} é", "url": f"http://x/{i}.jpg", "width": rng.randrange(1, 999),
             "status": "success"} for i in range(n)]
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)


def test_img2dataset_parquet_becomes_shards_equal_to_pyarrows_own_read(tmp_path):
    """oracle: pyarrow's own read of the whole table (pq.read_table), against our reader over the shards."""
    for f in range(2):
        _img2dataset_like(tmp_path / f"part-{f}.parquet", 40 + f, seed=f)
    report = write_shards(parquet_samples([str(tmp_path)], columns=["jpg", "txt", "width:cls"]),
                          str(tmp_path / "out/s-%03d.tar"), maxcount=16, fsync=False)
    want = []
    for f in range(2):
        for row in pq.read_table(tmp_path / f"part-{f}.parquet").to_pylist():
            sample = {"__key__": row["key"], "txt": row["txt"].encode(), "cls": str(row["width"]).encode()}
            if row["jpg"] is not None:
                sample["jpg"] = row["jpg"]
            want.append(sample)
    got = _ours(tmp_path / "out")
    assert [dict(sorted(s.items())) for s in got] == [dict(sorted(s.items())) for s in want]
    assert report.read == report.written == 81


def test_only_the_used_columns_are_read_one_row_group_at_a_time(tmp_path, monkeypatch):
    """oracle: a spy on pyarrow's ParquetFile: row groups read in order, projected, at most one read
    ahead; no whole-file read."""
    _img2dataset_like(tmp_path / "a.parquet", 50, seed=3, row_group_size=10)
    calls = []
    original = pq.ParquetFile.read_row_group

    def spy(self, i, columns=None, **kw):
        calls.append((i, tuple(columns)))
        return original(self, i, columns=columns, **kw)

    def refuse(*args, **kwargs):
        raise AssertionError("the whole file was read")

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    monkeypatch.setattr(pq.ParquetFile, "read", refuse)
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", refuse)
    monkeypatch.setattr(pq, "read_table", refuse)
    samples = parquet_samples([str(tmp_path / "a.parquet")], columns=["txt"])
    first = next(samples)
    assert first == {"__key__": "003000000", "__source__": f"{tmp_path / 'a.parquet'}:0", "txt": "a caption 0 é"}
    assert calls[0] == (0, ("key", "txt")) and len(calls) <= 2  # streaming: at most the next group read ahead
    assert len(list(samples)) == 49
    assert calls == [(i, ("key", "txt")) for i in range(5)]


def test_hugging_face_image_structs_and_path_columns_become_fields(tmp_path):
    """oracle: the bytes and files put into the table, read back by webdataset 1.0.2."""
    import webdataset as wds

    (tmp_path / "img").mkdir()
    (tmp_path / "img/b.png").write_bytes(b"png from a file")
    (tmp_path / "img/m.png").write_bytes(b"mask file")
    table = pa.Table.from_pylist([
        {"image": {"bytes": b"jpeg bytes", "path": "a.jpg"}, "label": 3, "mask_path": "img/m.png"},
        {"image": {"bytes": None, "path": "img/b.png"}, "label": 1, "mask_path": None},
        {"image": {"bytes": b"no path", "path": None}, "label": 0, "mask_path": "img/gone.png"},
    ])
    pq.write_table(table, tmp_path / "train-00000-of-00001.parquet")
    report = write_shards(parquet_samples([str(tmp_path / "train-00000-of-00001.parquet")],
                                          columns=["image", "label:cls", "mask_path"]),
                          str(tmp_path / "out/s-%02d.tar"), handler=ignore_and_continue, fsync=False)
    got = [{k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"}
           for s in wds.WebDataset(str(tmp_path / "out/s-00.tar"), shardshuffle=False)]
    assert got == [{"__key__": "train-00000-of-00001/000000000", "jpg": b"jpeg bytes", "cls": b"3",
                    "mask": b"mask file"},
                   {"__key__": "train-00000-of-00001/000000001", "png": b"png from a file", "cls": b"1"}]
    assert report.read == 3 and [why for _, why in report.skipped] == [
        "field 'mask': cannot read " + repr(str(tmp_path / "img/gone.png")) + " (No such file or directory)"]


def test_parquet_through_the_command_with_workers_is_deterministic_and_verified(tmp_path, capsys):
    """oracle: the one-worker run's bytes; `verify` over the written index; pyarrow's row count."""
    _img2dataset_like(tmp_path / "in.parquet", 60, seed=5)
    common = ["--columns", "jpg,txt", "--maxcount", "9", "--quiet", "--no-fsync", "--require", "jpg", "--skip-bad"]
    assert main(["create", str(tmp_path / "in.parquet"), "-o", str(tmp_path / "a/s-%02d.tar"), *common]) == 0
    assert "read 60 samples: wrote 54, skipped 6" in capsys.readouterr().err
    assert main(["create", str(tmp_path / "in.parquet"), "-o", str(tmp_path / "b/s-%02d.tar"), "-j", "2",
                 *common]) == 0
    a = {p.name: p.read_bytes() for p in (tmp_path / "a").glob("*.tar")}
    # planned by place: 60 rows, 9 places a shard (a skipped row's place stays empty): 7 shards
    assert a == {p.name: p.read_bytes() for p in (tmp_path / "b").glob("*.tar")} and len(a) == 7
    assert main(["verify", str(tmp_path / "b/index.json")]) == 0


def test_a_missing_pyarrow_raises_an_import_error_naming_the_extra(tmp_path, monkeypatch, capsys):
    """oracle: the documented message (pip install 'wds-datapipes[parquet]')."""
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match=r"wds-datapipes\[parquet\]"):
        next(parquet_samples([str(tmp_path / "x.parquet")]))
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    assert main(["create", str(tmp_path / "x.parquet"), "-o", str(tmp_path / "o/s-%02d.tar"), "--quiet"]) == 1
    assert "pip install 'wds-datapipes[parquet]'" in capsys.readouterr().err


def test_an_unknown_column_is_named_in_the_error(tmp_path):
    """oracle: the file's own column names."""
    _img2dataset_like(tmp_path / "a.parquet", 3, seed=1)
    with pytest.raises(ValueError, match="no column 'png'.*'jpg'"):
        next(parquet_samples([str(tmp_path / "a.parquet")], columns=["png"]))
