"""Member places: an index that says where each member's bytes lie, read without tar headers."""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import subprocess
import sys
import tarfile
import warnings

import numpy as np
import pytest
import torch
import webdataset as wds
from builders import write_index
from torch.utils.data import DataLoader

import wds_datapipes as wd
from wds_datapipes import ExactEpochs, IndexMismatchError, ShardFormatError, ShardIndex, WdsError
from wds_datapipes.epochs import placed_reads
from wds_datapipes.epochs import places as place_files
from wds_datapipes.epochs.reading import span_samples
from wds_datapipes.epochs.spans import Span
from wds_datapipes.limits import Limits

SIZES = [40, 25, 33]


@pytest.fixture
def mixed_shards(tmp_path) -> list[str]:
    """Shards with small members, members of 70 KB and one past the 1 MB buffer (read by one pread)."""
    paths = []
    for shard, n in enumerate(SIZES):
        path = tmp_path / f"m-{shard:03d}.tar"
        with wds.TarWriter(str(path)) as writer:
            for i in range(n):
                big = os.urandom(70_000 + 97 * i) if i % 4 == 0 else os.urandom(300 + i)
                big = os.urandom(placed_reads.BUFFER_BYTES + 5) if i == 1 else big
                writer.write({"__key__": f"m{shard}-{i:04d}", "bin": big, "cls": str(i).encode()})
        paths.append(str(path))
    return paths


def _by_key(samples) -> dict[str, dict]:
    return {s["__key__"]: {k: v for k, v in s.items() if k != "__pad__"} for s in samples}


def _walked(shards: list[str]) -> dict[str, dict]:
    return _by_key(wd.ShardLister(shards).load_tar().group_by_key())


def test_an_index_with_places_reads_the_samples_group_by_key_gives(mixed_shards, tmp_path, monkeypatch):
    monkeypatch.setattr(placed_reads, "BUFFER_BYTES", 4096)  # many refills; 70 KB members past it
    path = write_index(mixed_shards, tmp_path / "index.json", places=True)
    index = ShardIndex.load(path)
    assert index.places is not None and all(index.places.has(i) for i in range(len(SIZES)))
    expected = _walked(mixed_shards)
    for shuffle in (False, True):
        got = list(ExactEpochs(path, batch_size=4, shuffle=shuffle, lanes=3, block=8))
        assert len(got) == sum(SIZES) - sum(SIZES) % 4 or len(got) == sum(SIZES)
        assert _by_key(got) == {k: expected[k] for k in _by_key(got)}


def test_reading_by_places_never_parses_a_tar_header(mixed_shards, tmp_path, monkeypatch):
    path = write_index(mixed_shards, tmp_path / "index.json", places=True)
    walked = _walked(mixed_shards)

    def no_walk(*args, **kwargs):
        raise AssertionError("the tar reader was used")

    monkeypatch.setattr("wds_datapipes.epochs.reading.iter_tar_members", no_walk)
    got = _by_key(ExactEpochs(path, batch_size=1, shuffle=False))
    assert got == walked


@pytest.mark.parametrize("world,rank", [(3, 0), (3, 1), (3, 2), (2, 1)])
def test_spans_that_start_and_stop_inside_a_shard_read_the_same_samples(mixed_shards, tmp_path, world, rank):
    with_places = write_index(mixed_shards, tmp_path / "places.json", places=True)
    without = write_index(mixed_shards, tmp_path / "plain.json")
    options = {"batch_size": 5, "shuffle": True, "seed": 7, "rank": rank, "world_size": world, "lanes": 2, "block": 10}
    first, second = ExactEpochs(with_places, **options), ExactEpochs(without, **options)
    for _ in range(2):
        assert [s["__key__"] for s in first] == [s["__key__"] for s in second]


def test_one_span_inside_a_shard(mixed_shards, tmp_path):
    index = ShardIndex.load(write_index(mixed_shards, tmp_path / "index.json", places=True))
    samples = list(span_samples(index, Span(1, 3, 11, False)))
    assert [s["__key__"] for s in samples] == [f"m1-{i:04d}" for i in range(3, 11)]
    assert samples[0]["bin"] == _walked([mixed_shards[1]])["m1-0003"]["bin"]


def test_members_outside_samples_are_left_out_as_group_by_key_leaves_them(tmp_path):
    path = tmp_path / "odd.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [("__meta__.json", b"{}"), ("a.txt", b"1"), ("README", b"x"), ("a.cls", b"2"),
                           ("b.txt", b"3"), ("dir/c.TXT", b"4")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    index_path = write_index([str(path)], tmp_path / "index.json", places=True)
    assert ShardIndex.load(index_path).places.has(0)
    assert _by_key(ExactEpochs(index_path, batch_size=1, shuffle=False)) == _walked([str(path)])


def test_compressed_shards_get_no_places_and_are_read_through_their_headers(tmp_path, sized_shards):
    plain = sized_shards([6, 4], prefix="p")
    gz = sized_shards([5], prefix="g", gz=True)
    path = write_index(plain + gz, tmp_path / "index.json", places=True)
    places = ShardIndex.load(path).places
    assert [places.has(i) for i in range(3)] == [True, True, False]
    assert _by_key(ExactEpochs(path, batch_size=1, shuffle=False)) == _walked(plain + gz)


def test_a_shard_touched_since_indexing_is_read_through_its_headers_with_a_warning(mixed_shards, tmp_path, caplog):
    path = write_index(mixed_shards, tmp_path / "index.json", places=True)
    stat = os.stat(mixed_shards[1])
    os.utime(mixed_shards[1], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with caplog.at_level(logging.WARNING, logger="wds_datapipes"):
        got = _by_key(ExactEpochs(path, batch_size=1, shuffle=False))
    assert got == _walked(mixed_shards)
    assert any("m-001.tar" in r.getMessage() and "modified since its member places" in r.getMessage()
               for r in caplog.records)


def test_a_shard_of_another_size_is_an_index_mismatch(mixed_shards, tmp_path):
    path = write_index(mixed_shards, tmp_path / "index.json", places=True)
    with open(mixed_shards[2], "ab") as shard:
        shard.write(bytes(512))
    with pytest.raises(IndexMismatchError, match="m-002.tar.*it changed since it was indexed"):
        list(ExactEpochs(path, batch_size=1, shuffle=False))


def _rewrite_rows(path: str, change) -> None:
    """Changes the records of the places file beside the index at ``path``."""
    rows_path = os.path.splitext(str(path))[0] + ".places"
    rows = np.fromfile(rows_path, dtype=place_files.ROW)
    change(rows)
    rows.tofile(rows_path)


@pytest.mark.parametrize("change,reason", [
    (lambda rows: rows["size"].__setitem__(3, 1 << 40), "more than the limit"),
    (lambda rows: rows["data"].__setitem__(3, 1 << 30), "past the end of the"),
])
def test_a_place_beyond_the_limits_or_the_file_is_an_error_naming_shard_and_member(mixed_shards, tmp_path,
                                                                                     change, reason):
    path = write_index(mixed_shards, tmp_path / "index.json", places=True)
    _rewrite_rows(path, change)
    with pytest.raises(ShardFormatError, match=reason) as caught:
        list(ExactEpochs(path, batch_size=1, shuffle=False, limits=Limits(max_member_bytes=4 << 20)))
    assert caught.value.url.endswith("m-000.tar") and caught.value.member == "m0-0001.cls"


def test_missing_places_files_are_a_clear_error(mixed_shards, tmp_path):
    path = write_index(mixed_shards, tmp_path / "index.json", places=True)
    os.remove(tmp_path / "index.keys")
    with pytest.raises(WdsError, match="member places cannot be read"):
        ShardIndex.load(path)


def test_places_are_named_in_the_index_and_stay_memory_mapped_through_pickling(mixed_shards, tmp_path):
    path = write_index(mixed_shards, tmp_path / "index.json", places=True)
    with open(path) as spec:
        entry = json.load(spec)["wds_datapipes"]["places"]
    assert entry == {"shards": "index.places.json", "rows": "index.places", "keys": "index.keys"}
    pipe = ExactEpochs(path, batch_size=2, shuffle=False)
    data = pickle.dumps(pipe)
    assert len(data) < 20_000
    copy = pickle.loads(data)
    assert isinstance(copy.index.places.rows.base, np.memmap)  # a view of the mapped file, not a copy
    assert _by_key(copy) == _by_key(pipe)


def test_saving_a_loaded_index_keeps_its_places(mixed_shards, tmp_path):
    index = ShardIndex.load(write_index(mixed_shards, tmp_path / "index.json", places=True))
    index.save(str(tmp_path / "copy.json"))
    copy = ShardIndex.load(str(tmp_path / "copy.json"))
    assert np.array_equal(copy.places.rows, index.places.rows)
    assert bytes(copy.places.text) == bytes(index.places.text)


def test_the_command_line_writes_places_and_verify_checks_them(mixed_shards, tmp_path):
    out = tmp_path / "cli.json"
    run = subprocess.run([sys.executable, "-m", "wds_datapipes", "index", "--places", "--quiet", "-o", str(out),
                          str(tmp_path / "m-{000..002}.tar")], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert "member places for 3 of 3 shards" in run.stderr
    assert ShardIndex.load(str(out)).places is not None
    verify = [sys.executable, "-m", "wds_datapipes", "verify", str(out)]
    assert subprocess.run(verify, capture_output=True, text=True, timeout=120, check=False).returncode == 0
    _rewrite_rows(out, lambda rows: rows["data"].__setitem__(5, rows["data"][5] + 512))
    bad = subprocess.run(verify, capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 1
    assert "m-000.tar" in bad.stdout and "member places differ" in bad.stdout


@pytest.mark.parametrize("names,suffix", [(("a.txt", "a.cls", "a.txt", "b.txt"), "txt"),
                                          (("a.txt", "a.__url__", "b.txt"), "__url__")])
def test_a_suffix_twice_in_a_sample_gets_no_places_and_fails_as_group_by_key_does(tmp_path, names, suffix):
    path = tmp_path / "twice.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    index_path = write_index([str(path)], tmp_path / "index.json", places=True)
    assert not ShardIndex.load(index_path).places.has(0)
    with pytest.raises(wd.SampleError, match=f"suffix '{suffix}' repeats"):
        list(ExactEpochs(index_path, batch_size=1, shuffle=False))


def test_places_that_do_not_hold_the_samples_the_index_counts_are_a_mismatch(mixed_shards, tmp_path):
    path = write_index(mixed_shards, tmp_path / "index.json", places=True)
    _rewrite_rows(path, lambda rows: rows["sample"].__setitem__(slice(78, 80), 38))  # shard 0's last sample gone
    with pytest.raises(IndexMismatchError, match="places of shard 0 hold 39 samples, the index says 40"):
        ShardIndex.load(path)
    _rewrite_rows(path, lambda rows: rows["sample"].__setitem__(slice(78, 80), 39))
    _rewrite_rows(path, lambda rows: rows["sample"].__setitem__(slice(10, 12), 6))  # sample 5 gone
    with pytest.raises(IndexMismatchError, match="m-000.tar.*do not hold samples 0 .. 39"):
        list(ExactEpochs(path, batch_size=1, shuffle=False))


@pytest.mark.parametrize("places", [True, False], ids=["places", "headers"])
def test_views_hold_the_same_bytes_as_copies_do_and_decode_the_same(mixed_shards, tmp_path, monkeypatch, places):
    monkeypatch.setattr(placed_reads, "BUFFER_BYTES", 4096)  # many reads: every view keeps its own
    path = write_index(mixed_shards, tmp_path / "index.json", places=places)
    copies = list(ExactEpochs(path, batch_size=4, seed=1))
    views = list(ExactEpochs(path, batch_size=4, seed=1, views=True))  # all held: none overwritten
    assert [s["__key__"] for s in views] == [s["__key__"] for s in copies]
    for view, copy in zip(views, copies):
        assert isinstance(view["bin"], memoryview) and view["bin"].readonly
        assert {k: bytes(v) if isinstance(v, memoryview) else v for k, v in view.items()} == copy
    decoded = list(ExactEpochs(path, batch_size=4, seed=1, views=True).decode())
    assert [s["cls"] for s in decoded] == [int(s["cls"]) for s in copies]


def test_views_of_jpegs_decode_into_batches_and_crops_without_a_warning(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    path = tmp_path / "jpg-000.tar"
    with wds.TarWriter(str(path)) as writer:
        for i in range(12):
            pixels = rng.integers(0, 256, (40 + 8 * (i % 3), 56, 3), dtype=np.uint8)
            out = io.BytesIO()
            Image.fromarray(pixels).save(out, format="JPEG")
            writer.write({"__key__": f"j{i:03d}", "jpg": out.getvalue(), "cls": str(i).encode()})
    index = write_index([str(path)], tmp_path / "index.json", places=True)
    for transform in (None, wd.CenterCrop(32, 36)):
        def batches(views, transform=transform):
            return list(ExactEpochs(index, batch_size=4, seed=2, views=views)
                        .decode_batches("torchrgb8", batch_size=4, transform=transform).to_tuple("jpg", "cls"))

        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # torch warns on a read-only buffer
            got = batches(True)
        expected = batches(False)
        assert len(got) == len(expected) == 3
        for (images, labels), (want_images, want_labels) in zip(got, expected):
            assert torch.equal(labels, want_labels)
            pairs = zip(images, want_images) if isinstance(images, list) else [(images, want_images)]
            assert all(torch.equal(a, b) for a, b in pairs)


def test_a_missing_shard_is_an_open_error_naming_it(mixed_shards, tmp_path):
    path = write_index(mixed_shards, tmp_path / "index.json", places=True)
    os.remove(mixed_shards[1])
    with pytest.raises(wd.ShardOpenError, match="m-001.tar.*FileNotFoundError"):
        list(ExactEpochs(path, batch_size=1, shuffle=False))


def test_a_pipe_unpickled_after_its_places_files_were_rewritten_refuses_them(mixed_shards, tmp_path):
    path = write_index(mixed_shards, tmp_path / "index.json", places=True)
    data = pickle.dumps(ExactEpochs(path, batch_size=1, shuffle=False))
    write_index(mixed_shards[1:], tmp_path / "index.json", places=True)  # another index over the same files
    with pytest.raises(IndexMismatchError, match="changed after its index was loaded"):
        pickle.loads(data)


def test_a_run_of_small_members_is_read_once_and_no_further(mixed_shards, tmp_path):
    path = write_index(mixed_shards, tmp_path / "index.json", places=True)
    samples = list(ExactEpochs(path, batch_size=1, shuffle=False, views=True))
    reads = {id(v.obj): len(v.obj) for s in samples for k, v in s.items() if not k.startswith("__")}
    # Large members are read on their own; a read for small ones stops before the next large one.
    assert sum(reads.values()) <= sum(os.path.getsize(s) for s in mixed_shards)
    assert len(reads) < 2 * sum(SIZES)


def test_a_modified_shard_is_reported_once_and_by_verify(mixed_shards, tmp_path, caplog):
    path = write_index(mixed_shards, tmp_path / "index.json", places=True)
    stat = os.stat(mixed_shards[0])
    os.utime(mixed_shards[0], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with caplog.at_level(logging.WARNING, logger="wds_datapipes"):
        for _ in range(2):  # two epochs of 3 ranks' spans
            for rank in range(3):
                list(ExactEpochs(path, batch_size=2, rank=rank, world_size=3, lanes=2, block=4))
    assert sum("m-000.tar" in r.getMessage() for r in caplog.records) == 1
    verify = subprocess.run([sys.executable, "-m", "wds_datapipes", "verify", path], capture_output=True, text=True,
                            timeout=120, check=False)
    assert verify.returncode == 1 and "m-000.tar' was modified since its member places" in verify.stdout


def test_an_interrupted_places_run_resumes_with_the_places_it_took(mixed_shards, tmp_path):
    from wds_datapipes.cli import _scan_to_json
    from wds_datapipes.epochs.index import scan_shard

    out = tmp_path / "resumed.json"
    with open(f"{out}.partial", "w") as partial:  # what an interrupted run leaves
        partial.write(json.dumps(_scan_to_json(scan_shard(mixed_shards[0], places=True))) + "\n")
        partial.write('{"url": "cut')
    run = subprocess.run([sys.executable, "-m", "wds_datapipes", "index", "--places", "-o", str(out),
                          *mixed_shards], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert "1 of 3 shards already indexed" in run.stderr
    fresh = ShardIndex.load(write_index(mixed_shards, tmp_path / "fresh.json", places=True))
    resumed = ShardIndex.load(str(out))
    assert np.array_equal(resumed.places.rows, fresh.places.rows)
    assert bytes(resumed.places.text) == bytes(fresh.places.text)


# ------------------------------------------------------------ shuffled reads at each sample's place

SHUFFLED = {"batch_size": 1, "shuffle": True, "seed": 5, "lanes": 3, "block": 9}


def _plain_order(shards, tmp_path, **options) -> list[dict]:
    return list(ExactEpochs(write_index(shards, tmp_path / "plain.json"), **{**SHUFFLED, **options}))


def _open_shards(shards: list[str]) -> list[str]:
    """The files among ``shards`` that this process holds open."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            held.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # closed meanwhile (the listing's own fd among them)
            pass
    wanted = {os.path.realpath(shard) for shard in shards}
    return [path for path in held if path in wanted]


@pytest.mark.parametrize("views", [False, True], ids=["bytes", "views"])
def test_a_shuffled_share_is_read_sample_by_sample_in_the_lanes_order(mixed_shards, tmp_path, monkeypatch, views):
    path = write_index(mixed_shards, tmp_path / "index.json", places=True)
    expected = _plain_order(mixed_shards, tmp_path)

    def no_lanes(*args, **kwargs):
        raise AssertionError("the lanes were read")

    monkeypatch.setattr("wds_datapipes.epochs.reading._lane_samples", no_lanes)
    monkeypatch.setattr("wds_datapipes.epochs.placed_shuffle.OPEN_PER_LANE", 0)  # one open: each change of shard reopens
    assert _open_shards(mixed_shards) == []
    got = list(ExactEpochs(path, views=views, **SHUFFLED))
    assert [s["__key__"] for s in got] == [s["__key__"] for s in expected]
    assert [{k: bytes(v) if isinstance(v, memoryview) else v for k, v in s.items()} for s in got] == expected
    assert all(isinstance(s["bin"], memoryview if views else bytes) for s in got)
    assert list(got[0]) == list(expected[0])  # the fields in the same order, __pad__ last
    assert _open_shards(mixed_shards) == []  # every shard closed; other fds of the process may come and go
    # Views: one read per sample (its members and the headers between them), one per member
    # where that would pass the megabyte.
    if views:
        small = [s for s in got if s["bin"].nbytes < placed_reads.BUFFER_BYTES]
        assert len(small) < len(got) and all(s["bin"].obj is s["cls"].obj for s in small)
        assert all(len(s["bin"].obj) < s["bin"].nbytes + s["cls"].nbytes + 4096 for s in small)
        assert all(len(s["bin"].obj) == s["bin"].nbytes for s in got if s not in small)


@pytest.mark.parametrize("options", [
    {"mode": "pad", "world_size": 3, "rank": 2},                      # spans that repeat samples as pads
    {"samples_per_epoch": 250, "world_size": 2, "rank": 1},           # each shard in two or three passes
    {"samples_per_epoch": 250, "world_size": 2, "rank": 0, "block": 30, "lanes": 2},
], ids=["pads", "passes", "passes-longer-blocks"])
def test_a_shuffled_read_by_places_equals_the_lanes_with_pads_and_passes(mixed_shards, tmp_path, options):
    placed = ExactEpochs(write_index(mixed_shards, tmp_path / "index.json", places=True), **{**SHUFFLED, **options})
    plain = ExactEpochs(write_index(mixed_shards, tmp_path / "plain.json"), **{**SHUFFLED, **options})
    for _ in range(2):  # two epochs
        expected = [(s["__key__"], s["__pad__"]) for s in plain]
        assert [(s["__key__"], s["__pad__"]) for s in placed] == expected
        assert any(pad for _, pad in expected) or len({k for k, _ in expected}) < len(expected)  # repeats


def test_a_shuffled_read_by_places_under_two_workers_equals_the_lanes(mixed_shards, tmp_path):
    path = write_index(mixed_shards, tmp_path / "index.json", places=True)
    plain = write_index(mixed_shards, tmp_path / "plain.json")
    keys = [[s["__key__"] for s in DataLoader(ExactEpochs(index, **SHUFFLED), batch_size=None, num_workers=2)]
            for index in (path, plain)]
    assert keys[0] == keys[1] and len(keys[0]) == sum(SIZES)


def test_a_reader_keeps_few_shards_open_and_reopens_them(tmp_path, sized_shards, monkeypatch):
    shards = sized_shards([7] * 11, prefix="s")  # 77 samples: the lanes meet inside a shard
    path = write_index(shards, tmp_path / "index.json", places=True)
    options = {**SHUFFLED, "lanes": 2, "block": 4}
    expected = [s["__key__"] for s in ExactEpochs(write_index(shards, tmp_path / "plain.json"), **options)]
    monkeypatch.setattr("wds_datapipes.epochs.placed_shuffle.OPEN_PER_LANE", 1)
    opened = []
    real_open = placed_reads.open_usable
    monkeypatch.setattr("wds_datapipes.epochs.placed_shuffle.open_usable",
                        lambda *a, **k: opened.append(a[2]) or real_open(*a, **k))
    pipe = ExactEpochs(path, **options)
    fds = len(os.listdir("/proc/self/fd"))
    most = 0
    got = []
    for sample in pipe:
        got.append(sample["__key__"])
        most = max(most, len(os.listdir("/proc/self/fd")) - fds)
    assert got == expected
    assert most <= 4  # the block's shards at most: 2 lanes x 2 rows
    assert len(opened) > len(set(opened)) == len(shards)  # some closed and opened again
    assert len(os.listdir("/proc/self/fd")) == fds


def test_a_shuffled_share_with_a_shard_without_places_reads_the_rest_by_the_lanes(tmp_path, sized_shards):
    plain = sized_shards([9, 7, 8], prefix="p")
    gz = sized_shards([6], prefix="g", gz=True)
    path = write_index(plain + gz, tmp_path / "index.json", places=True)
    expected = [s["__key__"] for s in ExactEpochs(write_index(plain + gz, tmp_path / "plain.json"), **SHUFFLED)]
    assert [s["__key__"] for s in ExactEpochs(path, **SHUFFLED)] == expected


@pytest.mark.parametrize("taken", [1, 8, 9, 40])
def test_a_shuffled_read_by_places_resumes_where_it_stopped(mixed_shards, tmp_path, taken):
    path = write_index(mixed_shards, tmp_path / "index.json", places=True)
    expected = [s["__key__"] for s in _plain_order(mixed_shards, tmp_path, rank=1, world_size=2)]
    first = ExactEpochs(path, rank=1, world_size=2, **SHUFFLED)
    iterator = iter(first)
    seen = [next(iterator)["__key__"] for _ in range(taken)]
    resumed = ExactEpochs(path, rank=1, world_size=2, **SHUFFLED)
    resumed.load_state_dict(first.state_dict())
    assert seen + [s["__key__"] for s in resumed] == expected


def test_a_shuffled_read_stopped_early_closes_its_shards(mixed_shards, tmp_path):
    path = write_index(mixed_shards, tmp_path / "index.json", places=True)
    pipe = ExactEpochs(path, **SHUFFLED)  # its index maps the places files
    fds = len(os.listdir("/proc/self/fd"))
    iterator = iter(pipe)
    for _ in range(10):
        next(iterator)
    assert len(os.listdir("/proc/self/fd")) > fds
    iterator.close()
    assert len(os.listdir("/proc/self/fd")) == fds


@pytest.mark.parametrize("change,reason", [
    (lambda rows: rows["size"].__setitem__(3, 1 << 40), "more than the limit"),
    (lambda rows: rows["data"].__setitem__(3, 1 << 30), "past the end of the"),
])
def test_a_bad_place_in_a_shuffled_read_is_an_error_naming_shard_and_member(mixed_shards, tmp_path, change, reason):
    path = write_index(mixed_shards, tmp_path / "index.json", places=True)
    _rewrite_rows(path, change)
    with pytest.raises(ShardFormatError, match=reason) as caught:
        list(ExactEpochs(path, limits=Limits(max_member_bytes=4 << 20), **SHUFFLED))
    assert caught.value.url.endswith("m-000.tar") and caught.value.member == "m0-0001.cls"


def test_a_shuffled_read_with_a_touched_shard_reads_the_lanes_with_a_warning(mixed_shards, tmp_path, caplog):
    path = write_index(mixed_shards, tmp_path / "index.json", places=True)
    expected = _plain_order(mixed_shards, tmp_path)
    stat = os.stat(mixed_shards[2])
    os.utime(mixed_shards[2], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with caplog.at_level(logging.WARNING, logger="wds_datapipes"):
        assert list(ExactEpochs(path, **SHUFFLED)) == expected
    assert any("m-002.tar" in r.getMessage() and "modified since" in r.getMessage() for r in caplog.records)


def test_a_shuffled_read_of_a_shard_that_grew_fails_naming_it(mixed_shards, tmp_path):
    path = write_index(mixed_shards, tmp_path / "index.json", places=True)
    with open(mixed_shards[2], "ab") as shard:
        shard.write(bytes(512))
    with pytest.raises(IndexMismatchError, match="m-002.tar.*it changed since it was indexed"):
        list(ExactEpochs(path, **SHUFFLED))


def test_a_shuffled_read_of_a_missing_shard_fails_naming_it(mixed_shards, tmp_path):
    path = write_index(mixed_shards, tmp_path / "index.json", places=True)
    os.remove(mixed_shards[1])
    with pytest.raises(wd.ShardOpenError, match="m-001.tar.*FileNotFoundError"):
        list(ExactEpochs(path, **SHUFFLED))


def test_a_shard_truncated_while_open_is_a_format_error_naming_it(mixed_shards, tmp_path):
    path = write_index(mixed_shards, tmp_path / "index.json", places=True)
    pipe = ExactEpochs(path, **SHUFFLED)  # its index maps the places files
    fds = len(os.listdir("/proc/self/fd"))
    iterator = iter(pipe)
    while len(os.listdir("/proc/self/fd")) < fds + len(mixed_shards):  # until every shard is open
        next(iterator)
    for shard in mixed_shards:
        os.truncate(shard, 4096)
    with pytest.raises(ShardFormatError, match="truncated") as caught:
        list(iterator)
    assert type(caught.value) is ShardFormatError and caught.value.url.endswith(".tar") and caught.value.member
