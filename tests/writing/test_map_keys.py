"""Keys that a ``map`` function gives are checked like the input's: never a shard that holds one key twice."""

from __future__ import annotations

import tarfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wds_datapipes.errors import ShardWriteError
from wds_datapipes.handlers import ignore_and_continue
from wds_datapipes.writing import write_shards


def strip_version(sample: dict) -> dict:
    """img1_v1 and img1_v2 both become img1 (the issue's map)."""
    return {**sample, "__key__": sample["__key__"].split("_")[0]}


def renamed(sample: dict) -> dict:
    """The key that the sample's ``to`` field names."""
    return {"__key__": sample["to"].decode(), "txt": sample["txt"]}


def _keys(folder) -> list[str]:
    """oracle: tarfile's member names, split at the first dot, over every shard in order."""
    keys: list[str] = []
    for path in sorted(folder.glob("*.tar")):
        with tarfile.open(path) as tar:
            for name in tar.getnames():
                key = name.partition(".")[0]
                if not keys or keys[-1] != key:
                    keys.append(key)
    return keys


def _input(keys) -> list[dict]:
    return [{"__key__": k, "__source__": f"in/{k}.txt", "txt": f"text of {k}"} for k in keys]


def test_a_repeat_in_one_shard_stops_the_run_naming_both_inputs(tmp_path):
    with pytest.raises(ShardWriteError) as caught:
        write_shards(_input(["img1_v1", "img1_v2", "img2_v1"]), str(tmp_path / "s-%02d.tar"), map=strip_version,
                     fsync=False)
    assert "'img1'" in str(caught.value) and "in/img1_v1.txt" in str(caught.value)
    assert caught.value.source == "in/img1_v2.txt"
    assert not list(tmp_path.glob("*.tar")) and not list(tmp_path.glob("*.part"))


def test_a_repeat_in_one_shard_is_skipped_and_listed_with_a_skipping_handler(tmp_path):
    """oracle: webdataset 1.0.2 reads the shard (it refuses a name seen twice in a row), and tarfile."""
    import webdataset as wds

    report = write_shards(_input(["img1_v1", "img1_v2", "img2_v1"]), str(tmp_path / "s-%02d.tar"),
                          map=strip_version, handler=ignore_and_continue, fsync=False)
    assert (report.read, report.written) == (3, 2)
    assert [source for source, _ in report.skipped] == ["in/img1_v2.txt"]
    assert "in/img1_v1.txt" in report.skipped[0][1]
    assert [s["__key__"] for s in wds.WebDataset(str(tmp_path / "s-00.tar"), shardshuffle=False)] == ["img1", "img2"]
    assert _keys(tmp_path) == ["img1", "img2"]
    assert report.index is not None and report.index.total == 2


@pytest.mark.timeout(120)  # worker processes
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("handler", [None, ignore_and_continue])
def test_a_repeat_across_shards_stops_the_run_whatever_the_handler(tmp_path, workers, handler):
    """The second of two shards to finish with one key is removed; the error names the key, both
    inputs (by their keys) and both shards; oracle: tarfile over what is left."""
    extra = {} if handler is None else {"handler": handler}
    with pytest.raises(ShardWriteError) as caught:
        write_shards(_input(["a_1", "b_1", "c_1", "a_2", "d_1"]), str(tmp_path / "s-%02d.tar"), maxcount=1,
                     map=strip_version, workers=workers, fsync=False, **extra)
    message = str(caught.value)
    assert "the key 'a'" in message and "'a_1'" in message and "'a_2'" in message
    assert "s-00.tar" in message and "s-03.tar" in message
    left = _keys(tmp_path)
    assert len(left) == len(set(left))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(targets=st.lists(st.sampled_from(["p", "q", "r", "s", "t"]), min_size=1, max_size=12))
def test_what_a_skipping_map_run_writes_is_each_keys_first_sample(tmp_path_factory, targets):
    """oracle: a model, the first input to get each key (in input order) is written, the others
    are listed as skipped; tarfile reads the keys back."""
    folder = tmp_path_factory.mktemp("map")
    samples = [{"__key__": f"in{i:02d}", "__source__": f"row {i}", "to": t.encode(), "txt": str(i)}
               for i, t in enumerate(targets)]
    report = write_shards(samples, str(folder / "s-%02d.tar"), map=renamed, handler=ignore_and_continue, fsync=False)
    first = {}
    for i, target in enumerate(targets):
        first.setdefault(target, i)
    assert _keys(folder) == list(first)
    assert sorted(source for source, _ in report.skipped) == sorted(
        f"row {i}" for i, t in enumerate(targets) if first[t] != i)
    assert report.read == report.written + len(report.skipped) == len(targets)
