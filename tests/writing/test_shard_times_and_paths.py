"""Shard files' modification times (the ``mtime`` setting, ``create --mtime``, SOURCE_DATE_EPOCH)
and the errors of our own where a pattern or a file system cannot take them."""

from __future__ import annotations

import errno
import json
import os
import tarfile
from datetime import datetime, timezone

import pytest

from tests.writing.conftest import make_samples
from wds_datapipes.cli import main
from wds_datapipes.errors import ShardWriteError
from wds_datapipes.writing import write_shards

JUNE = int(datetime(2024, 6, 1, tzinfo=timezone.utc).timestamp())  # oracle: Python's datetime


def _folder(root, n: int = 6):
    root.mkdir()
    for i in range(n):
        (root / f"s{i}.txt").write_text(f"text {i}")
    return root


def _create(tmp_path, *extra: str, out: str = "out") -> int:
    return main(["create", str(tmp_path / "in"), "-o", str(tmp_path / out / "s-%02d.tar"), "--maxcount", "4",
                 "--quiet", "--no-fsync", *extra])


@pytest.mark.parametrize("when", ["2024-06-01", "2024-06-01T00:00:00Z", "2024-06-01T02:00:00+02:00", str(JUNE)])
def test_create_mtime_dates_the_members_and_the_shard_files(tmp_path, capsys, when):
    """oracle: tarfile's member mtimes, os.stat of each shard, the index's recorded stamps."""
    _folder(tmp_path / "in")
    assert _create(tmp_path, "--mtime", when) == 0
    assert "1970" not in capsys.readouterr().err
    shards = sorted((tmp_path / "out").glob("s-*.tar"))
    assert len(shards) == 2
    recorded = json.loads((tmp_path / "out" / "index.places.json").read_text())
    stamps = json.dumps(recorded)
    for shard in shards:
        with tarfile.open(shard) as tar:
            assert {m.mtime for m in tar.getmembers()} == {JUNE}
        mtime_ns = os.stat(shard).st_mtime_ns
        assert JUNE * 10**9 <= mtime_ns < (JUNE + 1) * 10**9
        assert str(mtime_ns) in stamps


def test_a_run_again_with_the_same_mtime_writes_the_same_bytes_and_another_is_refused(tmp_path):
    """oracle: the first run's files, byte for byte; the resume's refusal names the setting."""
    _folder(tmp_path / "in")
    assert _create(tmp_path, "--mtime", "2024-06-01", out="a") == 0
    assert _create(tmp_path, "--mtime", "2024-06-01", out="b") == 0
    names = sorted(n for n in os.listdir(tmp_path / "a") if not n.endswith(".progress"))  # (it holds the path)
    assert names == sorted(n for n in os.listdir(tmp_path / "b") if not n.endswith(".progress"))
    assert [(tmp_path / "a" / n).read_bytes() for n in names] == [(tmp_path / "b" / n).read_bytes() for n in names]
    assert [os.stat(tmp_path / "a" / n).st_mtime_ns for n in names if n.startswith("s-")] == \
        [os.stat(tmp_path / "b" / n).st_mtime_ns for n in names if n.startswith("s-")]
    os.remove(tmp_path / "a" / "s-01.tar")  # a resume that would write it again, with another time: refused
    with pytest.raises(ShardWriteError, match=rf"other settings.*'mtime': \({JUNE}, {JUNE + 86400}\)"):
        write_shards([], str(tmp_path / "a" / "s-%02d.tar"), maxcount=4, mtime=JUNE + 86400, fsync=False)


def test_source_date_epoch_is_the_default_and_the_1970_default_is_said(tmp_path, capsys, monkeypatch):
    """oracle: tarfile's member mtimes; the reproducible-builds convention's variable."""
    _folder(tmp_path / "in")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(JUNE))
    assert _create(tmp_path, out="dated") == 0
    with tarfile.open(tmp_path / "dated" / "s-00.tar") as tar:
        assert {m.mtime for m in tar.getmembers()} == {JUNE}
    assert "1970" not in capsys.readouterr().err
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    assert _create(tmp_path, out="plain") == 0
    err = capsys.readouterr().err
    assert "dated 1970-01-01" in err and "--mtime" in err
    assert os.stat(tmp_path / "plain" / "s-00.tar").st_mtime_ns < 10**9


def test_create_help_shows_the_mtime_option(capsys):
    with pytest.raises(SystemExit):
        main(["create", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--mtime WHEN" in out and "SOURCE_DATE_EPOCH" in out and "purge" in out


@pytest.mark.parametrize("bad", [-1, 8**11, 1.5, True])
def test_an_mtime_no_tar_header_holds_is_refused_before_anything_is_written(tmp_path, bad):
    with pytest.raises(ValueError, match="mtime must be whole seconds"):
        write_shards(make_samples(3), str(tmp_path / "out" / "s-%02d.tar"), mtime=bad)
    assert not (tmp_path / "out").exists()


def test_create_refuses_a_date_it_cannot_read(tmp_path, capsys):
    _folder(tmp_path / "in")
    with pytest.raises(SystemExit):
        _create(tmp_path, "--mtime", "June")
    assert "neither seconds since 1970 nor a date" in capsys.readouterr().err


@pytest.mark.parametrize("pattern", ["out/%d/s.tar", "out/%06d/s-%06d.tar", "out/run-%s/s-%d.tar"])
def test_a_number_in_the_patterns_folder_is_refused_naming_the_pattern(tmp_path, pattern):
    """Before: a raw FileNotFoundError once the first shard was opened (its folder 'out/0' was never made)."""
    with pytest.raises(ShardWriteError, match="holds a % field") as caught:
        write_shards(make_samples(3), str(tmp_path / pattern), maxcount=1)
    assert caught.value.shard == str(tmp_path / pattern)
    assert not (tmp_path / "out").exists()


def test_a_percent_sign_written_twice_in_the_folder_is_a_plain_folder_name(tmp_path):
    """oracle: Python's pattern % n (%% is a literal %): the shards and the index in that one folder.
    Before: the folder made was '100%%', the shards' '100%' was not (FileNotFoundError)."""
    report = write_shards(make_samples(3), str(tmp_path / "100%%" / "s-%02d.tar"), maxcount=2, fsync=False)
    assert report.shards == 2 and os.listdir(tmp_path) == ["100%"]
    assert {"s-00.tar", "s-01.tar", "index.json"} <= set(os.listdir(tmp_path / "100%"))


def test_create_reports_a_number_in_the_patterns_folder_without_a_traceback(tmp_path, capsys):
    _folder(tmp_path / "in")
    code = main(["create", str(tmp_path / "in"), "-o", str(tmp_path / "out" / "%d" / "s.tar"), "--quiet"])
    err = capsys.readouterr().err
    assert code != 0 and "holds a % field" in err and "Traceback" not in err


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_file_system_that_cannot_set_times_stops_the_run_naming_the_shard(tmp_path, monkeypatch, suffix, workers):
    """os.utime refused as some network and FUSE mounts refuse it (EPERM). Before: a raw PermissionError."""

    def refused(*args, **kwargs):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "utime", refused)  # (forked workers inherit it)
    pattern = str(tmp_path / f"s-%02d{suffix}")
    with pytest.raises(ShardWriteError, match="cannot set the file's modification time .Operation not permitted") \
            as caught:
        write_shards(make_samples(6), pattern, maxcount=3, fsync=False, workers=workers)
    assert caught.value.shard.startswith(str(tmp_path / "s-0")) and ".part" in caught.value.shard
    assert [n for n in os.listdir(tmp_path) if n.startswith("s-")] == []  # no shard, no .part file left
