"""A key that a ``map`` gives twice is refused over the whole output, not only within one run:
across ranks joined into one index, across a resume and a grown input, for plain and
compressed shards and at a remote destination, the same way as in one uninterrupted run
(naming the key, both inputs and both shards; whatever the handler)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc

import pytest

from tests.writing.conftest import shard_keys
from wds_datapipes.errors import ShardWriteError
from wds_datapipes.handlers import ignore_and_continue
from wds_datapipes.writing import write_shards
from wds_datapipes.writing.destination import join_any

STOP_AT: set[str] = set()  # inputs at which strip_number stops the run, as a kill would (KeyboardInterrupt)


def strip_number(sample: dict) -> dict:
    """a_1 and a_2 both become a (the review's map)."""
    if sample["__key__"] in STOP_AT:
        raise KeyboardInterrupt
    return {**sample, "__key__": sample["__key__"].rsplit("_", 1)[0]}


def _input(keys) -> list[dict]:
    return [{"__key__": k, "txt": f"text of {k}"} for k in keys]


def first_repeat(keys: list[str], maxcount: int = 1) -> tuple[str, str, str, int, int]:
    """oracle: a model of the output. The map's key for each input, in plan order (input i in
    shard i // maxcount); the first key given twice: (key, its first input, the second, their shards)."""
    seen: dict[str, tuple[str, int]] = {}
    for at, key in enumerate(keys):
        given = key.rsplit("_", 1)[0]
        if given in seen:
            return given, seen[given][0], key, seen[given][1], at // maxcount
        seen[given] = (key, at // maxcount)
    raise AssertionError("no repeat in the input")


def _assert_names(error: ShardWriteError, keys: list[str], name) -> None:
    key, first_input, second_input, first, second = first_repeat(keys)
    message = str(error)
    assert f"the key {key!r}" in message
    assert repr(first_input) in message and repr(second_input) in message
    assert name(first) in message and name(second) in message


DESTINATIONS = ["plain", "gzip", "remote"]


def _where(kind: str, tmp_path) -> tuple[str, dict]:
    if kind == "remote":
        return "memlist://b/s-%02d.tar", {"spool": str(tmp_path / "spool")}
    return str(tmp_path / ("s-%02d.tar" if kind == "plain" else "s-%02d.tar.gz")), {}


REVIEW = ["a_1", "a_2", "b_1", "c_1"]  # the review's input: rank 0 writes a (a_1) and b, rank 1 a (a_2) and c


# (create --join runs in a process of its own, which the in-memory store is not in)
JOINS = [(kind, join) for kind in DESTINATIONS for join in ("join_index", "join=True", "create --join")
         if (kind, join) != ("remote", "create --join")]


@pytest.mark.parametrize(("kind", "join"), JOINS)
@pytest.mark.parametrize("handler", [None, ignore_and_continue])
def test_two_ranks_that_each_write_a_key_once_are_refused_at_the_join(tmp_path, store, kind, join, handler):
    """Each rank's shards hold a once; the join sees both and writes no index."""
    pattern, extra = _where(kind, tmp_path)
    options = dict(maxcount=1, map=strip_number, world=2, fsync=False, **extra,
                   **({} if handler is None else {"handler": handler}))
    write_shards(_input(REVIEW), pattern, rank=0, join=False, **options)
    index = pattern.rsplit("/", 1)[0] + "/index.json"
    with pytest.raises(ShardWriteError) as caught:
        if join == "join=True":
            write_shards(_input(REVIEW), pattern, rank=1, join=True, **options)
        else:
            write_shards(_input(REVIEW), pattern, rank=1, join=False, **options)
            if join == "join_index":
                join_any(index, 2, spool=extra.get("spool"))
            else:
                run = subprocess.run([sys.executable, "-m", "wds_datapipes", "create", "unused", "-o", pattern,
                                      "--join", "--world", "2"], capture_output=True, text=True, timeout=120,
                                     check=False)
                assert run.returncode != 0
                raise ShardWriteError(run.stderr.strip())
    _assert_names(caught.value, REVIEW, lambda n: (pattern % n).rsplit("/", 1)[1])
    if kind == "remote":
        assert not any(url.endswith("index.json") for url in store.objects)
    else:
        assert not os.path.exists(index)


@pytest.mark.parametrize("kind", DESTINATIONS)
def test_a_grown_input_whose_new_shard_repeats_an_earlier_runs_key_is_refused(tmp_path, store, kind):
    """The earlier run wrote a and b; the input grew by a_2. The new shard is removed; what is left
    reads a, b (tarfile), as an uninterrupted run over the grown input leaves."""
    pattern, extra = _where(kind, tmp_path)
    write_shards(_input(["a_1", "b_1"]), pattern, maxcount=1, map=strip_number, fsync=False, **extra)
    grown = ["a_1", "b_1", "a_2"]
    with pytest.raises(ShardWriteError) as caught:
        write_shards(_input(grown), pattern, maxcount=1, map=strip_number, fsync=False, **extra)
    _assert_names(caught.value, grown, lambda n: (pattern % n).rsplit("/", 1)[1])
    if kind == "remote":
        assert store.shards() == ["s-00.tar", "s-01.tar"]
    else:
        assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(pattern % n) for n in (0, 1)] +
                                                      ["index.json", "index.json.rank0-of-1.progress",
                                                       *(["index.offsets", "index.places", "index.places.json",
                                                          "index.keys"] if kind == "plain" else [])])
        assert shard_keys([pattern % 0, pattern % 1]) == ["a", "b"]


@pytest.mark.parametrize("kind", ["plain", "gzip"])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_killed_and_resumed_run_is_refused_as_the_uninterrupted_one(tmp_path, kind, workers):
    """oracle: the uninterrupted run over the same input: the same key and shards named, the same
    shard files left, byte for byte (tarfile reads each key once in what is left)."""
    keys = ["a_1", "b_1", "a_2", "c_1"]
    results = {}
    for way in ("uninterrupted", "killed"):
        folder = tmp_path / way
        folder.mkdir()
        pattern, _ = _where(kind, folder)
        options = {"maxcount": 1, "map": strip_number, "fsync": False, "workers": workers}
        if way == "killed":
            STOP_AT.add("a_2")  # the kill comes before the repeat is given
            try:
                with pytest.raises(KeyboardInterrupt):
                    write_shards(_input(keys), pattern, **options)
            finally:
                STOP_AT.clear()
            assert os.path.exists(pattern % 0) and not os.path.exists(pattern % 2)
        with pytest.raises(ShardWriteError) as caught:
            write_shards(_input(keys), pattern, **options)
        _assert_names(caught.value, keys, lambda n, pattern=pattern: os.path.basename(pattern % n))
        results[way] = {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))
                        if name.startswith("s-")}
    names = [os.path.basename(pattern % n) for n in range(4)]
    for way, left in results.items():
        # the shard of the two finished second is removed: shard 2 with one worker; with two, shard 0
        # or 2, and shard 3 may have been in a worker when the run stopped (renamed, not recorded)
        keys_left = shard_keys([tmp_path / way / name for name in left])
        assert len(keys_left) == len(set(keys_left)) and "a" in keys_left and "b" in keys_left, way
        assert (names[0] in left) != (names[2] in left), way
    if workers == 1:
        assert list(results["killed"]) == list(results["uninterrupted"]) == names[:2]
    for name in set(results["killed"]) & set(results["uninterrupted"]):
        assert results["killed"][name] == results["uninterrupted"][name], name


def test_a_key_given_again_in_one_shard_after_a_resume_is_still_refused_by_its_worker(tmp_path):
    """maxcount 2: a_1 and a_2 land in one shard; the worker's own check, as before (oracle: the model)."""
    keys = ["a_1", "a_2"]
    with pytest.raises(ShardWriteError, match="'a_1'"):
        write_shards(_input(keys), str(tmp_path / "s-%02d.tar"), maxcount=2, map=strip_number, fsync=False)
    assert not list(tmp_path.glob("s-*"))


def test_the_given_keys_cost_one_dict_slot_a_key():
    """oracle: tracemalloc, over keys whose strings exist already (as the record's lists hold them)."""
    from wds_datapipes.writing.progress import GivenKeys

    shards = [[f"sample-{shard:04d}-{i:06d}" for i in range(10_000)] for shard in range(20)]
    given = GivenKeys()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for shard, keys in enumerate(shards):
            given.add(shard, keys, keys, f"s-{shard:02d}.tar")
        cost = (tracemalloc.get_traced_memory()[0] - before) / 200_000
    finally:
        tracemalloc.stop()
    print(f"GivenKeys: {cost:.1f} bytes a key")
    assert cost < 80
    with pytest.raises(ShardWriteError, match=r"'sample-0003-000007'.*shard 20 \(s-20.tar\).*shard 3 \(s-03.tar\)"):
        given.add(20, ["x"], [shards[3][7]], "s-20.tar")


@pytest.mark.parametrize("mapped", [False, True])
def test_an_earlier_format_record_resumes_without_a_map_and_is_refused_with_one(tmp_path, mapped):
    """A writer_progress/2 record holds no keys a map gave: read where there was no map, refused
    where there was (oracle: the format tag planted in the record's first line)."""
    pattern = str(tmp_path / "s-%02d.tar")
    options = {"maxcount": 1, "fsync": False, **({"map": strip_number} if mapped else {})}
    write_shards(_input(["a_1", "b_1"]), pattern, **options)
    record = tmp_path / "index.json.rank0-of-1.progress"
    lines = record.read_text().splitlines()
    first = json.loads(lines[0])
    assert first["format"] == "wds_datapipes.writer_progress/3"
    first["format"] = "wds_datapipes.writer_progress/2"
    record.write_text("\n".join([json.dumps(first), *(line for line in lines[1:] if '"end"' not in line)]) + "\n")
    if mapped:
        with pytest.raises(ShardWriteError, match=r"writer_progress/2.*nor, with a map, the keys it gave"):
            write_shards(_input(["a_1", "b_1"]), pattern, **options)
    else:
        report = write_shards(_input(["a_1", "b_1"]), pattern, **options)
        assert (report.resumed, report.written) == (2, 2)


@pytest.mark.parametrize("kind", ["plain", "gzip", "remote"])
def test_a_new_shard_before_a_recorded_one_that_repeats_its_key_is_the_one_removed(tmp_path, store, kind):
    """The earlier run wrote a, b, c, d in shards 0-3; shard 1 is gone and its input is now c_2,
    so the resumed run writes shard 1 before the plan reaches recorded shard 2 (as after an
    earlier run whose workers finished out of order). Locally the recorded shards' keys are
    known first: the new shard 1 is removed, the recorded shard 2 kept. At a remote destination
    the records are read as the plan reaches them: both are kept and the run stops, naming both. Oracle: the model (first_repeat) for the names; tarfile over what is left."""
    pattern, extra = _where(kind, tmp_path)
    options = {"maxcount": 1, "map": strip_number, "fsync": False, **extra}
    write_shards(_input(["a_1", "b_1", "c_1", "d_1"]), pattern, **options)
    if kind == "remote":
        del store.objects[pattern % 1]
    else:
        os.remove(pattern % 1)
    changed = ["a_1", "c_2", "c_1", "d_1"]
    with pytest.raises(ShardWriteError) as caught:
        write_shards(_input(changed), pattern, **options)
    message = str(caught.value)
    assert "the key 'c'" in message and "'c_1'" in message and "'c_2'" in message
    assert "s-01" in message and "s-02" in message
    if kind == "remote":
        assert store.shards() == ["s-00.tar", "s-01.tar", "s-02.tar", "s-03.tar"]
    else:
        left = sorted(str(p) for p in tmp_path.glob("s-*"))
        assert [os.path.basename(p) for p in left] == [os.path.basename(pattern % n) for n in (0, 2, 3)]
        keys = shard_keys(left)
        assert sorted(keys) == ["a", "c", "d"]
