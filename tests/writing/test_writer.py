"""write_shards: what it writes reads back everywhere, deterministically, with its index, across ranks."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.writing.conftest import make_samples
from wds_datapipes import ShardLister
from wds_datapipes.decoding.encoding import encode_sample
from wds_datapipes.epochs.exact_epochs import ExactEpochs
from wds_datapipes.epochs.index import ShardIndex, scan_shard
from wds_datapipes.epochs.places import MemberPlaces
from wds_datapipes.handlers import ignore_and_continue
from wds_datapipes.shards.grouping import split_key
from wds_datapipes.writing import FileBytes, join_index, shard_file, write_shards
from wds_datapipes.writing.plan import ShardPlanner, assign_shards, sample_cost
from wds_datapipes.writing.shard_file import check_fields, name_problem


def _expected(samples):
    return [{"__key__": s["__key__"], **encode_sample(s)} for s in samples]


def _shards(folder) -> dict[str, bytes]:
    return {p: (folder / p).read_bytes() for p in sorted(os.listdir(folder)) if p.endswith(".tar")}


def _ours(urls):
    return [{k: v for k, v in s.items() if k != "__url__"}
            for s in ShardLister([str(u) for u in urls]).load_tar().group_by_key()]


def test_written_shards_read_back_identically_by_webdataset_and_our_pipeline(tmp_path, samples):
    """oracles: webdataset 1.0.2's WebDataset reader, tarfile, and our ShardLister pipeline."""
    import webdataset as wds

    report = write_shards(samples, str(tmp_path / "out/train-%06d.tar"), maxcount=16)
    urls = sorted((tmp_path / "out").glob("*.tar"))
    assert len(urls) == 4 and report.read == report.written == 60 and not report.skipped
    expected = _expected(samples)
    theirs = [{k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"}
              for s in wds.WebDataset([str(u) for u in urls], shardshuffle=False)]
    assert theirs == expected == _ours(urls)
    with tarfile.open(urls[0]) as tar:
        assert tar.getnames()[:5] == ["s00000.bin", "s00000.cls", "s00000.txt", "s00000.json", "s00000.npy"]


def test_the_index_written_in_the_same_pass_equals_a_fresh_scan_and_verify_passes(tmp_path, samples):
    """oracle: scan_shard (the `index` command's reader) over the written shards, and `verify`."""
    write_shards(samples, str(tmp_path / "out/train-%06d.tar"), maxcount=16)
    index = ShardIndex.load(str(tmp_path / "out/index.json"))
    offsets = index.offsets_array()
    at = 0
    for shard in range(len(index)):
        scan = scan_shard(index.url(shard), places=True)
        assert (index.sizes[shard], index.shards[shard].filesize) == (scan.nsamples, scan.filesize)
        assert list(offsets[at : at + scan.nsamples]) == list(scan.offsets)
        assert index.places.has(shard)
        at += scan.nsamples
    verify = subprocess.run([sys.executable, "-m", "wds_datapipes", "verify", str(tmp_path / "out/index.json")],
                            check=False, capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0, verify.stderr


_FOLDER = st.text("ab.-", min_size=1, max_size=4).filter(lambda f: f not in (".", ".."))
_STEM = st.text("abcxyz019_-", min_size=1, max_size=6).filter(lambda t: not t.startswith("__"))
_KEYS = st.tuples(st.lists(_FOLDER, max_size=2), _STEM).map(lambda parts: "/".join([*parts[0], parts[1]]))
_FIELDS = st.lists(st.sampled_from(["jpg", "JPG.b", "seg.png", "cls", "Txt"]), min_size=1, max_size=3,
                   unique_by=str.lower)


@settings(max_examples=40, deadline=None)
@given(keys=st.lists(_KEYS, min_size=1, max_size=12, unique=True), fields=_FIELDS, data=st.data())
def test_the_places_the_writer_makes_equal_those_a_scan_takes(tmp_path_factory, keys, fields, data):
    """oracle: scan_shard(places=True), which splits the member names it reads (the writer
    takes each sample's key and each member's suffix as it wrote them instead)."""
    out = tmp_path_factory.mktemp("places")
    samples = [{"__key__": key, **{f: data.draw(st.binary(max_size=700)) for f in fields}} for key in keys]
    write_shards(samples, str(out / "s-%04d.tar"), maxcount=data.draw(st.integers(1, 5)), fsync=False)
    index = ShardIndex.load(str(out / "index.json"))
    for shard in range(len(index)):
        got, scanned = index.places.shard_places(shard), scan_shard(index.url(shard), places=True).places
        assert got.names == scanned.names
        for column in ("data", "sizes", "samples"):
            assert list(getattr(got, column)) == list(getattr(scanned, column)), column
    assert index.places.suffixes == MemberPlaces.from_shards(
        [scan_shard(index.url(n), places=True).places for n in range(len(index))]).suffixes
    # The run joined its index from memory; joined again from its progress record on disk
    # (names split again), the index files are the same bytes.
    files = {p.name: p.read_bytes() for p in out.glob("index.*") if "progress" not in p.name}
    join_index(str(out / "index.json"), 1)
    assert {p.name: p.read_bytes() for p in out.glob("index.*") if "progress" not in p.name} == files


def test_exact_epochs_reads_every_written_sample_from_the_written_index(tmp_path, samples):
    """oracle: the input samples, encoded (ExactEpochs reads by the member places, no index pass)."""
    write_shards(samples, str(tmp_path / "out/train-%06d.tar"), maxcount=16)
    got = {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")}
           for s in ExactEpochs(str(tmp_path / "out/index.json"), batch_size=1, shuffle=False)}
    assert got == {s["__key__"]: {k: v for k, v in s.items() if k != "__key__"} for s in _expected(samples)}


@pytest.mark.timeout(400)
def test_shards_are_byte_identical_for_1_2_and_4_workers(tmp_path):
    """oracle: the one-process run's bytes (shards and sample offsets)."""
    samples = make_samples(90, seed=3)
    outputs = []
    for workers in (1, 2, 4):
        folder = tmp_path / f"w{workers}"
        write_shards(samples, str(folder / "s-%04d.tar"), maxsize=40_000, workers=workers, fsync=False)
        outputs.append((_shards(folder), (folder / "index.offsets").read_bytes()))
    assert len(outputs[0][0]) > 4
    assert outputs[0] == outputs[1] == outputs[2]


def test_maxsize_and_maxcount_bound_each_shard(tmp_path):
    """oracle: os.stat of each shard, and the plan's rule (a lone sample may pass maxsize)."""
    samples = make_samples(80, seed=5)
    write_shards(samples, str(tmp_path / "s-%04d.tar"), maxsize=30_000, maxcount=9, fsync=False)
    index = ShardIndex.load(str(tmp_path / "index.json"))
    assert index.total == 80 and max(index.sizes) <= 9
    for shard in range(len(index)):
        assert index.sizes[shard] == 1 or os.path.getsize(index.url(shard)) <= 30_000


def test_plan_assigns_by_count_and_bytes_like_a_slow_model():
    """oracle: a slow model of the rule (close a shard before the sample that would overflow it)."""
    import random

    rng = random.Random(1)
    for _ in range(200):
        costs = [rng.randrange(1, 100) for _ in range(rng.randrange(0, 40))]
        maxcount, maxsize = rng.choice([None, 1, 3, 7]), rng.choice([None, 50, 150, 400])
        model, shard, count, size = [], 0, 0, 1024  # the end blocks
        for cost in costs:
            full = (maxcount and count == maxcount) or (maxsize and size + cost > maxsize)
            if count and full:
                shard, count, size = shard + 1, 0, 1024
            model.append(shard)
            count, size = count + 1, size + cost
        assert list(assign_shards(costs, maxcount, maxsize)) == model
        planner = ShardPlanner(maxcount, maxsize)  # the writer's road: one sample at a time
        assert [planner.shard_of(cost) for cost in costs] == model
    assert sample_cost("k", [("jpg", 1), ("cls", 512)]) == 512 + 512 + 512 + 512


@pytest.mark.parametrize("limits", [{"maxcount": 0}, {"maxsize": 0}, {"maxcount": -1, "maxsize": 100}])
def test_a_maxcount_or_maxsize_below_one_is_refused_before_any_input_is_read(tmp_path, limits):
    """oracle: the rule that a shard holds at least one sample; an empty input is refused too."""
    read = []

    def inputs():
        read.append(True)
        yield from make_samples(3, seed=1)

    for samples in (inputs(), iter(())):
        with pytest.raises(ValueError, match="must be >= 1"):
            write_shards(samples, str(tmp_path / "s-%04d.tar"), fsync=False, restart=True, **limits)
    assert not read and not [p for p in os.listdir(tmp_path) if p.endswith(".tar")]


def test_two_ranks_write_disjoint_shards_that_join_into_the_one_rank_result(tmp_path):
    """oracle: the same input written by one rank (same shards, same bytes, same index order)."""
    samples = make_samples(70, seed=2)
    write_shards(samples, str(tmp_path / "one/s-%04d.tar"), maxcount=8, fsync=False)
    reports = [write_shards(samples, str(tmp_path / "two/s-%04d.tar"), maxcount=8, rank=r, world=2, fsync=False)
               for r in range(2)]
    assert reports[0].written + reports[1].written == 70 and reports[0].index is None
    joined = join_index(str(tmp_path / "two/index.json"), 2)
    assert _shards(tmp_path / "one") == _shards(tmp_path / "two")
    assert joined.total == 70 and list(joined.sizes) == list(ShardIndex.load(str(tmp_path / "one/index.json")).sizes)
    assert ((tmp_path / "one/index.offsets").read_bytes() == (tmp_path / "two/index.offsets").read_bytes())


def test_joining_before_every_rank_finished_names_the_missing_rank(tmp_path):
    """oracle: the rule that a join needs every rank's end line."""
    from wds_datapipes.errors import ShardWriteError

    write_shards(make_samples(20), str(tmp_path / "s-%04d.tar"), maxcount=4, rank=0, world=3, fsync=False)
    with pytest.raises(ShardWriteError, match="rank 1 of 3"):
        join_index(str(tmp_path / "index.json"), 3)


def test_files_are_copied_into_the_shard_byte_for_byte(tmp_path):
    """oracle: the files' own bytes, read back with tarfile."""
    rng = np.random.default_rng(0)
    paths = []
    for i, size in enumerate([0, 1, 511, 512, 513, 70_000]):
        path = tmp_path / f"in{i}.bin"
        path.write_bytes(rng.bytes(size))
        paths.append(path)
    write_shards([{"__key__": f"k{i}", "bin": FileBytes(str(p))} for i, p in enumerate(paths)],
                 str(tmp_path / "out/s-%02d.tar"))
    with tarfile.open(tmp_path / "out/s-00.tar") as tar:
        assert [tar.extractfile(m).read() for m in tar] == [p.read_bytes() for p in paths]


_SIZES = st.sampled_from([0, 1, 511, 512, 513, 3000, 4095, 4096, 4097, 8191, 13_000])


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(_SIZES, min_size=1, max_size=8), texts=st.lists(st.booleans(), min_size=8, max_size=8))
def test_files_and_values_across_the_write_buffers_edges_read_back_with_tarfile_and_a_scan(
        tmp_path_factory, sizes, texts):
    """oracles: tarfile reads every member back with the files' own bytes; a fresh scan of the
    written shard finds the offsets and places the writer recorded. The write buffer is cut to
    4 KB so files end, start and pass it at every offset (with a small value between some)."""
    folder = tmp_path_factory.mktemp("edges")
    rng = np.random.default_rng(len(sizes))
    samples, expected = [], []
    for i, size in enumerate(sizes):
        path = folder / f"in{i}.bin"
        path.write_bytes(rng.bytes(size))
        sample = {"__key__": f"k{i}", "bin": FileBytes(str(path))}
        expected.append((f"k{i}.bin", path.read_bytes()))
        if texts[i]:
            sample["txt"] = "x" * (i * 700)
            expected.append((f"k{i}.txt", sample["txt"].encode()))
        samples.append(sample)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(shard_file, "_BUFFER", 4096)
        write_shards(samples, str(folder / "out/s-%02d.tar"), fsync=False)
    shard = str(folder / "out/s-00.tar")
    with tarfile.open(shard) as tar:
        assert [(m.name, tar.extractfile(m).read()) for m in tar] == expected
    index, fresh = ShardIndex.load(str(folder / "out/index.json")), scan_shard(shard, places=True)
    assert list(index.offsets_array()) == list(fresh.offsets)
    got = index.places.shard_places(0)
    assert got.names == fresh.places.names
    for column in ("data", "sizes", "samples"):
        assert list(getattr(got, column)) == list(getattr(fresh.places, column)), column


@pytest.mark.parametrize("short", [1, 2])
def test_a_file_that_ends_short_of_its_size_is_cut_out_whole_and_named(tmp_path, monkeypatch, short):
    """oracle: the same shard written without the short file, byte for byte (the writer is
    deterministic), and tarfile reading it to its end; the report names the short file. With
    a 4 KB buffer part of the short file was written out before it ended."""
    monkeypatch.setattr(shard_file, "_BUFFER", 4096)
    paths = []
    for i in range(3):
        paths.append(tmp_path / f"in{i}.bin")
        paths[-1].write_bytes(bytes([i]) * 10_000)
    samples = [{"__key__": f"k{i}", "bin": FileBytes(str(p)), "__source__": p.name} for i, p in enumerate(paths)]
    write_shards([s for i, s in enumerate(samples) if i != short], str(tmp_path / "clean/s-%02d.tar"), fsync=False)
    stat = os.fstat

    def fstat(fd):  # the short file says it is 10 bytes longer than it is (as if cut while copied)
        result = stat(fd)
        if os.readlink(f"/proc/self/fd/{fd}").endswith(f"in{short}.bin"):
            return os.stat_result((*result[:6], result.st_size + 10, *result[7:]))
        return result

    monkeypatch.setattr(shard_file.os, "fstat", fstat)
    report = write_shards(samples, str(tmp_path / "out/s-%02d.tar"), fsync=False, handler=ignore_and_continue)
    assert report.written == 2
    why = "OSError: [Errno 5] the file ended 10 bytes short of its size 10010 (changed while it was copied)"
    assert report.skipped == [(f"in{short}.bin", why)]
    assert (tmp_path / "out/s-00.tar").read_bytes() == (tmp_path / "clean/s-00.tar").read_bytes()
    with tarfile.open(tmp_path / "out/s-00.tar") as tar:
        assert [(m.name, tar.extractfile(m).read()) for m in tar] == [
            (f"k{i}.bin", paths[i].read_bytes()) for i in range(3) if i != short]


def test_a_map_function_runs_in_the_workers_and_its_output_is_written(tmp_path):
    """oracle: the map applied by hand to the input, in one process."""
    samples = make_samples(30)
    write_shards(samples, str(tmp_path / "a/s-%02d.tar"), maxcount=5, workers=2, map=_upper_txt, fsync=False)
    got = _ours(sorted((tmp_path / "a").glob("*.tar")))
    assert got == _expected([_upper_txt(s) for s in samples if int(s["__key__"][1:]) % 7])


def _upper_txt(sample):
    if int(sample["__key__"][1:]) % 7 == 0:
        return None  # left out, and reported
    return {**sample, "txt": sample["txt"].upper()}


def test_no_part_file_is_left_and_the_shards_are_complete_archives(tmp_path, samples):
    """oracle: tarfile reads each shard to its end."""
    write_shards(samples, str(tmp_path / "s-%02d.tar"), maxcount=7)
    assert not list(tmp_path.glob("*.part"))
    for shard in tmp_path.glob("*.tar"):
        with tarfile.open(fileobj=io.BytesIO(shard.read_bytes())) as tar:
            assert len(tar.getmembers()) % 5 == 0


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="ab._/\n_Z", min_size=1, max_size=8), st.text(alphabet="ab._/\n_Z", min_size=1, max_size=6))
def test_a_name_is_accepted_exactly_when_it_splits_back_into_its_key_and_field(key, suffix):
    """oracle: split_key, the readers' own rule: ``key.suffix`` is accepted (no problem) exactly
    when it splits back into (key, suffix lowercased); a refused one gets a reason, never a crash
    (a key like "." splits into no key at all)."""
    problem = name_problem(key, suffix)
    assert (problem is None) == (split_key(f"{key}.{suffix}") == (key, suffix.lower()))
    assert problem is None or isinstance(problem, str)


_NAME = st.text(alphabet="ab._/\nZ", max_size=6)


@settings(max_examples=400, deadline=None)
@given(_NAME, st.lists(_NAME, max_size=4))
def test_a_sample_is_accepted_exactly_when_each_name_splits_back_and_none_repeats(key, suffixes):
    """oracle: split_key again, over a whole sample (the writer's fast path for plain keys must
    agree with it): accepted exactly when it has fields, each ``key.suffix`` splits back into
    (key, suffix lowercased), no field name is empty (the writer's own rule: a reader would give
    a field named ""), and no two fields are the same name lowercased."""
    wanted = bool(suffixes) and all(s and split_key(f"{key}.{s}") == (key, s.lower()) for s in suffixes) \
        and len({s.lower() for s in suffixes}) == len(suffixes)
    assert (check_fields(key, suffixes) is None) == wanted
