"""A restart leaves one run's shards; a resume over an input that shrank or changed is refused,
naming the shard and what differs; an older progress record is refused with its format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.writing.conftest import make_samples, shard_keys
from wds_datapipes.cli import main
from wds_datapipes.errors import ShardWriteError
from wds_datapipes.writing import write_shards

PATTERN = "s-%04d.tar"


def _read(folder: Path) -> list[str]:
    """Every key in the folder's shards, in shard order. oracle: tarfile (not our reader)."""
    return shard_keys(sorted(folder.glob("*.tar")))


def _webdataset_keys(folder: Path) -> list[str]:
    """oracle reader: webdataset 1.0.2 over every shard of the folder, in name order."""
    import webdataset as wds

    paths = [str(p) for p in sorted(folder.glob("*.tar"))]
    return [s["__key__"] for s in wds.WebDataset(paths, shardshuffle=False, empty_check=False)]


def _write(folder: Path, samples: list[dict], **settings):
    return write_shards(samples, str(folder / PATTERN), fsync=False, **settings)


def test_a_restart_with_other_settings_leaves_only_its_own_shards(tmp_path):
    """The issue's case: maxcount 10, then restart with maxcount 40. oracles: tarfile and
    webdataset read the folder back (40 keys once each, in input order)."""
    samples = make_samples(40)
    _write(tmp_path, samples, maxcount=10)
    assert len(list(tmp_path.glob("*.tar"))) == 4
    report = _write(tmp_path, samples, maxcount=40, restart=True)
    want = [s["__key__"] for s in samples]
    assert sorted(p.name for p in tmp_path.glob("*.tar")) == ["s-0000.tar"]
    assert _read(tmp_path) == want == _webdataset_keys(tmp_path)
    assert sorted(Path(p).name for p in report.removed) == [f"s-{n:04d}.tar" for n in range(4)]
    assert "removed 4 shards of an earlier run" in report.summary()
    assert report.index is not None and report.index.total == 40 and len(report.index) == 1


def test_create_restart_says_what_it_removed(tmp_path, capsys):
    """The command's restart, with a pattern other than the earlier run's (its shards recorded in
    the earlier progress record). oracle: tarfile over the folder; the names in the message."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(12):
        (src / f"k{i:03d}.txt").write_text(f"text {i}")
    out = tmp_path / "out"
    assert main(["create", str(src), "-o", str(out / "a-%02d.tar"), "--maxcount", "5", "--quiet", "--no-fsync"]) == 0
    capsys.readouterr()
    assert main(["create", str(src), "-o", str(out / "b-%02d.tar"), "--maxcount", "12", "--restart", "--quiet",
                 "--no-fsync"]) == 0
    err = capsys.readouterr().err
    assert "removed 3 shards of an earlier run" in err and "a-02.tar" in err
    assert sorted(p.name for p in out.glob("*.tar")) == ["b-00.tar"]
    assert _read(out) == [f"k{i:03d}" for i in range(12)]


def test_a_restart_after_a_kill_removes_unrecorded_shards_and_part_files(tmp_path):
    """A shard renamed but never recorded (a kill between the rename and the record) and a
    ``.part`` left by a kill are of the earlier run too. oracle: the folder's listing and tarfile."""
    samples = make_samples(30)
    _write(tmp_path, samples, maxcount=5)
    record = tmp_path / "index.json.rank0-of-1.progress"
    lines = record.read_text().splitlines(keepends=True)
    record.write_text("".join(lines[:3]))  # shards 0 and 1 recorded; 2..5 on disk, unrecorded
    (tmp_path / "s-0009.tar.part").write_bytes(b"half")
    report = _write(tmp_path, samples, maxcount=15, restart=True)
    assert sorted(p.name for p in tmp_path.iterdir() if ".tar" in p.name) == ["s-0000.tar", "s-0001.tar"]
    assert sorted(Path(p).name for p in report.removed) == [f"s-{n:04d}.tar" for n in range(6)]
    assert _read(tmp_path) == [s["__key__"] for s in samples]


def test_a_fresh_run_into_a_folder_of_unrecorded_shards_is_refused(tmp_path):
    """Shards named like this run's that no progress record accounts for would mix with its own:
    refused up front, naming them, and nothing is written. oracle: the folder before and after."""
    samples = make_samples(20)
    _write(tmp_path, samples, maxcount=5)
    (tmp_path / "index.json.rank0-of-1.progress").unlink()
    before = {p.name: p.read_bytes() for p in tmp_path.glob("*.tar")}
    with pytest.raises(ShardWriteError, match=r"4 shards.*s-0000.tar.*restart") as caught:
        _write(tmp_path, samples[:10], maxcount=5)
    assert "no progress record" in str(caught.value)
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.tar")} == before


def test_a_resume_whose_input_lost_the_last_shards_samples_is_refused(tmp_path):
    """The issue's case: 40 samples in 4 recorded shards, then a resume over 30. oracle: the
    shard the input no longer fills, named in the error; the folder unchanged."""
    samples = make_samples(40)
    _write(tmp_path, samples, maxcount=10)
    before = {p.name: p.read_bytes() for p in tmp_path.glob("*.tar")}
    with pytest.raises(ShardWriteError, match=r"shrank or changed.*3 shards.*s-0003\.tar"):
        _write(tmp_path, samples[:30], maxcount=10)
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.tar")} == before


def test_a_resume_whose_input_shrank_after_a_kill_is_refused(tmp_path):
    """A run killed after shard 3 was renamed but before any was recorded complete... the record
    ends early, the shard file stays: a resume over an input of 3 shards must not keep it.
    oracle: the unrecorded shard named in the error."""
    samples = make_samples(40)
    _write(tmp_path, samples, maxcount=10)
    record = tmp_path / "index.json.rank0-of-1.progress"
    lines = record.read_text().splitlines(keepends=True)
    record.write_text("".join(lines[:4]))  # shards 0..2 recorded, no end line; s-0003.tar on disk
    with pytest.raises(ShardWriteError, match=r"s-0003\.tar"):
        _write(tmp_path, samples[:30], maxcount=10)


def test_a_resume_whose_input_shrank_to_a_shard_gone_from_disk_is_refused(tmp_path):
    """The earlier run ended with 4 shards; its last was deleted, the input shrank to 3. oracle:
    the end line's shard count in the record."""
    samples = make_samples(40)
    _write(tmp_path, samples, maxcount=10)
    (tmp_path / "s-0003.tar").unlink()
    with pytest.raises(ShardWriteError, match=r"planned 4 shards.*now 3"):
        _write(tmp_path, samples[:30], maxcount=10)


@pytest.mark.parametrize("change", ["size", "key", "field"])
def test_a_sample_changed_in_the_middle_of_a_recorded_shard_is_refused(tmp_path, change):
    """Same count, same first and last key: a middle sample's size, key or field names differ.
    oracle: the planted change, named in the error (shard and sample)."""
    samples = make_samples(30)
    _write(tmp_path, samples, maxcount=10)
    changed = [dict(s) for s in samples]
    if change == "size":
        changed[15]["bin"] = changed[15]["bin"] + b"x"
    elif change == "key":
        changed[15]["__key__"] = "s00015b"
    else:
        changed[15]["extra"] = b"new field"
    with pytest.raises(ShardWriteError, match=r"input changed") as caught:
        _write(tmp_path, changed, maxcount=10)
    assert caught.value.shard.endswith("s-0001.tar")
    assert ("s00015b" if change == "key" else "s00015") in str(caught.value)


def test_a_resume_with_a_sample_appended_writes_only_the_new_shard(tmp_path):
    """Growth after the recorded shards is no change to them: a grown input's resume writes the
    shards that are new. oracle: an uninterrupted run over the grown input, byte for byte."""
    samples = make_samples(35)
    _write(tmp_path / "a", samples[:30], maxcount=10)
    record = tmp_path / "a/index.json.rank0-of-1.progress"
    record.write_text("".join(record.read_text().splitlines(keepends=True)[:4]))  # killed before its end line
    report = _write(tmp_path / "a", samples, maxcount=10)
    assert report.resumed == 3 and report.shards == 4
    _write(tmp_path / "b", samples, maxcount=10)
    assert ({p.name: p.read_bytes() for p in (tmp_path / "a").glob("*.tar")} ==
            {p.name: p.read_bytes() for p in (tmp_path / "b").glob("*.tar")})


def test_a_progress_record_of_an_older_format_is_refused_with_its_format(tmp_path):
    """oracle: the format tag in the record's first line, named in the error."""
    samples = make_samples(10)
    _write(tmp_path, samples, maxcount=5)
    record = tmp_path / "index.json.rank0-of-1.progress"
    lines = record.read_text().splitlines()
    first = json.loads(lines[0])
    first["format"] = "wds_datapipes.writer_progress/1"
    record.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    with pytest.raises(ShardWriteError, match=r"writer_progress/1.*restart"):
        _write(tmp_path, samples, maxcount=5)
    report = _write(tmp_path, samples, maxcount=5, restart=True)
    assert report.resumed == 0 and _read(tmp_path) == [s["__key__"] for s in samples]


def test_a_restart_of_two_ranks_removes_each_rank_s_own_earlier_shards(tmp_path):
    """Each rank removes the earlier shards of its own numbers only (another rank may be
    writing its own meanwhile). oracle: the folder's names after each rank, and tarfile."""
    samples = make_samples(40)
    for rank in (0, 1):
        _write(tmp_path, samples, maxcount=10, rank=rank, world=2, join=rank == 1)
    assert len(list(tmp_path.glob("*.tar"))) == 4
    report = _write(tmp_path, samples, maxcount=15, rank=1, world=2, restart=True)
    assert sorted(Path(p).name for p in report.removed) == ["s-0001.tar", "s-0003.tar"]
    assert sorted(p.name for p in tmp_path.glob("*.tar")) == ["s-0000.tar", "s-0001.tar", "s-0002.tar"]
    report = _write(tmp_path, samples, maxcount=15, rank=0, world=2, restart=True, join=True)
    assert sorted(Path(p).name for p in report.removed) == ["s-0000.tar", "s-0002.tar"]
    assert _read(tmp_path) == [s["__key__"] for s in samples] and report.index.total == 40


def test_only_names_the_pattern_would_write_count_as_its_shards(tmp_path):
    """oracle: the names ``pattern % n`` gives, by hand (width, prefix, suffix, rank)."""
    from wds_datapipes.writing.earlier import listed_shards

    for name in ["s-0001.tar", "s-001.tar", "s-12345.tar", "t-0002.tar", "s-0002.tar.gz", "s-0003.tar.part",
                 "s-00x4.tar", "s-0004.tar"]:
        (tmp_path / name).write_bytes(b"")
    pattern = str(tmp_path / "s-%04d.tar")
    assert listed_shards(pattern) == {1: pattern % 1, 4: pattern % 4, 12345: pattern % 12345}
    assert listed_shards(pattern, rank=1, world=3) == {1: pattern % 1, 4: pattern % 4}
    assert listed_shards(pattern, parts=True) == {0: pattern % 3 + ".part"}
    assert listed_shards(str(tmp_path / "%04d/s.tar")) is None  # the number in a folder's name
    assert listed_shards(str(tmp_path / "none/s-%04d.tar")) == {}
