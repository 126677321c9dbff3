"""The shard planner counts the bytes the tar builder writes: names of any script and length, sizes across blocks."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wds_datapipes.tar.build import member_header
from wds_datapipes.tar.headers import BLOCK
from wds_datapipes.writing import write_shards
from wds_datapipes.writing.plan import member_cost, sample_cost
from wds_datapipes.writing.shard_file import check_fields

# characters of every width in UTF-8 (1 to 4 bytes), and a file name's undecodable bytes as
# os.listdir gives them (surrogateescape: one byte each in the name written)
_CHARS = st.sampled_from(["a", "Z", "0", "_", "-", " ", "é", "ж", "ключ"[0], "中", "文", "😀", "\udce9", "\udcff"])
_EDGES = [1, 50, 95, 99, 100, 101, 150, 155, 156, 250, 255, 256, 300, 480, 489, 490, 495, 500, 1000]
_SIZES = st.one_of(st.sampled_from([0, 1, 2, 511, 512, 513, 1023, 1024, 1025, 4095, 4096, 4097]),
                   st.integers(0, 6000))


@st.composite
def _key(draw) -> str:
    """A key whose member names land near the ustar and PAX edges: 100-byte names, 155-byte
    prefixes split at a '/', records that fill a PAX block (about 490 bytes)."""
    target = draw(st.sampled_from(_EDGES)) + draw(st.integers(-3, 3))
    ascii_only = draw(st.booleans())
    chars = st.sampled_from("abcXYZ019_-") if ascii_only else _CHARS
    parts, length = [], 0
    while length < max(target, 1):
        part = draw(st.text(chars, min_size=1, max_size=draw(st.sampled_from([8, 60, 99, 150]))))
        parts.append(part)
        length += len(part.encode("utf-8", "surrogateescape")) + 1
    return "/".join(parts)


@st.composite
def _samples(draw) -> list[dict]:
    keys = draw(st.lists(_key(), min_size=1, max_size=6, unique=True))
    samples = []
    for key in keys:
        suffixes = draw(st.lists(st.sampled_from(["jpg", "txt", "cls", "json.gz", "ключ", "d\udce9"]), min_size=1,
                                 max_size=3, unique=True))
        if check_fields(key, suffixes) is None:
            samples.append({"__key__": key, **{s: bytes(draw(_SIZES)) for s in suffixes}})
    return samples


def _planned(samples: list[dict]) -> int:
    return 2 * BLOCK + sum(sample_cost(s["__key__"], [(k, len(v)) for k, v in s.items() if not k.startswith("_")])
                           for s in samples)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(samples=_samples())
def test_the_planned_bytes_are_the_written_files_bytes(tmp_path_factory, samples):
    """oracle: the written shard's size on disk, and tarfile (surrogateescape) reading back every
    name and size; GNU tar lists the same name bytes."""
    folder = tmp_path_factory.mktemp("sizes")
    report = write_shards(samples, str(folder / "s-%02d.tar"), fsync=False)
    assert report.written == len(samples) and report.shards == (1 if samples else 0)
    if not samples:
        return
    shard = folder / "s-00.tar"
    assert os.path.getsize(shard) == _planned(samples)
    want = [(f"{s['__key__']}.{k}", len(v)) for s in samples for k, v in s.items() if not k.startswith("_")]
    with tarfile.open(shard, encoding="utf-8", errors="surrogateescape") as tar:
        assert [(m.name, m.size) for m in tar.getmembers()] == want
    if shutil.which("tar"):
        listed = subprocess.run(["tar", "--quoting-style=literal", "-tf", str(shard)], capture_output=True,
                                check=True).stdout
        assert listed.split(b"\n")[:-1] == [name.encode("utf-8", "surrogateescape") for name, _ in want]


@settings(max_examples=60, deadline=None)
@given(name=_key(), size=_SIZES)
def test_a_members_cost_is_its_header_and_padded_data(name, size):
    """oracle: the length of the header the builder makes, plus the data rounded up to a block."""
    assert member_cost(name, size) == len(member_header(name, size)) + -(-size // BLOCK) * BLOCK


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(samples=_samples(), maxsize=st.integers(2 * BLOCK, 12 * BLOCK))
def test_no_shard_passes_maxsize_but_a_sample_alone(tmp_path_factory, samples, maxsize):
    """oracle: each shard's size on disk, its samples counted by tarfile; and the plan is tight:
    a shard and the next one's first sample together pass maxsize (sizes from the files written)."""
    folder = tmp_path_factory.mktemp("maxsize")
    report = write_shards(samples, str(folder / "s-%03d.tar"), maxsize=maxsize, fsync=False)
    shards = sorted(folder.glob("s-*.tar"))
    assert report.written == len(samples) and len(shards) == report.shards
    owner = {f"{s['__key__']}.{k}": s["__key__"] for s in samples for k in s if not k.startswith("_")}
    firsts = []
    for shard in shards:
        with tarfile.open(shard, encoding="utf-8", errors="surrogateescape") as tar:
            held = list(dict.fromkeys(owner[m.name] for m in tar.getmembers()))
        assert os.path.getsize(shard) <= maxsize or len(held) == 1, (shard, os.path.getsize(shard), held)
        firsts.append(held[0])
    by_key = {s["__key__"]: s for s in samples}
    for shard, first_next in zip(shards, firsts[1:]):
        assert os.path.getsize(shard) + _planned([by_key[first_next]]) - 2 * BLOCK > maxsize


def test_non_ascii_keys_keep_shards_under_maxsize(tmp_path):
    """The issue's case: keys like ключ0001 (a 3-block PAX header each); oracle: the sizes on disk."""
    samples = [{"__key__": f"ключ{i:04d}", "bin": bytes(3000)} for i in range(60)]
    report = write_shards(samples, str(tmp_path / "s-%02d.tar"), maxsize=20000, fsync=False)
    sizes = [os.path.getsize(p) for p in sorted(tmp_path.glob("s-*.tar"))]
    assert report.written == 60 and max(sizes) <= 20000
    assert sizes[0] == 2 * BLOCK + 4 * (3 * BLOCK + 3072)  # PAX block, its records, the ustar block; 3000 -> 3072


@pytest.mark.parametrize("key", ["bad\0key", "lone\ud800surrogate"])
def test_a_name_no_tar_holds_is_a_bad_input_before_anything_is_written(tmp_path, key):
    """A NUL or a lone surrogate that stands for no byte is refused by the plan (a listed skip),
    never a crash half-way; oracle: the one good sample read back by tarfile."""
    from wds_datapipes.handlers import ignore_and_continue

    report = write_shards([{"__key__": "good", "txt": "a"}, {"__key__": key, "txt": "b"}],
                          str(tmp_path / "s-%02d.tar"), handler=ignore_and_continue, fsync=False)
    assert report.written == 1 and len(report.skipped) == 1
    with tarfile.open(tmp_path / "s-00.tar") as tar:
        assert tar.getnames() == ["good.txt"]
