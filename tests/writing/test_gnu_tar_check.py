"""The GNU tar check that every writer test gets (``conftest.py``): it reads what the writer
writes, names of any length and script included, and it fails where GNU tar and tarfile disagree."""

from __future__ import annotations

import pytest

from tests.writing import gnu_tar
from tests.writing.conftest import make_samples
from wds_datapipes.writing import write_shards


def test_gnu_tar_reads_plain_and_gzip_shards_with_long_and_non_ascii_names_as_tarfile_does(tmp_path):
    """oracles: GNU tar (names, sizes, bytes) against tarfile, on shards with PAX headers."""
    samples = make_samples(12)
    samples[2]["__key__"] = "ключ-" + "я" * 40  # 85 characters, 165 bytes: a PAX header
    samples[5]["__key__"] = "d/" * 60 + "deep"  # a long path
    write_shards(samples, str(tmp_path / "p/s-%02d.tar"), maxcount=5, fsync=False)
    write_shards(samples, str(tmp_path / "g/s-%02d.tar.gz"), maxcount=5, fsync=False)
    assert gnu_tar.check_with_gnu_tar(gnu_tar.shards_under(tmp_path)) == 6


def test_the_check_fails_where_gnu_tar_and_tarfile_disagree(tmp_path, monkeypatch):
    """oracle: a tarfile view altered on purpose (a size, then a byte) must be caught."""
    write_shards(make_samples(4), str(tmp_path / "s-%02d.tar"), fsync=False)
    paths = gnu_tar.shards_under(tmp_path)
    view = gnu_tar._tarfile_view

    def other_size(path):
        members, data = view(path)
        return [(members[0][0], members[0][1] + 1), *members[1:]], data

    monkeypatch.setattr(gnu_tar, "_tarfile_view", other_size)
    with pytest.raises(AssertionError, match="lists"):
        gnu_tar.check_with_gnu_tar(paths)

    def other_byte(path):
        members, data = view(path)
        return members, data[:-1] + bytes([data[-1] ^ 1])

    monkeypatch.setattr(gnu_tar, "_tarfile_view", other_byte)
    with pytest.raises(AssertionError, match="extracts"):
        gnu_tar.check_with_gnu_tar(paths)
