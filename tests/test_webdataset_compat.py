"""Samples equal webdataset 1.0.2's on the same shards: keys, fields, bytes and order."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import numpy as np
import PIL.Image
import pytest
import torch
import webdataset as wds

from wds_datapipes import ShardLister


def _reference(urls, decode: str | None = None) -> list[dict]:
    """webdataset's samples, without the ``__local_path__`` it adds for local files."""
    dataset = wds.WebDataset(urls, shardshuffle=False)
    if decode is not None:
        dataset = dataset.decode(decode)
    return [{k: v for k, v in sample.items() if k != "__local_path__"} for sample in dataset]


def _ours(urls, decode: str | None = None) -> list[dict]:
    dp = ShardLister(urls).load_tar().group_by_key()
    if decode is not None:
        dp = dp.decode(decode)
    return list(dp)


def _as_items(samples: list[dict]) -> list[list[tuple]]:
    """Each sample's (field, value) pairs in insertion order: compares field order too."""
    return [list(sample.items()) for sample in samples]


def _tricky_tar(path: Path, members: list, gz: bool = False) -> str:
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
                continue
            name, data = member
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    data = stream.getvalue()
    path.write_bytes(gzip.compress(data) if gz else data)
    return str(path)


def _entry(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


@pytest.fixture
def tricky_shards(tmp_path) -> list[str]:
    long_dir = "deep.dir." + "d" * 95
    first = _tricky_tar(
        tmp_path / "tricky-0.tar",
        [
            _entry("imgs.v2", tarfile.DIRTYPE),
            ("imgs.v2/cat.0001.JPG", b"jpeg bytes 1"),
            ("imgs.v2/cat.0001.cls", b"3"),
            ("imgs.v2/cat.0001.Seg.PNG", b"png bytes"),
            ("__meta__", b"skipped metadata"),
            ("__meta__/index.json", b"skipped too"),
            ("__meta__.json", b"a sample keyed __meta__ in webdataset"),
            ("x" * 120 + ".txt", b"long name"),
            (f"{long_dir}/{'y' * 110}.Tar.GZ", b"multi-dot upper suffix, long dir"),
            (f"{long_dir}/{'y' * 110}.json", b"{}"),
            _entry("link.txt", tarfile.SYMTYPE, "imgs.v2/cat.0001.cls"),
            ("./rel.IMG.jpeg", b"leading ./"),
            ("a/.hidden", b"hidden file"),
            ("README", b"no dot: skipped"),
            _entry("olddir/", tarfile.AREGTYPE),
            ("shared.jpg", b"end of shard 0"),
        ],
    )
    second = _tricky_tar(
        tmp_path / "tricky-1.tar.gz",
        [
            ("shared.cls", b"start of shard 1: a new sample"),
            _entry("dir.with.dots", tarfile.DIRTYPE),
            ("dir.with.dots/ünï.cödé.TXT", b"non-ascii"),
            ("dir.with.dots/b.jpg", b"b1"),
            ("other.jpg", b"o"),
            ("dir.with.dots/b.txt", b"b2: not next to b.jpg, so its own sample"),
        ],
        gz=True,
    )
    return [first, second]


def test_tricky_members_group_as_webdataset_groups_them(tricky_shards):
    expected = _reference(tricky_shards)
    assert len(expected) >= 10  # the reference really read both shards
    assert _as_items(_ours(tricky_shards)) == _as_items(expected)


def test_tricky_members_keys_are_the_ones_webdataset_documents(tricky_shards):
    keys = [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in _ours(tricky_shards)]
    assert ("imgs.v2/cat", ["0001.cls", "0001.jpg", "0001.seg.png"]) in keys
    assert ("__meta__", ["json"]) in keys
    assert ("./rel", ["img.jpeg"]) in keys
    assert ("a/", ["hidden"]) in keys
    assert [k for k, _ in keys].count("shared") == 2


def test_tricky_members_match_webdataset_through_a_brace_spec(tricky_shards, tmp_path):
    plain = tmp_path / "tricky-1.tar"
    plain.write_bytes(gzip.decompress(Path(tricky_shards[1]).read_bytes()))
    spec = f"{tmp_path}/tricky-{{0..1}}.tar"
    assert _as_items(_ours(spec)) == _as_items(_reference(spec))


def _shard_writer_shards(tmp_path: Path, count: int = 23, maxcount: int = 7) -> str:
    rng = np.random.default_rng(0)
    pattern = str(tmp_path / "w-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=maxcount, verbose=0) as sink:
        for i in range(count):
            sink.write({
                "__key__": f"sample{i:05d}",
                "cls": i % 5,
                "txt": f"caption {i}",
                "json": {"index": i, "tags": ["a", "b"][: i % 3]},
                "npy": rng.standard_normal((2, i % 4 + 1)).astype(np.float32),
                "bin": bytes(rng.integers(0, 256, i * 37, dtype=np.uint8)),
            })
    return str(tmp_path / "w-{000000..000003}.tar")


def test_shard_writer_shards_give_webdataset_samples(tmp_path):
    spec = _shard_writer_shards(tmp_path)
    expected = _reference(spec)
    assert len(expected) == 23
    assert _as_items(_ours(spec)) == _as_items(expected)


def _jpeg(seed: int, width: int = 40, height: int = 24) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    PIL.Image.fromarray(pixels).save(out, "JPEG", quality=85)
    return out.getvalue()


@pytest.mark.parametrize("spec", ["torchrgb8", "rgb8", "torch"])
def test_decoded_jpeg_and_cls_equal_webdatasets_decode(tmp_path, spec):
    urls = []
    for shard in range(2):
        urls.append(str(tmp_path / f"img-{shard}.tar"))
        with wds.TarWriter(urls[-1]) as sink:
            for i in range(5):
                sink.write({"__key__": f"{shard}-{i}", "jpg": _jpeg(10 * shard + i), "cls": str(i).encode()})
    expected, ours = _reference(urls, spec), _ours(urls, spec)
    assert len(ours) == len(expected) == 10
    for mine, theirs in zip(ours, expected):
        assert mine.keys() == theirs.keys()
        assert (mine["__key__"], mine["__url__"], mine["cls"]) == (theirs["__key__"], theirs["__url__"], theirs["cls"])
        assert type(mine["jpg"]) is type(theirs["jpg"])
        if isinstance(theirs["jpg"], torch.Tensor):
            assert mine["jpg"].dtype == theirs["jpg"].dtype
            assert torch.equal(mine["jpg"], theirs["jpg"])
        else:
            assert mine["jpg"].dtype == theirs["jpg"].dtype
            np.testing.assert_array_equal(mine["jpg"], theirs["jpg"])
