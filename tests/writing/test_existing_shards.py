"""Existing shards in: concatenate, filter by field, select fields, and a seeded whole-dataset shuffle (a local dSort)."""

from __future__ import annotations

import itertools
import tarfile
from collections import Counter

from tests.writing.conftest import make_samples
from wds_datapipes.cli import main
from wds_datapipes.writing import write_shards
from wds_datapipes.writing.reshuffle import bucket_numbers, bucket_order, shuffled
from wds_datapipes.writing.sources import shard_samples

COMMON = ["--quiet", "--no-fsync"]


def _samples_by_tarfile(folder, pattern="*.tar") -> list[tuple[str, dict[str, bytes]]]:
    """(key, {suffix: bytes}) of each sample, in shard and member order, read with tarfile."""
    out: list[tuple[str, dict[str, bytes]]] = []
    for path in sorted(folder.glob(pattern)):
        with tarfile.open(path) as tar:
            for member in tar:
                key, _, suffix = member.name.partition(".")
                if not out or out[-1][0] != key:
                    out.append((key, {}))
                out[-1][1][suffix] = tar.extractfile(member).read()
    return out


def _dataset(folder, n, seed, prefix):
    samples = make_samples(n, seed=seed)
    for s in samples:
        s["__key__"] = prefix + s["__key__"]
    write_shards(samples, str(folder / "s-%03d.tar"), maxcount=7, fsync=False)


def test_two_datasets_are_concatenated_in_order(tmp_path):
    """oracle: each dataset's samples read with tarfile, one after the other."""
    _dataset(tmp_path / "a", 15, 1, "a")
    _dataset(tmp_path / "b", 9, 2, "b")
    assert main(["create", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "c/c-%02d.tar"),
                 "--maxcount", "10", *COMMON]) == 0
    want = _samples_by_tarfile(tmp_path / "a") + _samples_by_tarfile(tmp_path / "b")
    assert _samples_by_tarfile(tmp_path / "c") == want and len(want) == 24


def test_filter_by_field_value_and_presence_and_select_fields(tmp_path):
    """oracle: the rule applied by hand to the tarfile read of the input."""
    _dataset(tmp_path / "a", 30, 3, "")
    assert main(["create", str(tmp_path / "a"), "-o", str(tmp_path / "f/f-%02d.tar"), "--where", "cls=3",
                 "--where", "bin", "--select", "bin,cls", *COMMON]) == 0
    want = [(k, {f: v for f, v in s.items() if f in ("bin", "cls")})
            for k, s in _samples_by_tarfile(tmp_path / "a") if s.get("cls") == b"3" and "bin" in s]
    assert _samples_by_tarfile(tmp_path / "f") == want and want
    assert main(["create", str(tmp_path / "a"), "-o", str(tmp_path / "g/g-%02d.tar"), "--where", "cls!=3",
                 *COMMON]) == 0
    assert [k for k, _ in _samples_by_tarfile(tmp_path / "g")] == [
        k for k, s in _samples_by_tarfile(tmp_path / "a") if s.get("cls") != b"3"]


def test_a_seeded_shuffle_of_the_whole_dataset_keeps_every_sample_and_is_reproducible(tmp_path):
    """oracles: the input read with tarfile (same samples, as a multiset, each whole); a second
    run with the same seed (same bytes); another seed (another order)."""
    _dataset(tmp_path / "a", 60, 4, "")
    for name, seed in (("x", 5), ("y", 5), ("z", 6)):
        assert main(["create", str(tmp_path / "a"), "-o", str(tmp_path / f"{name}/s-%02d.tar"), "--maxcount", "25",
                     "--shuffle-seed", str(seed), "--shuffle-memory", "40k", *COMMON]) == 0
    source = _samples_by_tarfile(tmp_path / "a")
    x, z = _samples_by_tarfile(tmp_path / "x"), _samples_by_tarfile(tmp_path / "z")
    key = lambda kv: kv[0]
    assert sorted(x, key=key) == sorted(source, key=key) == sorted(z, key=key)
    assert [k for k, _ in x] != [k for k, _ in source] and [k for k, _ in x] != [k for k, _ in z]
    assert ({p.name: p.read_bytes() for p in (tmp_path / "x").glob("*.tar")} ==
            {p.name: p.read_bytes() for p in (tmp_path / "y").glob("*.tar")})
    assert not list((tmp_path / "x").glob(".wds-shuffle-*"))  # its buckets are removed


def test_the_shuffle_uses_several_buckets_and_its_sources_name_the_input_shards(tmp_path):
    """oracle: the input's (shard, key) pairs; the rule that at most one bucket is held at a time."""
    _dataset(tmp_path / "a", 40, 5, "")
    out = list(shuffled(shard_samples([str(tmp_path / "a")]), seed=1, buckets=4, workdir=str(tmp_path)))
    assert sorted(s["__source__"] for s in out) == sorted(s["__source__"] for s in shard_samples([str(tmp_path / "a")]))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".wds-shuffle-")]


def test_the_two_pass_shuffle_gives_every_order_equally_often():
    """oracle: a chi-square test against the uniform distribution over the 120 orders of 5 items,
    the order built from the pure bucket functions as the shuffle builds it (fixed seeds: not flaky)."""
    counts: Counter = Counter()
    runs = 6000
    for seed in range(runs):
        buckets = [[] for _ in range(3)]
        for item, bucket in zip(range(5), bucket_numbers(seed, 3)):
            buckets[bucket].append(item)
        order = tuple(itertools.chain.from_iterable(
            [held[at] for at in bucket_order(seed, b, len(held))] for b, held in enumerate(buckets)))
        counts[order] += 1
    assert len(counts) == 120
    expected = runs / 120
    chi2 = sum((counts[p] - expected) ** 2 / expected for p in itertools.permutations(range(5)))
    assert chi2 < 180, chi2  # 119 degrees of freedom: p < 0.0003 above 180
