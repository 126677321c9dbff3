"""Compressed shards: chosen by the pattern's suffix or an option, deterministic, indexed, recompressed."""

from __future__ import annotations

import bz2
import gzip
import lzma
import tarfile

import pytest

from tests.writing.conftest import make_samples
from wds_datapipes import ShardLister
from wds_datapipes.cli import main
from wds_datapipes.epochs.exact_epochs import ExactEpochs
from wds_datapipes.epochs.index import ShardIndex
from wds_datapipes.writing import write_shards
from wds_datapipes.writing.compress import compression_of

zstandard = pytest.importorskip("zstandard")

DECOMPRESS = {"gz": gzip.decompress, "bz2": bz2.decompress, "xz": lzma.decompress,
              "zst": lambda data: zstandard.ZstdDecompressor().stream_reader(data).read()}


def _tar_members(path) -> list[tuple[str, bytes]]:
    with tarfile.open(path, "r:*") as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar]


@pytest.mark.parametrize("suffix", ["gz", "bz2", "xz", "zst"])
def test_a_compressed_pattern_writes_the_plain_tar_compressed_and_an_index_without_offsets(tmp_path, suffix):
    """oracles: the plain-tar run of the same input (its bytes equal the compressed shards
    decompressed by the stdlib or zstandard), tarfile, verify and ExactEpochs."""
    samples = make_samples(40, seed=4)
    write_shards(samples, str(tmp_path / "plain/s-%02d.tar"), maxcount=12, fsync=False)
    write_shards(samples, str(tmp_path / f"z/s-%02d.tar.{suffix}"), maxcount=12, fsync=False)
    plain = sorted((tmp_path / "plain").glob("*.tar"))
    packed = sorted((tmp_path / "z").glob(f"*.tar.{suffix}"))
    assert len(plain) == len(packed) == 4
    for a, b in zip(plain, packed):
        assert DECOMPRESS[suffix](b.read_bytes()) == a.read_bytes()
        if suffix != "zst":
            assert _tar_members(b) == _tar_members(a)
    index = ShardIndex.load(str(tmp_path / "z/index.json"))
    assert list(index.sizes) == [12, 12, 12, 4] and index.places is None or not index.places.has(0)
    assert all(o == -1 for o in index.offsets_array()) if index.offsets_array() is not None else True
    assert main(["verify", str(tmp_path / "z/index.json")]) == 0
    if suffix != "zst":  # webdataset 1.0.2 decompresses by the name's suffix: gz, bz2, xz
        import webdataset as wds

        theirs = [{k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"}
                  for s in wds.WebDataset([str(p) for p in packed], shardshuffle=False)]
        ours = [{k: v for k, v in s.items() if k != "__url__"}
                for s in ShardLister([str(p) for p in packed]).load_tar().group_by_key()]
        assert theirs == ours and len(ours) == 40
    keys = sorted(s["__key__"] for s in ExactEpochs(str(tmp_path / "z/index.json"), batch_size=1, shuffle=True))
    assert keys == [s["__key__"] for s in samples]


def test_gzip_shards_are_byte_identical_across_runs_and_workers_with_mtime_zero(tmp_path):
    """oracle: RFC 1952's header layout (MTIME at bytes 4-7, no FNAME flag) and a second run's bytes."""
    samples = make_samples(30, seed=1)
    write_shards(samples, str(tmp_path / "a/s-%02d.tgz"), maxcount=7, fsync=False)
    write_shards(samples, str(tmp_path / "b/s-%02d.tgz"), maxcount=7, workers=2, fsync=False)
    a = {p.name: p.read_bytes() for p in (tmp_path / "a").glob("*.tgz")}
    b = {p.name: p.read_bytes() for p in (tmp_path / "b").glob("*.tgz")}
    assert a == b and len(a) == 5
    for data in a.values():
        assert data[:2] == b"\x1f\x8b" and data[4:8] == bytes(4) and not data[3] & 0x08


def test_the_compression_option_overrides_the_suffix_and_unknown_ones_are_refused(tmp_path):
    """oracle: the magic bytes of each format; the documented choices."""
    write_shards(make_samples(5), str(tmp_path / "s-%02d.tar"), compression="xz", fsync=False)
    assert (tmp_path / "s-00.tar").read_bytes()[:6] == b"\xfd7zXZ\x00"
    with pytest.raises(ValueError, match="unknown compression 'lz4'"):
        write_shards(make_samples(5), str(tmp_path / "t-%02d.tar"), compression="lz4")
    assert [compression_of(n) for n in ("a.tar.gz", "a.TGZ", "a.tar.bz2", "a.tar.xz", "a.tar.zst", "a.tar")] == \
        ["gzip", "gzip", "bzip2", "xz", "zstd", None]


def test_reshard_with_recompress_turns_gzip_shards_into_zstd_and_back_to_plain(tmp_path):
    """oracle: the first run's members read by tarfile, equal through gz -> zst -> plain tars."""
    samples = make_samples(25, seed=2)
    write_shards(samples, str(tmp_path / "gz/s-%02d.tar.gz"), maxcount=10, fsync=False)
    common = ["--quiet", "--no-fsync"]
    assert main(["create", str(tmp_path / "gz"), "-o", str(tmp_path / "zst/r-%02d.tar.zst"),
                 "--maxcount", "6", *common]) == 0
    assert main(["create", str(tmp_path / "zst"), "-o", str(tmp_path / "plain/p-%02d.tar"),
                 "--maxcount", "25", *common]) == 0
    assert main(["create", str(tmp_path / "plain"), "-o", str(tmp_path / "bz/q-%02d.tar"), "--compress", "bzip2",
                 "--maxcount", "25", *common]) == 0
    first = [m for p in sorted((tmp_path / "gz").glob("*.gz")) for m in _tar_members(p)]
    assert len(list((tmp_path / "zst").glob("*.tar.zst"))) == 5
    assert _tar_members(tmp_path / "plain/p-00.tar") == first
    assert _tar_members(tmp_path / "bz/q-00.tar") == first
    assert (tmp_path / "bz/q-00.tar").read_bytes()[:3] == b"BZh"


def test_a_killed_compression_leaves_no_shard_under_its_final_name(tmp_path, monkeypatch):
    """oracle: the rule that only a whole shard is renamed to its name (compression failing half-way)."""
    from wds_datapipes.writing import shard_file

    def broken(source, target, kind, fsync=True):
        with open(target, "wb") as out:
            out.write(b"\x1f\x8b half")
        raise OSError("disk full")

    monkeypatch.setattr(shard_file, "compress_file", broken)
    with pytest.raises(Exception, match="disk full"):
        write_shards(make_samples(5), str(tmp_path / "s-%02d.tar.gz"), fsync=False)
    assert sorted(p.name for p in tmp_path.iterdir() if "s-00" in p.name) == []
