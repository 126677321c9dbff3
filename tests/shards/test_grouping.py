"""Grouping tar members into samples: webdataset's key rule, shard boundaries, and errors."""

from __future__ import annotations

import io
import pickle
import tarfile
import tempfile
import warnings
from pathlib import Path

import pytest
import webdataset as wds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import IterableWrapper
from webdataset.tariterators import base_plus_ext, tar_file_iterator

from wds_datapipes import SampleError, ShardLister, TarLoader, WebDatasetGrouper, split_key, warn_and_continue


def _write(path: Path, members: list[tuple[str, bytes]]) -> str:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


def _fused(urls: list[str], **options) -> list[dict]:
    """group_by_key straight over load_tar (the path that reads shard_members)."""
    return list(ShardLister(urls).load_tar().group_by_key(**options))


def _generic(urls: list[str], **options) -> list[dict]:
    """group_by_key over any source of (url, name, bytes) tuples."""
    return list(IterableWrapper(list(ShardLister(urls).load_tar())).group_by_key(**options))


PATHS = [pytest.param(_fused, id="fused"), pytest.param(_generic, id="generic")]


def _webdataset_split(name: str) -> tuple[str, str] | None:
    """(key, lowercased suffix) of a member as webdataset 1.0.2 makes it, or None when skipped.

    Runs webdataset's own tar_file_iterator (which applies its metadata skip rules) on a
    one-member tar, then its base_plus_ext.
    """
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(tarfile.TarInfo(name), io.BytesIO(b""))
    stream.seek(0)
    kept = [entry["fname"] for entry in tar_file_iterator(stream)]
    if not kept:
        return None
    assert kept == [name]
    key, suffix = base_plus_ext(name)
    return None if key is None else (key, suffix.lower())


# ---------------------------------------------------------------- the key rule

_SEGMENT = st.one_of(
    st.text(alphabet="aB.x_-Jé", min_size=1, max_size=8),
    st.sampled_from([".", "..", "__meta__", "__x__.json", ".hidden", "a.b.c", "IMG.JPG", "x.tar.gz", "_"]),
)
_NAMES = st.builds(
    lambda lead, parts: lead + "/".join(parts),
    st.sampled_from(["", "./", "/", "__", "__m__/"]),
    st.lists(_SEGMENT, min_size=1, max_size=4),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=_NAMES)
def test_split_key_follows_webdataset_key_and_skip_rules(name):
    assert split_key(name) == _webdataset_split(name)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a/b.c.d.JPG", ("a/b", "c.d.jpg")),
        ("a.b/c.jpg", ("a.b/c", "jpg")),
        ("./a.JPG", ("./a", "jpg")),
        ("a/.x", ("a/", "x")),
        ("Key.TXT", ("Key", "txt")),
        ("noext", None),
        ("dir.d/noext", None),
        ("__meta__", None),
        ("__meta__/x.json", None),
        ("__meta__.json", ("__meta__", "json")),
        ("x/__meta__.json", ("x/__meta__", "json")),
    ],
)
def test_split_key_examples_agree_with_webdataset(name, expected):
    assert split_key(name) == expected == _webdataset_split(name)


def test_split_key_agrees_with_webdataset_on_a_newline_in_a_name():
    name = "p.q\nr/a.b"
    assert split_key(name) == _webdataset_split(name)


# ---------------------------------------------------------------- grouping against webdataset


_MEMBER_NAMES = st.lists(
    st.sampled_from(["a.jpg", "a.TXT", "a.cls", "b.jpg", "b.x.y", "d.e/a.jpg", "__meta__", "noext", "./a.jpg"]),
    max_size=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shards=st.lists(_MEMBER_NAMES, min_size=1, max_size=3))
def test_group_by_key_matches_webdataset_on_random_member_sequences(shards):
    with tempfile.TemporaryDirectory() as tmp:
        urls = [
            _write(Path(tmp, f"s{i}.tar"), [(name, f"{i}:{j}".encode()) for j, name in enumerate(names)])
            for i, names in enumerate(shards)
        ]
        try:
            expected = [
                {k: v for k, v in s.items() if k != "__local_path__"}
                for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)
            ]
        except ValueError as exn:  # webdataset: "duplicate file name"
            assert "duplicate" in str(exn)
            for path in (_fused, _generic):
                with pytest.raises(SampleError, match="repeats"):
                    path(urls)
            return
        assert _fused(urls) == expected
        assert _generic(urls) == expected


# ---------------------------------------------------------------- shard boundaries and split keys


@pytest.mark.parametrize("group", PATHS)
def test_group_by_key_never_spans_shards(tmp_path, group):
    first = _write(tmp_path / "1.tar", [("x.jpg", b"1"), ("k.jpg", b"2")])
    second = _write(tmp_path / "2.tar", [("k.cls", b"3"), ("y.jpg", b"4")])
    samples = group([first, second])
    assert [(s["__key__"], s["__url__"]) for s in samples] == [
        ("x", first), ("k", first), ("k", second), ("y", second),
    ]
    assert samples[1] == {"__key__": "k", "__url__": first, "jpg": b"2"}
    assert samples[2] == {"__key__": "k", "__url__": second, "cls": b"3"}


@pytest.mark.parametrize("group", PATHS)
def test_group_by_key_lowercases_suffixes_and_keeps_key_case(tmp_path, group):
    url = _write(tmp_path / "s.tar", [("Dir.V2/Img.JPG", b"j"), ("Dir.V2/Img.Seg.PNG", b"p")])
    assert group([url]) == [{"__key__": "Dir.V2/Img", "__url__": url, "jpg": b"j", "seg.png": b"p"}]


@pytest.mark.parametrize("group", PATHS)
def test_group_by_key_compares_with_the_previous_member_only(tmp_path, group):
    url = _write(tmp_path / "s.tar", [("a.jpg", b"1"), ("b.jpg", b"2"), ("a.txt", b"3")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # report_split_keys is off by default
        samples = group([url])
    assert [(s["__key__"], sorted(s)) for s in samples] == [
        ("a", ["__key__", "__url__", "jpg"]),
        ("b", ["__key__", "__url__", "jpg"]),
        ("a", ["__key__", "__url__", "txt"]),
    ]


@pytest.mark.parametrize("group", PATHS)
def test_report_split_keys_warns_when_a_key_comes_back_in_the_same_shard(tmp_path, group):
    url = _write(tmp_path / "s.tar", [("a.jpg", b"1"), ("b.jpg", b"2"), ("a.txt", b"3")])
    with pytest.warns(UserWarning, match=r"key 'a' comes back at member 'a.txt'") as caught:
        samples = group([url], report_split_keys=True)
    assert len(samples) == 3
    # ours only: a ResourceWarning of another test's file, collected meanwhile, may be caught too
    ours = [w for w in caught if issubclass(w.category, UserWarning) and "comes back" in str(w.message)]
    assert len(ours) == 1 and url in str(ours[0].message)


@pytest.mark.parametrize("group", PATHS)
def test_report_split_keys_is_silent_for_a_key_repeated_across_shards(tmp_path, group):
    first = _write(tmp_path / "1.tar", [("a.jpg", b"1"), ("b.jpg", b"2")])
    second = _write(tmp_path / "2.tar", [("b.txt", b"3"), ("a.txt", b"4")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(group([first, second], report_split_keys=True)) == 4


# ---------------------------------------------------------------- repeated suffixes


@pytest.mark.parametrize("group", PATHS)
def test_repeated_suffix_raises_sample_error_naming_url_key_and_member(tmp_path, group):
    url = _write(tmp_path / "s.tar", [("ok.jpg", b"0"), ("d/k.jpg", b"1"), ("d/k.cls", b"2"), ("d/k.JPG", b"3")])
    with pytest.raises(SampleError) as caught:
        group([url])
    error = caught.value
    assert (error.url, error.key, error.member) == (url, "d/k", "d/k.JPG")
    for part in (url, "d/k", "d/k.JPG", "jpg"):
        assert part in str(error)


@pytest.mark.parametrize("group", PATHS)
def test_repeated_suffix_with_warn_and_continue_skips_the_whole_sample(tmp_path, group):
    url = _write(
        tmp_path / "s.tar",
        [("a.jpg", b"1"), ("k.jpg", b"2"), ("k.jpg", b"3"), ("k.cls", b"4"), ("k.jpg", b"5"), ("z.jpg", b"6")],
    )
    with pytest.warns(UserWarning, match="skipped: .*'k'.*repeats") as caught:
        samples = group([url], handler=warn_and_continue)
    assert [(s["__key__"], s["jpg"]) for s in samples] == [("a", b"1"), ("z", b"6")]
    assert len([w for w in caught if "repeats" in str(w.message)]) == 1  # one warning per bad sample


# ---------------------------------------------------------------- the two source paths


def test_group_by_key_reads_a_tar_loader_through_shard_members(tmp_path, make_shards, monkeypatch):
    shards = make_shards(3, 4)
    calls = []
    original = TarLoader.shard_members

    def spy(self):
        calls.append(self)
        return original(self)

    monkeypatch.setattr(TarLoader, "shard_members", spy)
    samples = _fused(shards)
    assert len(calls) == 1
    assert len(samples) == 12


class _Forwarding(IterDataPipe):
    """A pipe between load_tar and group_by_key that offers the shard_members capability."""

    def __init__(self, source_datapipe):
        self.source_datapipe = source_datapipe

    def __iter__(self):
        yield from self.source_datapipe

    def shard_members(self):
        return self.source_datapipe.shard_members()


def test_group_by_key_takes_the_fast_path_from_any_source_offering_shard_members(make_shards, monkeypatch):
    shards = make_shards(2, 3)
    calls = []
    original = TarLoader.shard_members
    monkeypatch.setattr(TarLoader, "shard_members", lambda self: calls.append(self) or original(self))
    samples = list(_Forwarding(ShardLister(shards).load_tar()).group_by_key())
    assert len(calls) == 1
    assert samples == _generic(shards)


def test_group_by_key_over_plain_string_tuples_takes_a_run_of_one_url_as_a_shard():
    members = [("a.tar", "x.txt", b"1"), ("a.tar", "x.cls", b"2"), ("b.tar", "x.txt", b"3")]
    assert list(IterableWrapper(members).group_by_key()) == [
        {"__key__": "x", "__url__": "a.tar", "txt": b"1", "cls": b"2"},
        {"__key__": "x", "__url__": "b.tar", "txt": b"3"},
    ]


def test_group_by_key_gives_the_same_samples_from_tar_loader_and_from_tuples(tmp_path, make_shards):
    shards = make_shards(3, 5) + make_shards(1, 3, prefix="g", gz=True)
    fused, generic = _fused(shards), _generic(shards)
    assert fused == generic
    assert [s["__key__"] for s in fused] == [f"s-{i:03d}-{j:03d}" for i in range(3) for j in range(5)] + [
        f"g-000-{j:03d}" for j in range(3)
    ]
    assert all(set(s) == {"__key__", "__url__", "cls", "txt"} for s in fused)


def test_group_by_key_paths_agree_when_a_shard_is_listed_twice_in_a_row(tmp_path):
    url = _write(tmp_path / "s.tar", [("a.jpg", b"1")])
    expected = [{"__key__": "a", "__url__": url, "jpg": b"1"}] * 2
    assert [{k: v for k, v in s.items() if k != "__local_path__"}
            for s in wds.WebDataset([url, url], shardshuffle=False)] == expected
    assert _fused([url, url]) == expected
    assert _generic([url, url]) == expected


def test_group_by_key_yields_nothing_for_a_shard_without_samples(tmp_path):
    empty = _write(tmp_path / "e.tar", [("__meta__", b"m"), ("noext", b"x")])
    full = _write(tmp_path / "f.tar", [("a.txt", b"1")])
    assert _fused([empty, full]) == _generic([empty, full]) == [{"__key__": "a", "__url__": full, "txt": b"1"}]


def test_grouper_pickles(tmp_path):
    url = _write(tmp_path / "s.tar", [("a.txt", b"1"), ("a.cls", b"2")])
    dp = ShardLister([url]).load_tar().group_by_key(handler=warn_and_continue, report_split_keys=True)
    clone = pickle.loads(pickle.dumps(dp))
    assert isinstance(clone, WebDatasetGrouper)
    assert list(clone) == list(dp) == [{"__key__": "a", "__url__": url, "txt": b"1", "cls": b"2"}]

