"""Member places, format 2 (keys and a suffix table) and format 1 (names), and the two in-order reads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import webdataset as wds
from builders import write_index
from tar_builders import build_tar

import wds_datapipes as wd
from wds_datapipes import ExactEpochs, ShardFormatError, ShardIndex
from wds_datapipes.epochs import placed_reads
from wds_datapipes.epochs import places as place_files
from wds_datapipes.epochs.reading import span_samples
from wds_datapipes.epochs.spans import Span
from wds_datapipes.limits import Limits


def _by_key(samples) -> dict[str, dict]:
    return {s["__key__"]: {k: bytes(v) if isinstance(v, memoryview) else v for k, v in s.items() if k != "__pad__"}
            for s in samples}


def _walked(shards: list[str]) -> dict[str, dict]:
    return _by_key(wd.ShardLister(shards).load_tar().group_by_key())


def _tar(path, members) -> str:
    path.write_bytes(build_tar(members))
    return str(path)


@pytest.fixture
def cased_shards(tmp_path) -> list[str]:
    """Suffixes in several cases and counts of members, keys with dots in folders."""
    first = _tar(tmp_path / "c-000.tar", [("a/x.y/s0.JPG", b"j0"), ("a/x.y/s0.cls", b"0"), ("a/x.y/s0.Meta.JSON", b"{}"),
                                          ("s1.jpg", b"j1"), ("s1.cls", b"1"), ("s2.jpg", b"j2")])
    second = _tar(tmp_path / "c-001.tar", [("t0.JPG", b"k0"), ("t0.cls", b"2"), ("t1.Jpg", b"k1"), ("t1.cls", b"3")])
    return [first, second]


def _as_format_1(index_path: str) -> None:
    """Rewrites the places beside the index at ``index_path`` in format 1 (names, not keys
    and suffixes), as an index written before format 2 has them."""
    index = ShardIndex.load(index_path)
    stem = os.path.splitext(index_path)[0]
    places = index.places
    names, rows = [], []
    for shard in range(len(index)):
        if places.has(shard):
            scanned = places.shard_places(shard)
            part = np.empty(len(scanned.names), dtype=place_files.ROW_1)
            part["data"], part["size"], part["sample"] = scanned.data, scanned.sizes, scanned.samples
            encoded = [n.encode() + b"\0" for n in scanned.names]
            at = sum(len(n) for n in names)
            part["name"] = at + np.concatenate([[0], np.cumsum([len(e) for e in encoded])[:-1]])
            names.extend(encoded)
            rows.append(part)
    np.concatenate(rows).tofile(f"{stem}.places")
    with open(f"{stem}.names", "wb") as out:
        out.write(b"".join(names))
    os.remove(f"{stem}.keys")
    with open(f"{stem}.places.json") as spec:
        shards = json.load(spec)["shards"]
    with open(f"{stem}.places.json", "w") as spec:
        json.dump({"format": 1, "shards": shards}, spec)
    with open(index_path) as spec:
        whole = json.load(spec)
    whole["wds_datapipes"]["places"] = {"shards": f"{os.path.basename(stem)}.places.json",
                                        "rows": f"{os.path.basename(stem)}.places",
                                        "names": f"{os.path.basename(stem)}.names"}
    with open(index_path, "w") as spec:
        json.dump(whole, spec)


def test_format_2_keeps_keys_and_a_table_of_suffixes_as_written(cased_shards, tmp_path):
    path = write_index(cased_shards, tmp_path / "index.json", places=True)
    with open(tmp_path / "index.places.json") as spec:
        meta = json.load(spec)
    assert meta["format"] == 2 and meta["suffixes"] == ["JPG", "cls", "Meta.JSON", "jpg", "Jpg"]
    assert (tmp_path / "index.keys").read_bytes() == b"a/x.y/s0\0s1\0s2\0t0\0t1\0"
    places = ShardIndex.load(path).places
    span = places.span(0, 0, 3)
    assert span.keys == ["a/x.y/s0", "s1", "s2"]
    assert span.suffixes == ["jpg", "cls", "meta.json", "jpg", "cls", "jpg"]
    assert [span.name(m) for m in range(6)] == ["a/x.y/s0.JPG", "a/x.y/s0.cls", "a/x.y/s0.Meta.JSON", "s1.jpg",
                                                "s1.cls", "s2.jpg"]
    assert places.span(1, 1, 2).keys == ["t1"] and places.span(1, 1, 2).name(0) == "t1.Jpg"


@pytest.mark.parametrize("views", [False, True], ids=["copies", "views"])
def test_an_index_in_format_1_reads_the_same_samples_as_format_2(cased_shards, mixed_pairs, tmp_path, views):
    shards = cased_shards + mixed_pairs
    new = write_index(shards, tmp_path / "new.json", places=True)
    old = write_index(shards, tmp_path / "old.json", places=True)
    _as_format_1(old)
    assert ShardIndex.load(old).places.format == 1 and ShardIndex.load(new).places.format == 2
    walked = _walked(shards)
    for shuffle in (False, True):
        options = {"batch_size": 1, "shuffle": shuffle, "lanes": 2, "block": 5, "views": views}
        first = list(ExactEpochs(old, **options))
        assert [s["__key__"] for s in first] == [s["__key__"] for s in ExactEpochs(new, **options)]
        assert _by_key(first) == walked


def test_a_format_1_index_saved_again_is_written_in_format_2(cased_shards, tmp_path):
    old = write_index(cased_shards, tmp_path / "old.json", places=True)
    _as_format_1(old)
    ShardIndex.load(old).save(str(tmp_path / "again.json"))
    again = ShardIndex.load(str(tmp_path / "again.json"))
    assert again.places.format == 2
    assert _by_key(ExactEpochs(str(tmp_path / "again.json"), batch_size=1, shuffle=False)) == _walked(cased_shards)
    fresh = ShardIndex.load(write_index(cased_shards, tmp_path / "fresh.json", places=True))
    assert np.array_equal(again.places.rows, fresh.places.rows) and bytes(again.places.text) == bytes(fresh.places.text)


@pytest.mark.parametrize("format_1", [False, True], ids=["format 2", "format 1"])
def test_a_bad_place_names_the_member_as_its_shard_spells_it(cased_shards, tmp_path, format_1):
    path = write_index(cased_shards, tmp_path / "index.json", places=True)
    if format_1:
        _as_format_1(path)
    rows_path = tmp_path / "index.places"
    rows = np.fromfile(rows_path, dtype=place_files.ROW_1 if format_1 else place_files.ROW)
    rows["size"][2] = 1 << 40
    rows.tofile(rows_path)
    with pytest.raises(ShardFormatError, match="more than the limit") as caught:
        list(ExactEpochs(path, batch_size=1, shuffle=False))
    assert caught.value.member == "a/x.y/s0.Meta.JSON"


def test_a_suffix_number_past_the_table_is_a_mismatch(cased_shards, tmp_path):
    path = write_index(cased_shards, tmp_path / "index.json", places=True)
    rows = np.fromfile(tmp_path / "index.places", dtype=place_files.ROW)
    rows["suffix"][4] = 99
    rows.tofile(tmp_path / "index.places")
    with pytest.raises(wd.IndexMismatchError, match="do not match their keys or suffixes"):
        list(ExactEpochs(path, batch_size=1, shuffle=False))


# ------------------------------------------------------------ reading


@pytest.fixture
def mixed_pairs(tmp_path) -> list[str]:
    """Two-member samples of a few hundred bytes to 3 KB."""
    paths = []
    for shard, n in enumerate([30, 17]):
        path = tmp_path / f"p-{shard:03d}.tar"
        with wds.TarWriter(str(path)) as writer:
            for i in range(n):
                writer.write({"__key__": f"p{shard}-{i:04d}", "jpg": os.urandom(200 + 97 * i), "cls": b"%d" % i})
        paths.append(str(path))
    return paths


def test_a_shard_cut_short_under_the_reader_yields_what_it_has_then_names_the_member(mixed_pairs, tmp_path,
                                                                                    monkeypatch):
    shard = mixed_pairs[0]
    path = write_index([shard], tmp_path / "index.json", places=True)
    index = ShardIndex.load(path)
    span = index.places.span(0, 0, 30)
    cut = int(span.rows["data"][21]) + 100  # inside sample 10's jpg (after its cls: the 22nd member)
    short = shutil.copy(shard, tmp_path / "short.tar")
    os.truncate(short, cut)
    monkeypatch.setattr(placed_reads, "open_placed", lambda path, url, stamp: os.open(short, os.O_RDONLY))
    got = []
    with pytest.raises(ShardFormatError, match="truncated: 100 of") as caught:
        for sample in span_samples(index, Span(0, 0, 30, False), Limits()):
            got.append(sample["__key__"])
    assert caught.value.member == "p0-0010.jpg" and caught.value.url.endswith("p-000.tar")
    assert got == [f"p0-{i:04d}" for i in range(10)]  # every sample before the cut one


def test_shards_without_places_between_shards_with_them_keep_the_keys_in_step(cased_shards, mixed_pairs, tmp_path,
                                                                              sized_shards):
    gz = sized_shards([4], prefix="g", gz=True)
    shards = [cased_shards[0], *gz, mixed_pairs[0], cased_shards[1]]
    path = write_index(shards, tmp_path / "index.json", places=True)
    assert [ShardIndex.load(path).places.has(i) for i in range(4)] == [True, False, True, True]
    walked = _walked(shards)
    for shuffle in (False, True):
        got = list(ExactEpochs(path, batch_size=1, shuffle=shuffle, lanes=2, block=4, views=True))
        assert _by_key(got) == walked and len(got) == len(walked)


def _verify(path: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wds_datapipes", "verify", path], capture_output=True, text=True,
                          timeout=120, check=False)


def test_verify_passes_a_format_1_index_and_finds_a_record_pointing_at_another_key(cased_shards, mixed_pairs,
                                                                                    tmp_path):
    old = write_index(cased_shards, tmp_path / "old.json", places=True)
    _as_format_1(old)
    assert _verify(old).returncode == 0
    path = write_index(mixed_pairs, tmp_path / "index.json", places=True)
    assert _verify(path).returncode == 0
    rows = np.fromfile(tmp_path / "index.places", dtype=place_files.ROW)
    rows["key"][6] += 2  # sample 3's first member points inside its key: a span from there would cut it
    rows.tofile(tmp_path / "index.places")
    bad = _verify(path)
    assert bad.returncode == 1 and "p-000.tar" in bad.stdout and "member places differ" in bad.stdout


def test_a_failed_read_is_an_error_naming_the_member_being_read(mixed_pairs, tmp_path, monkeypatch):
    path = write_index(mixed_pairs, tmp_path / "index.json", places=True)
    index = ShardIndex.load(path)
    monkeypatch.setattr(placed_reads, "BUFFER_BYTES", 8192)  # several reads in the shard
    reads = []
    real = os.pread

    def failing(fd, size, offset):
        reads.append(offset)
        if len(reads) == 3:
            raise OSError(5, "Input/output error")
        return real(fd, size, offset)

    monkeypatch.setattr(os, "pread", failing)
    span = index.places.span(0, 0, 30)
    with pytest.raises(wd.ShardReadError, match="Input/output error") as caught:
        list(span_samples(index, Span(0, 0, 30, False), Limits()))
    assert caught.value.member == span.name(span.member_at(reads[2])) and caught.value.url.endswith("p-000.tar")
