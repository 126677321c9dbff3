"""MixedEpochs in one process: exact shares per source, the three batchings, resume, curricula, bad input."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
import torch
from builders import write_index
from torchdata.stateful_dataloader import StatefulDataLoader

import wds_datapipes as wd

SIZES = {"web": [40, 13, 27, 9], "books": [25, 11], "tiny": [6]}  # 'tiny': one shard, smaller than its share
WEIGHTS = {"web": 0.5, "books": 0.3, "tiny": 0.2}


@pytest.fixture
def sources(tmp_path, sized_shards) -> dict[str, str]:
    """Three indexes of uneven shards; keys start with the source's name; 'web' has member places."""
    found = {}
    for name, sizes in SIZES.items():
        shards = sized_shards(sizes, prefix=name, folder=tmp_path / name)
        found[name] = write_index(shards, tmp_path / name / "index.json", places=name == "web")
    return found


def _mix(sources, **kw) -> wd.MixedEpochs:
    kw.setdefault("batch_size", 8)
    kw.setdefault("weights", WEIGHTS)
    kw.setdefault("samples_per_epoch", 200)
    return wd.MixedEpochs(sources, seed=3, lanes=4, block=32, rank=kw.pop("rank", 0),
                          world_size=kw.pop("world_size", 1), **kw)


def _source_of(key: str) -> str:
    return next(name for name in SIZES if key.startswith(name))


def test_each_source_gives_exactly_its_share_and_every_sample_says_where_it_came_from(sources):
    samples = list(_mix(sources))
    assert len(samples) == 200
    assert Counter(s["__source__"] for s in samples) == {"web": 100, "books": 60, "tiny": 40}
    assert all(_source_of(s["__key__"]) == s["__source__"] for s in samples)
    web = [s["__key__"] for s in samples if s["__source__"] == "web"]
    assert len(set(web)) == 89  # 100 from its 89 samples: a whole pass, then the next pass's start
    tiny = Counter(s["__key__"] for s in samples if s["__source__"] == "tiny")
    assert set(tiny.values()) <= {6, 7} and len(tiny) == 6  # 40 from 6 samples: passes in new orders


def test_the_ranks_of_an_epoch_hold_the_shares_between_them(sources):
    ranks = [list(_mix(sources, rank=r, world_size=2)) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == 100
    assert Counter(s["__source__"] for rank in ranks for s in rank) == {"web": 100, "books": 60, "tiny": 40}
    once = [list(_mix(sources, rank=r, world_size=2, samples_per_epoch=None, stop="first_exhausted"))
            for r in range(2)]
    keys = [s["__key__"] for rank in once for s in rank]
    assert len(keys) == len(set(keys)) == 30  # no source repeats: no sample twice, on any rank


def test_shares_and_order_repeat_with_the_seed_and_change_every_epoch(sources):
    first, again = _mix(sources), _mix(sources)
    epoch0 = [s["__key__"] for s in first]
    assert epoch0 == [s["__key__"] for s in again]
    first.set_epoch(1)
    assert [s["__key__"] for s in first] != epoch0


def test_stratified_batches_hold_each_source_s_share_within_one_sample(sources):
    batches = list(_mix(sources, batching="stratified").batch_samples(8))
    assert len(batches) == 25
    for batch in batches:
        held = Counter(batch["__source__"])
        assert all(abs(held[name] - 8 * w) < 1 for name, w in WEIGHTS.items())


def test_per_source_batches_are_of_one_source_in_proportion(sources):
    batches = list(_mix(sources, batching="per_source").batch_samples(8))
    kinds = [set(b["__source__"]) for b in batches]
    assert all(len(k) == 1 for k in kinds)
    assert Counter(k.pop() for k in kinds) == {"web": 12, "books": 7, "tiny": 5}  # 100, 60, 40 in whole batches


def test_stop_rules_and_per_source_counts(sources):
    first = list(_mix(sources, samples_per_epoch=None, stop="first_exhausted"))
    assert Counter(s["__source__"] for s in first) == {"web": 15, "books": 9, "tiny": 6}  # tiny runs out
    every = list(_mix(sources, samples_per_epoch=None, stop="all_exhausted"))
    counts = Counter(s["__source__"] for s in every)
    assert counts["web"] >= 89 and counts["books"] >= 36 and counts["tiny"] >= 6
    assert {s["__key__"] for s in every} >= {k for k in _keys_of("books")}  # every sample of every source
    counted = list(_mix(sources, weights=None, samples_per_epoch=None, repeat={"tiny": 3.0, "web": 0.5},
                        choose={"books": 10}))
    assert Counter(s["__source__"] for s in counted) == {"web": 45, "books": 10, "tiny": 18}  # 44.5 rounds up


def _keys_of(name: str) -> list[str]:
    return [f"{name}{shard}-{i:04d}" for shard, n in enumerate(SIZES[name]) for i in range(n)]


def test_a_source_of_weight_zero_gives_nothing(sources):
    samples = list(_mix(sources, weights={"web": 1.0, "books": 0.0, "tiny": 1.0}))
    assert Counter(s["__source__"] for s in samples) == {"web": 100, "tiny": 100}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"weights": {"web": -1.0, "books": 1.0, "tiny": 1.0}}, "finite and >= 0"),
    ({"weights": {"web": 0.0, "books": 0.0, "tiny": 0.0}}, "all weights are 0"),
    ({"weights": {"web": 1.0, "news": 1.0}}, r"not in the mixture: \['news'\]"),
    ({"samples_per_epoch": None}, "need a stop rule"),
    ({"batching": "zip"}, "batching must be one of"),
])
def test_bad_weights_are_refused_before_any_sample_is_read(sources, kwargs, message):
    with pytest.raises(ValueError, match=message):
        _mix(sources, **kwargs)


def test_two_sources_with_one_name_are_refused(sources):
    with pytest.raises(ValueError, match=r"same name: \['web'\]"):
        wd.MixedEpochs([("web", sources["web"]), ("web", sources["books"])], batch_size=8)
    # bare locations are named after their folders, or their files where folders clash
    assert wd.MixedEpochs([sources["web"], sources["books"]], batch_size=8).names == ("web", "books")


def test_an_index_that_no_longer_matches_its_shards_fails_before_the_first_sample(sources, tmp_path):
    shard = tmp_path / "books" / "books-001.tar"
    with open(shard, "ab") as f:
        f.write(bytes(512))
    pipe = iter(_mix(sources, weights={"web": 0.0, "books": 1.0, "tiny": 0.0}))
    with pytest.raises(wd.IndexMismatchError, match="books-001.tar.*it changed since it was indexed"):
        next(pipe)


def _batches(loader) -> list[list[str]]:
    return [list(b["__key__"]) for b in loader]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(("batching", "stop_after"), [
    ("random", 3), ("random", 12), ("random", 13),  # mid-epoch, before its last (short) batch, at its end
    ("stratified", 5), ("per_source", 7)])
def test_a_stateful_dataloader_resumes_exactly_in_a_new_process(sources, tmp_path, workers, batching, stop_after):
    def loader():
        return StatefulDataLoader(_mix(sources, samples_per_epoch=100, batching=batching).batch_samples(8),
                                  batch_size=None, num_workers=workers, persistent_workers=bool(workers))

    whole = loader()
    expected = [_batches(whole) for epoch in range(2)]
    head, state = loader(), None
    for taken, _ in enumerate(head, 1):
        if taken == stop_after:
            state = head.state_dict()
            break
    (tmp_path / "state.json").write_text(json.dumps(state))  # a checkpoint, read back in a new loader
    resumed = loader()
    resumed.load_state_dict(json.loads((tmp_path / "state.json").read_text()))
    rest = _batches(resumed)  # the rest of epoch 0 (nothing where it had ended)
    assert rest == expected[0][stop_after:]
    assert _batches(resumed) == expected[1]


def test_a_step_count_resumes_under_the_plain_dataloader(sources):
    def pipe():
        return _mix(sources, samples_per_epoch=120).batch_samples(8)

    loader = torch.utils.data.DataLoader(pipe(), batch_size=None, num_workers=2, persistent_workers=True)
    whole = [b for epoch in range(2) for b in _batches(loader)]
    saved = json.dumps(_mix(sources, samples_per_epoch=120).step_state(epoch=0, batches=5).to_dict())  # with its mix
    dp = pipe()
    dp.load_state_dict(json.loads(saved))
    loader = torch.utils.data.DataLoader(dp, batch_size=None, num_workers=2, persistent_workers=True)
    assert [b for epoch in range(2) for b in _batches(loader)] == whole[5:]


def test_a_step_count_resumed_with_new_weights_finishes_its_epoch_as_planned_or_is_refused(sources):
    """An epoch planned 80/20 finishes 80/20 (oracle: the old pipe's own rest of the epoch) from
    the step count saved with its mix; a bare step count, which holds no mix, is refused mid-epoch
    with what to save instead (it would be re-planned by the new weights: 34/66)."""
    def pipe(weights):
        return _mix(sources, weights=weights, samples_per_epoch=160, batch_size=16, batching="stratified")

    old = pipe({"web": 0.8, "books": 0.2, "tiny": 0.0})
    samples = iter(old)
    for _ in range(48):  # three batches
        next(samples)
    planned_rest = [s["__key__"] for s in samples]
    saved = json.dumps(old.step_state(epoch=0, batches=3).to_dict())
    new = pipe({"web": 0.2, "books": 0.8, "tiny": 0.0})
    new.load_state_dict(json.loads(saved))
    assert [s["__key__"] for s in new] == planned_rest  # epoch 0 as it was planned
    assert Counter(s["__source__"] for s in new) == {"web": 32, "books": 128}  # epoch 1: the new weights
    bare = pipe({"web": 0.2, "books": 0.8, "tiny": 0.0})
    with pytest.raises(ValueError, match=r"EpochState\(epoch=0, batches=3\) holds no mix.*source.step_state"):
        bare.load_state_dict(wd.EpochState(epoch=0, batches=3))
    bare.load_state_dict(wd.EpochState(epoch=1, batches=0))  # at an epoch's start a step count is enough
    assert Counter(s["__source__"] for s in bare) == {"web": 32, "books": 128}
    # At the old epoch's end (10 batches) too: under new weights its plan may end earlier or
    # later, so only the next epoch's start is taken without the mix.
    with pytest.raises(ValueError, match="holds no mix"):
        pipe({"web": 0.2, "books": 0.8, "tiny": 0.0}).load_state_dict(wd.EpochState(epoch=0, batches=10))


def test_new_weights_on_resume_take_effect_at_the_next_epoch(sources, caplog):
    old = _mix(sources, samples_per_epoch=100)
    it = iter(old)
    for _ in range(37):
        next(it)
    state = old.state_dict()
    expected_rest = [s["__key__"] for s in it]  # epoch 0 as planned
    curriculum = _mix(sources, samples_per_epoch=100, weights={"web": 0.1, "books": 0.1, "tiny": 0.8},
                      batching="stratified")
    with caplog.at_level("INFO", logger="wds_datapipes"):
        curriculum.load_state_dict(state)
    assert [s["__key__"] for s in curriculum] == expected_rest
    assert "new settings hold from epoch 1" in caplog.text
    counts = Counter(s["__source__"] for s in curriculum)  # epoch 1: the new weights
    assert counts == {"web": 9, "books": 10, "tiny": 77}  # stratified, drop: 96 of 100 (the 4 by the shares)
    # each source went on from where epoch 0 left it, not from its start
    assert epoch_starts(curriculum.state_dict())["web"] == 50


def epoch_starts(state: dict) -> dict[str, int]:
    return {name: start for name, start, *_ in state["mixture"]}


def test_a_mixture_state_is_refused_where_its_sources_changed(sources, tmp_path, sized_shards):
    dp = _mix(sources)
    state = dp.state_dict()
    other = write_index(sized_shards([25, 12], prefix="books", folder=tmp_path / "books2"), tmp_path / "b2.json")
    changed = wd.MixedEpochs({**sources, "books": other}, batch_size=8, weights=WEIGHTS, samples_per_epoch=200)
    with pytest.raises(ValueError, match="'books' has 37 samples in 2 shards, the state was saved with 36"):
        changed.load_state_dict(state)
    with pytest.raises(ValueError, match="batch_size must stay"):
        _mix(sources, batch_size=4).load_state_dict(state)
    with pytest.raises(ValueError, match="one dataset's state"):
        _mix(sources).load_state_dict(wd.ExactEpochs(sources["web"], batch_size=8).state_dict())
    with pytest.raises(ValueError, match="a mixture's state"):
        wd.ExactEpochs(sources["web"], batch_size=8).load_state_dict(state)


def test_the_pipe_pickles_and_the_sources_travel(sources):
    import pickle

    dp = _mix(sources).batch_samples(8)
    clone = pickle.loads(pickle.dumps(dp))
    assert _batches(clone) == _batches(dp)


def test_examples_mixing_runs(tmp_path):
    import subprocess
    import sys

    example = Path(__file__).resolve().parents[2] / "examples" / "mixing_datasets.py"
    run = subprocess.run([sys.executable, str(example), "--data", str(tmp_path / "data")], capture_output=True,
                         text=True, timeout=300, check=False,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "resumed: the same batches" in run.stdout


def test_a_per_source_state_taken_mid_batch_resumes_on_another_topology_as_an_empty_dropped_rest(sources):
    """The rest of the epoch is 6 samples of 'tiny' and 2 of 'books' (a part of a batch each): in
    whole batches of 8, nothing; on 2 ranks it is dropped (and logged), not an error."""
    def pipe(**kw):
        return _mix(sources, weights=None, samples_per_epoch=None, choose={"web": 16, "books": 10, "tiny": 6},
                    batching="per_source", **kw)

    dp = pipe()
    assert len(dp) == 24  # 16 + 8 + 0: whole batches of 8
    it = iter(dp)
    for _ in range(20):  # 2.5 batches: mid-batch
        next(it)
    saved = wd.EpochState.from_dict(dp.state_dict())
    rank_state = wd.EpochState(epoch=saved.epoch, taken=saved.taken, world=1, workers=1, settings=saved.settings,
                               mixture=saved.mixture)
    elsewhere = pipe(rank=0, world_size=2)
    elsewhere.load_state_dict(rank_state.to_dict())
    assert list(elsewhere) == []  # the rest of epoch 0: nothing in whole batches
    assert len(list(elsewhere)) == 8  # epoch 1 on 2 ranks: one whole batch each of its three


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files in /proc/self/fd")
def test_a_hundred_one_shard_sources_are_read_with_a_bounded_number_of_open_files(tmp_path, sized_shards):
    """100 sources of one shard each (docs advertise 100): the sources share the reader's 16
    lanes (each at least one), so at most 16 + 100 shards are open, not 100 x 16 (past the
    usual limit of 1024), and the samples held are one block plus one lane's rows per source."""
    sources = {f"s{i:03d}": write_index(sized_shards([20], prefix=f"s{i:03d}x", folder=tmp_path / f"s{i:03d}"),
                                        tmp_path / f"s{i:03d}" / "index.json") for i in range(100)}
    dp = wd.MixedEpochs(sources, batch_size=10, seed=1)  # each source once per epoch: 2000 samples
    baseline, peak, seen = len(os.listdir("/proc/self/fd")), 0, Counter()
    for n, sample in enumerate(dp):
        seen[sample["__key__"]] += 1
        if n % 25 == 0:
            peak = max(peak, len(os.listdir("/proc/self/fd")))
    assert len(seen) == 2000 and set(seen.values()) == {1}
    assert peak - baseline <= 16 + 100 + 8
    reader = dp._run.reader()  # the samples held at once: the sources' blocks together
    assert sum(plan.block_size for plan in reader.plans) <= 512 + 2 * 100


def test_no_sample_comes_twice_in_an_epoch_whose_shares_the_sources_hold(sources):
    """Read, not only planned: 'web' gives 70 of its 89 samples and 'books' 30 of its 36 per
    epoch, so most epochs run from one pass over a source into the next (oracle: the documented
    rule, no sample twice in an epoch unless a source is asked for more than it holds)."""
    dp = _mix(sources, weights={"web": 0.7, "books": 0.3, "tiny": 0.0}, samples_per_epoch=100, batch_size=4)
    over_epochs = Counter()
    for epoch in range(6):
        keys = Counter(s["__key__"] for s in dp)
        assert sum(keys.values()) == 100 and set(keys.values()) == {1}, epoch
        assert Counter(_source_of(k) for k in keys) == {"web": 70, "books": 30}
        over_epochs.update(keys)
    web = [over_epochs[k] for k in over_epochs if k.startswith("web")]
    assert len(web) == 89 and max(web) - min(web) <= 1  # 420 of 89: every sample 4 or 5 times
