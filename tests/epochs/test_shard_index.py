"""The shard index (wids's JSON, offsets beside it) and the command line that makes and checks it."""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from builders import write_index

from wds_datapipes import (
    IndexMismatchError,
    ShardFormatError,
    ShardIndex,
    ShardLister,
    WdsError,
    build_index,
    scan_shard,
)
from wds_datapipes.cli import expand_urls
from wds_datapipes.epochs.reading import span_samples
from wds_datapipes.epochs.spans import Span
from wds_datapipes.shards.openers import url_scheme


def _samples_per_shard(shards: list[str]) -> list[int]:
    return [len(list(ShardLister([s]).load_tar().group_by_key())) for s in shards]


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wds_datapipes", *args], capture_output=True, text=True, check=False,
                          cwd=cwd, timeout=120)


@pytest.fixture
def writer_shards(tmp_path) -> list[str]:
    """Shards written by webdataset's ShardWriter: 5 shards of 37, 37, 37, 37 and 2 samples."""
    pattern = str(tmp_path / "train-%04d.tar")
    with wds.ShardWriter(pattern, maxcount=37, verbose=0) as sink:
        for i in range(150):
            sink.write({"__key__": f"s{i:05d}", "jpg": os.urandom(50 + i), "cls": str(i % 10).encode()})
    return [pattern % i for i in range(5)]


# ---------------------------------------------------------------- counts and formats


def test_index_counts_samples_as_the_readers_and_wids_do(writer_shards, tmp_path):
    from wids.wids import ShardListDataset, compute_num_samples

    path = write_index(writer_shards, tmp_path / "index.json")
    index = ShardIndex.load(path)
    assert index.sizes.tolist() == _samples_per_shard(writer_shards) == [37, 37, 37, 37, 2]
    assert index.sizes.tolist() == [compute_num_samples(s) for s in writer_shards]
    theirs = ShardListDataset(path, cache_dir=str(tmp_path / "wids-cache"))
    assert theirs.lengths == index.sizes.tolist() and len(theirs) == 150
    assert [s.filesize for s in index.shards] == [os.path.getsize(s) for s in writer_shards]


def test_an_index_written_by_wids_reads_here(writer_shards, tmp_path, monkeypatch):
    from wids.wids_index import main_create

    monkeypatch.chdir(tmp_path)
    main_create(argparse.Namespace(files=[os.path.basename(s) for s in writer_shards], output="wids.json",
                                   name="train", base=None, info=None))
    index = ShardIndex.load(str(tmp_path / "wids.json"))
    assert index.sizes.tolist() == [37, 37, 37, 37, 2]
    assert [index.url(i) for i in range(len(index))] == writer_shards
    assert not index.has_offsets


def test_offsets_are_where_tarfile_finds_each_samples_first_header(tmp_path, sized_shards):
    shards = sized_shards([9, 4])
    long_names = tmp_path / "long.tar"  # GNU long names: the offset is that of the long-name header
    with tarfile.open(long_names, "w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(5):
            for suffix in ("cls", "txt"):
                info = tarfile.TarInfo(f"{'d' * 120}/k{i}.{suffix}")
                info.size = 3
                tar.addfile(info, io.BytesIO(b"abc"))
    for shard in [*shards, str(long_names)]:
        with tarfile.open(shard) as tar:
            firsts, previous = [], None
            for member in tar.getmembers():
                key = member.name.split(".")[0]
                if key != previous:
                    firsts.append(member.offset)
                    previous = key
        assert scan_shard(shard).offsets.tolist() == firsts


def test_index_round_trips_with_its_offsets_file(tmp_path, sized_shards):
    shards = sized_shards([3, 0, 5])
    path = write_index(shards, tmp_path / "ds.json")
    spec = json.loads(Path(path).read_text())
    assert spec["wids_version"] == 1
    assert [s["url"] for s in spec["shardlist"]] == [os.path.basename(s) for s in shards]
    assert spec["wds_datapipes"] == {"offsets": "ds.offsets", "dtype": "<u4", "unit": 512}
    assert os.path.getsize(tmp_path / "ds.offsets") == 4 * 8
    index = ShardIndex.load(path)
    assert index.sizes.tolist() == [3, 0, 5]
    assert index.offsets_array().tolist() == np.concatenate([scan_shard(s).offsets for s in shards]).tolist()
    assert index.sample_offset(2, 0) == 0 and index.sample_offset(2, 4) > 0


def test_a_memory_mapped_index_pickles_without_its_offsets(tmp_path, sized_shards):
    index = ShardIndex.load(write_index(sized_shards([400, 400]), tmp_path / "i.json"))
    data = pickle.dumps(index)
    assert len(data) < 2000  # the 800 offsets stay in the file
    assert pickle.loads(data).sample_offset(1, 399) == index.sample_offset(1, 399)


def test_gzipped_shards_are_counted_and_have_no_offsets(tmp_path, sized_shards):
    shards = sized_shards([6, 2], gz=True) + sized_shards([4], prefix="p")
    index = ShardIndex.load(write_index(shards, tmp_path / "i.json"))
    assert index.sizes.tolist() == [6, 2, 4]
    assert index.sample_offset(0, 3) is None and index.sample_offset(2, 3) is not None
    assert [s["__key__"] for s in span_samples(index, Span(0, 2, 5))] == ["u0-0002", "u0-0003", "u0-0004"]


# ---------------------------------------------------------------- URLs


def test_relative_shard_urls_are_read_against_the_index(tmp_path, sized_shards):
    shards = sized_shards([2], folder=tmp_path / "data")
    (tmp_path / "meta").mkdir()
    path = write_index(shards, tmp_path / "meta" / "index.json")
    assert json.loads(Path(path).read_text())["shardlist"][0]["url"] == "../data/u-000.tar"
    index = ShardIndex.load(path)
    assert index.url(0) == str(tmp_path / "data" / "u-000.tar")


def test_a_shard_named_like_a_pipe_stays_a_file_in_the_index(tmp_path, sized_shards, monkeypatch):
    (shard,) = sized_shards([3], prefix="p")
    hostile = tmp_path / "pipe:touch pwned #.tar"
    os.rename(shard, hostile)
    monkeypatch.chdir(tmp_path)
    path = write_index(expand_urls(["*.tar"]), tmp_path / "i.json")  # what `index *.tar` does
    assert json.loads(Path(path).read_text())["shardlist"][0]["url"] == "./pipe:touch pwned #.tar"
    index = ShardIndex.load(path)
    assert url_scheme(index.url(0)) == "file"
    assert len(list(span_samples(index, Span(0, 0, 3)))) == 3
    assert not (tmp_path / "pwned").exists()


def test_an_index_runs_no_pipe_command_unless_allowed(tmp_path):
    path = tmp_path / "i.json"
    path.write_text(json.dumps({"wids_version": 1, "shardlist": [{"url": "pipe:touch pwned", "nsamples": 1}]}))
    with pytest.raises(WdsError, match="allow_pipe"):
        ShardIndex.load(str(path))
    assert ShardIndex.load(str(path), allow_pipe=True).url(0) == "pipe:touch pwned"


def test_a_file_that_is_not_an_index_is_refused_clearly(tmp_path):
    (tmp_path / "x.json").write_text('{"shards": []}')
    with pytest.raises(WdsError, match="not a wids index"):
        ShardIndex.load(str(tmp_path / "x.json"))


# ---------------------------------------------------------------- a stale index is an error


def _rewrite(shard: str, n: int, prefix: str = "u0") -> None:
    with wds.TarWriter(shard) as writer:
        for i in range(n):
            writer.write({"__key__": f"{prefix}-{i:04d}", "cls": str(i).encode(),
                          "txt": f"sample {i} of shard 0 ".encode() * (1 + i % 7)})


@pytest.mark.parametrize("change", [-1, +1])
@pytest.mark.parametrize("offsets", [True, False])
def test_reading_a_shard_that_changed_since_indexing_raises_naming_it(tmp_path, sized_shards, change, offsets):
    (shard,) = sized_shards([10])
    index = ShardIndex.load(write_index([shard], tmp_path / "i.json", offsets=offsets))
    index.shards[0] = type(index.shards[0])(index.shards[0].url, 10, None)  # no size check: count it
    _rewrite(shard, 10 + change)
    with pytest.raises(IndexMismatchError, match="u-000.tar.*index says 10"):
        list(span_samples(index, Span(0, 0, 10)))
    if change < 0:
        with pytest.raises(IndexMismatchError, match="u-000.tar"):
            list(span_samples(index, Span(0, 5, 10)))


def test_a_shard_of_another_size_than_indexed_is_refused_before_reading(tmp_path, sized_shards):
    (shard,) = sized_shards([10])
    index = ShardIndex.load(write_index([shard], tmp_path / "i.json"))
    _rewrite(shard, 30)
    assert os.path.getsize(shard) != index.shards[0].filesize
    with pytest.raises(IndexMismatchError, match="bytes, the index says"):
        next(span_samples(index, Span(0, 0, 2)))


# ---------------------------------------------------------------- the command line


def test_cli_index_then_verify_then_inspect(tmp_path, writer_shards):
    made = _cli("index", str(tmp_path / "train-{0000..0004}.tar"), "-o", str(tmp_path / "index.json"), "-j", "2")
    assert made.returncode == 0, made.stderr
    assert "5 shards, 150 samples, with sample offsets" in made.stderr
    assert ShardIndex.load(str(tmp_path / "index.json")).sizes.tolist() == [37, 37, 37, 37, 2]
    checked = _cli("verify", str(tmp_path / "index.json"), "--across-shards")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    shown = _cli("inspect", str(tmp_path / "index.json"), "-n", "3")
    assert shown.returncode == 0 and "5 shards, 150 samples" in shown.stdout
    assert "jpg" in shown.stdout and "cls" in shown.stdout
    listed = _cli("inspect", writer_shards[0], "-n", "2")
    assert "s00000.jpg" in listed.stdout and "37 samples" in listed.stdout


def test_cli_index_takes_globs_and_directories(tmp_path, sized_shards):
    sized_shards([2, 3], folder=tmp_path / "d")
    for spec in (str(tmp_path / "d" / "*.tar"), str(tmp_path / "d")):
        assert _cli("index", spec, "-o", str(tmp_path / "i.json"), "--quiet").returncode == 0
        assert ShardIndex.load(str(tmp_path / "i.json")).sizes.tolist() == [2, 3]


def test_cli_verify_names_a_shard_rewritten_with_one_sample_less(tmp_path, sized_shards):
    shards = sized_shards([10, 8])
    write_index(shards, tmp_path / "i.json")
    _rewrite(shards[0], 9)
    checked = _cli("verify", str(tmp_path / "i.json"))
    assert checked.returncode == 1
    assert f"shard {shards[0]!r} has 9 samples, the index says 10" in checked.stdout
    assert shards[1] not in checked.stdout


def test_cli_verify_names_the_member_of_a_truncated_shard_and_repeated_keys(tmp_path, sized_shards):
    shards = sized_shards([10, 4])
    write_index(shards, tmp_path / "i.json")
    data = Path(shards[0]).read_bytes()
    Path(shards[0]).write_bytes(data[: len(data) // 2])
    with tarfile.open(shards[1], "a") as tar:  # the key of the first sample comes back at the end
        info = tarfile.TarInfo("u1-0000.extra")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    checked = _cli("verify", str(tmp_path / "i.json"))
    assert checked.returncode == 1
    assert re.search(r"u-000.tar' cannot be read: .* member 'u0-\d{4}\.\w+', at byte \d+: truncated", checked.stdout)
    assert "key 'u1-0000' comes back at member 'u1-0000.extra'" in checked.stdout


def test_cli_index_continues_an_interrupted_run(tmp_path, sized_shards):
    shards = sized_shards([3, 4, 5])
    out = tmp_path / "i.json"
    first = build_index(shards[:2])
    with open(f"{out}.partial", "w") as partial:  # what an interrupted run leaves
        from wds_datapipes.cli import _scan_to_json

        partial.writelines(json.dumps(_scan_to_json(scan)) + "\n" for scan in first)
        partial.write('{"url": "cut')
    os.remove(shards[0])  # a shard the earlier run finished is not read again
    made = _cli("index", *shards, "-o", str(out), "--quiet")
    assert made.returncode == 0, made.stderr
    assert "continuing an interrupted run: 2 of 3" in made.stderr
    assert ShardIndex.load(str(out)).sizes.tolist() == [3, 4, 5]
    assert not os.path.exists(f"{out}.partial")


@pytest.mark.parametrize("command", ["index", "inspect", "verify"])
def test_cli_commands_explain_themselves(command):
    shown = _cli(command, "--help")
    assert shown.returncode == 0 and "usage: python -m wds_datapipes " + command in shown.stdout


def test_cli_reports_a_missing_shard_as_an_error(tmp_path):
    failed = _cli("index", str(tmp_path / "nothing-{0..1}.tar"), "-o", str(tmp_path / "i.json"))
    assert failed.returncode == 1 and "nothing-0.tar" in failed.stderr


def _cut_inside_a_member(shard: str, out: Path, member: int = 5) -> int:
    """Writes ``shard`` cut halfway through the bytes of its ``member``-th member; returns that
    member's header offset."""
    with tarfile.open(shard) as tar:
        info = tar.getmembers()[member]
    assert info.size >= 2
    out.write_bytes(Path(shard).read_bytes()[: info.offset_data + info.size // 2])
    return info.offset_data - 512


def test_cli_index_indexes_the_readable_shards_and_lists_every_bad_one(tmp_path, sized_shards):
    shards = sized_shards([6, 7, 8, 9])
    cut = tmp_path / "cut.tar"
    _cut_inside_a_member(shards[1], cut)
    missing = str(tmp_path / "missing.tar")
    out = tmp_path / "i.json"
    made = _cli("index", shards[0], str(cut), shards[2], missing, shards[3], "-o", str(out))
    assert made.returncode == 1
    assert "cut.tar" in made.stdout and "missing.tar" in made.stdout
    assert "2 of 5 shards could not be read and are not in" in made.stderr
    assert ShardIndex.load(str(out)).sizes.tolist() == [6, 8, 9]
    assert "%|" not in made.stderr  # no progress bar left over the errors
    shutil.copy(shards[1], cut)  # mended
    Path(missing).write_bytes(Path(shards[0]).read_bytes())
    again = _cli("index", shards[0], str(cut), shards[2], missing, shards[3], "-o", str(out))
    assert again.returncode == 0, again.stderr
    assert "continuing an interrupted run: 3 of 5" in again.stderr
    assert ShardIndex.load(str(out)).sizes.tolist() == [6, 7, 8, 6, 9]
    assert not os.path.exists(f"{out}.partial")


def test_a_cut_shard_is_reported_alike_by_the_index_scan_and_the_pipeline(tmp_path, sized_shards):
    cut = tmp_path / "cut.tar"
    header = _cut_inside_a_member(sized_shards([9])[0], cut)
    with pytest.raises(ShardFormatError) as scanned:
        scan_shard(str(cut))
    with pytest.raises(ShardFormatError) as read:
        list(ShardLister([str(cut)]).load_tar())
    assert (scanned.value.member, scanned.value.offset, scanned.value.reason) == \
        (read.value.member, read.value.offset, read.value.reason)
    assert scanned.value.offset == header and "truncated: member needs" in scanned.value.reason


def test_cli_says_what_is_wrong_with_a_missing_index_or_a_shard_given_as_one(tmp_path, sized_shards):
    for command in ("inspect", "verify"):
        missing = _cli(command, str(tmp_path / "nope.json"))
        assert missing.returncode == 1 and "cannot read the index" in missing.stderr and "shard" not in missing.stderr
    shard = sized_shards([3])[0]
    wrong = _cli("verify", shard)
    assert wrong.returncode == 1
    assert "is not an index: it is a tar archive" in wrong.stderr and "utf-8" not in wrong.stderr


class _CountedList(list):
    """A list that counts the passes made over it (a pass per shard is quadratic work)."""

    passes = 0

    def __iter__(self):
        _CountedList.passes += 1
        return super().__iter__()


def test_cli_index_resume_does_linear_work_in_the_shards_it_lists(tmp_path, monkeypatch):
    # 30,000 shards took 93 s to resume: a set of every URL made per finished shard, and the
    # plugin listers looked up (every installed package's metadata read) once per URL.
    from wds_datapipes import cli
    from wds_datapipes.cli import _scan_to_json
    from wds_datapipes.epochs.index import ShardScan

    n = 2000
    urls = [str(tmp_path / f"s-{i:05d}.tar") for i in range(n)]  # all finished: none is opened
    out = tmp_path / "i.json"
    with open(f"{out}.partial", "w") as partial:
        partial.writelines(json.dumps(_scan_to_json(ShardScan(u, 2, 2048, np.array([0, 1024])))) + "\n" for u in urls)
    from wds_datapipes.shards import openers

    lookups = []
    real_entry_points = openers.entry_points
    monkeypatch.setattr(openers, "entry_points", lambda **kw: lookups.append(kw) or real_entry_points(**kw))
    real_expand = cli.expand_urls
    monkeypatch.setattr(cli, "expand_urls", lambda specs, *more: _CountedList(real_expand(specs, *more)))
    _CountedList.passes = 0
    assert cli.main(["index", *urls, "-o", str(out), "--quiet"]) == 0
    assert ShardIndex.load(str(out)).sizes.tolist() == [2] * n
    assert lookups == []  # a built-in scheme: no entry point looked up (an unknown one: once, tests/storage)
    assert _CountedList.passes < 20  # a few passes over the URLs, not one per shard
