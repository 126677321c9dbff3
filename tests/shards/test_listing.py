"""Shard listing: expansion of URL specs, per-epoch seeded shuffles, and the split between workers."""

from __future__ import annotations

import copy
import os
import pickle

import pytest
from braceexpand import braceexpand
from torch.utils.data.datapipes.iter import IterableWrapper
from torch.utils.data.graph_settings import apply_sharding

from wds_datapipes import NoShardsError, ShardLister
from wds_datapipes.shards.listing import expand_url_spec


def _touch(directory, *names: str) -> list[str]:
    paths = []
    for name in names:
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
        paths.append(str(path))
    return paths


def _twenty(tmp_path) -> list[str]:
    return [f"{tmp_path}/shard-{i:02d}.tar" for i in range(20)]


# ---------------------------------------------------------------- expansion


def test_list_shards_expands_braces_like_braceexpand():
    spec = "s3-{000..011}.tar"
    assert list(ShardLister(spec)) == list(braceexpand(spec))
    assert list(ShardLister("data/{a,b}-{0..2}.tar")) == list(braceexpand("data/{a,b}-{0..2}.tar"))


def test_list_shards_joins_specs_with_double_colon():
    urls = list(ShardLister("a-{0..1}.tar::http://host/b-{2..3}.tar:: pipe:cat c.tar"))
    assert urls == ["a-0.tar", "a-1.tar", "http://host/b-2.tar", "http://host/b-3.tar", "pipe:cat c.tar"]


def test_list_shards_takes_a_list_of_specs_in_order():
    assert list(ShardLister(["b-{0..1}.tar", "a.tar::c.tar"])) == ["b-0.tar", "b-1.tar", "a.tar", "c.tar"]


def test_list_shards_takes_a_datapipe_of_specs():
    assert list(IterableWrapper(["x-{0..2}.tar", "y.tar"]).list_shards()) == [
        "x-0.tar", "x-1.tar", "x-2.tar", "y.tar",
    ]


def test_list_shards_rejects_non_string_specs_when_iterated():
    dp = ShardLister([3])
    with pytest.raises(TypeError, match="strings"):
        list(dp)


def test_list_shards_expands_a_local_glob_sorted(tmp_path):
    shards = _touch(tmp_path, "b-1.tar", "a-0.tar", "c-2.tar", "notes.txt")
    assert list(ShardLister(f"{tmp_path}/*.tar")) == sorted(shards[:3])
    assert list(ShardLister(f"{tmp_path}/[ab]-?.tar")) == sorted(shards[:2])


def test_list_shards_lists_a_directorys_tar_files_sorted(tmp_path):
    _touch(tmp_path, "b.tar", "a.tgz", "c.tar.gz", "d.txt", "e.tar.bz2", "f.tar.idx", "sub/g.tar", "h.tar.xz",
           "i.tar.zst", "j.zst")
    expected = [os.path.join(tmp_path, n) for n in ["a.tgz", "b.tar", "c.tar.gz", "e.tar.bz2", "h.tar.xz", "i.tar.zst"]]
    assert list(ShardLister(str(tmp_path))) == expected
    assert list(ShardLister(f"file://{tmp_path}")) == ["file://" + path for path in expected]


def test_list_shards_replaces_braced_variables_with_wds_environment_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("WDS_ROOT", str(tmp_path))
    monkeypatch.setenv("WDS_SPLIT", "${KIND}-{0..1}")  # a value may hold variables and braces too
    monkeypatch.setenv("WDS_KIND", "train")
    shards = _touch(tmp_path, "train-0.tar", "train-1.tar")
    assert list(ShardLister("${ROOT}/${SPLIT}.tar")) == shards
    assert expand_url_spec("pipe:cat ${ROOT}/x.tar") == [f"pipe:cat {tmp_path}/x.tar"]
    with pytest.raises(ValueError, match="WDS_MISSING"):
        list(ShardLister("${MISSING}/a.tar"))


def test_a_path_with_glob_characters_naming_an_existing_file_is_that_file(tmp_path):
    literal, other = _touch(tmp_path, "shard[1].tar", "shard1.tar")
    assert list(ShardLister(literal)) == [literal]
    assert list(ShardLister(f"{tmp_path}/shard[12].tar")) == [other]  # no such file: a glob


def test_file_urls_name_local_paths_as_webdataset_reads_them(tmp_path, make_shards, monkeypatch):
    (shard,) = make_shards(1, 2)
    expected = [(name, data) for _, name, data in ShardLister([shard]).load_tar()]
    monkeypatch.chdir(os.path.dirname(shard))
    relative = os.path.basename(shard)
    for url in [f"file://{shard}", f"file://localhost{shard}", f"file:{shard}", f"file://{relative}",
                f"file:{relative}"]:
        members = list(ShardLister([url]).load_tar())
        assert [(name, data) for _, name, data in members] == expected, url
        assert {u for u, _, _ in members} == {url}
    assert list(ShardLister(f"file://localhost{os.path.dirname(shard)}/*.tar")) == [f"file://localhost{shard}"]


def test_list_shards_passes_remote_urls_through_untouched(tmp_path):
    urls = ["http://h/a-*.tar", "pipe:cat x*.tar", "myscheme://b/[0].tar"]
    assert list(ShardLister(urls)) == urls


def test_expand_url_spec_does_no_io():
    assert expand_url_spec("/no/such/dir/a-{0..1}.tar") == ["/no/such/dir/a-0.tar", "/no/such/dir/a-1.tar"]


def test_list_shards_does_no_io_until_iterated(tmp_path):
    dp = ShardLister(f"{tmp_path}/missing/*.tar", shuffle=True)
    _touch(tmp_path, "missing/late.tar")  # appears after construction: still found
    assert list(dp) == [f"{tmp_path}/missing/late.tar"]


@pytest.mark.parametrize("spec", ["{dir}/*.tar", "{dir}", ""])
def test_list_shards_raises_no_shards_error_when_nothing_matches(tmp_path, spec):
    _touch(tmp_path, "only.txt")
    dp = ShardLister(spec.format(dir=tmp_path))  # constructing it is fine
    with pytest.raises(NoShardsError, match="no shard URL matched"):
        list(dp)


def test_list_shards_raises_no_shards_error_on_an_empty_list():
    with pytest.raises(NoShardsError):
        list(ShardLister([]))


def test_list_shards_allow_empty_yields_nothing_instead(tmp_path):
    assert list(ShardLister(f"{tmp_path}/*.tar", allow_empty=True)) == []


# ---------------------------------------------------------------- shuffling


def test_unshuffled_order_is_the_spec_order_every_epoch(tmp_path):
    urls = _twenty(tmp_path)
    dp = ShardLister(urls)
    assert list(dp) == urls
    assert list(dp) == urls


def test_shard_shuffle_with_a_seed_repeats_across_runs(tmp_path):
    urls = _twenty(tmp_path)
    first, second = ShardLister(urls, shuffle=True, seed=11), ShardLister(urls, shuffle=True, seed=11)
    epochs_first = [list(first) for _ in range(3)]
    epochs_second = [list(second) for _ in range(3)]
    assert epochs_first == epochs_second
    assert sorted(epochs_first[0]) == urls
    assert epochs_first[0] != urls


def test_shard_shuffle_changes_order_every_epoch(tmp_path):
    urls = _twenty(tmp_path)
    for dp in (ShardLister(urls, shuffle=True, seed=11), ShardLister(urls, shuffle=True)):
        epochs = [list(dp) for _ in range(3)]
        assert all(sorted(epoch) == urls for epoch in epochs)
        assert len({tuple(epoch) for epoch in epochs}) == 3


def test_shard_shuffle_differs_between_seeds(tmp_path):
    urls = _twenty(tmp_path)
    assert list(ShardLister(urls, shuffle=True, seed=1)) != list(ShardLister(urls, shuffle=True, seed=2))


def test_shard_shuffle_follows_the_loader_seed(tmp_path):
    urls = _twenty(tmp_path)

    def order(seed: int | None, loader_seed: int) -> list[str]:
        dp = ShardLister(urls, shuffle=True, seed=seed)
        dp.sharded.source_datapipe.set_seed(loader_seed)
        return list(dp)

    assert order(None, 5) == order(None, 5)  # the loader's seed alone makes the run repeat
    assert order(None, 5) != order(None, 6)
    assert order(3, 5) == order(3, 5)
    assert order(3, 5) != order(4, 5)


# ---------------------------------------------------------------- splitting between workers / ranks


def _parts(dp, n: int) -> list[list[str]]:
    parts = []
    for i in range(n):
        part = copy.deepcopy(dp)  # what the loaders do: one copy per worker
        apply_sharding(part, n, i)
        parts.append(list(part))
    return parts


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("n", [2, 3, 7])
def test_apply_sharding_splits_whole_shards_into_a_partition(tmp_path, n, shuffle):
    urls = _twenty(tmp_path)
    parts = _parts(ShardLister(urls, shuffle=shuffle), n)  # unseeded: the copies share the fallback seed
    flat = [url for part in parts for url in part]
    assert sorted(flat) == urls  # every shard once: disjoint and complete
    assert all(abs(len(part) - len(urls) / n) < 1 for part in parts)


def test_apply_sharding_is_round_robin_over_the_unshuffled_list(tmp_path):
    urls = _twenty(tmp_path)
    assert _parts(ShardLister(urls), 3) == [urls[0::3], urls[1::3], urls[2::3]]


def test_apply_sharding_reaches_the_lister_through_a_pipeline(tmp_path, make_shards):
    shards = make_shards(4, 2)
    parts = _parts(ShardLister(shards).load_tar().group_by_key(), 2)
    assert [{s["__url__"] for s in part} for part in parts] == [{shards[0], shards[2]}, {shards[1], shards[3]}]


def test_part_without_a_shard_raises_no_shards_error_naming_allow_empty(tmp_path):
    urls = _twenty(tmp_path)[:3]
    dp = ShardLister(urls)
    apply_sharding(dp, 4, 3)
    with pytest.raises(NoShardsError, match="allow_empty") as caught:
        list(dp)
    assert "part 3 of 4" in str(caught.value)


def test_part_without_a_shard_yields_nothing_with_allow_empty(tmp_path):
    urls = _twenty(tmp_path)[:3]
    parts = _parts(ShardLister(urls, allow_empty=True), 4)
    assert parts == [[urls[0]], [urls[1]], [urls[2]], []]


# ---------------------------------------------------------------- pipe contract


def test_shard_lister_pickles_with_its_state(tmp_path):
    urls = _twenty(tmp_path)
    dp = ShardLister(urls, shuffle=True)
    clone = pickle.loads(pickle.dumps(dp))
    assert list(clone) == list(dp)  # the unseeded fallback seed travels with the pipe
    assert list(clone) == list(dp)
    wrapped = pickle.loads(pickle.dumps(IterableWrapper(["a-{0..1}.tar"]).list_shards()))
    assert list(wrapped) == ["a-0.tar", "a-1.tar"]


def test_shard_lister_has_no_length(tmp_path):
    with pytest.raises(TypeError):
        len(ShardLister(_twenty(tmp_path)))


def test_torchs_shuffle_pipe_stays_reachable_on_the_listers_and_exact_epochs(tmp_path, sized_shards):
    from builders import write_index

    from wds_datapipes import ExactEpochs

    urls = _twenty(tmp_path)
    assert sorted(ShardLister(urls).shuffle()) == sorted(urls)
    index = write_index(sized_shards([3, 4]), tmp_path / "i.json")
    assert len(list(ExactEpochs(index, batch_size=2).shuffle())) == 7
