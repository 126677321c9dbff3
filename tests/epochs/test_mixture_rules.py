"""The mixture plan and the fixed-length epoch plan against a small, slow model of their documented rules.

The model (the oracle of every test here) is written out plainly from docs/mixing.md and
docs/distributed.md, not from the plan's code: how many samples each source gives, that no
sample comes twice in an epoch unless a source is asked for more than it holds (then at
most ceil(count / size) times), that every sample comes equally often over epochs, that a
resumed epoch is the uninterrupted one, and that the rest of an epoch on another topology
is exactly what no reader yielded.
"""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wds_datapipes.epochs.mixture import MixSettings, epoch_windows, plan_mixture, source_seed
from wds_datapipes.epochs.plan import PlanSettings, Segment, epoch_sequence, plan_epoch, worker_batches
from wds_datapipes.epochs.stream import window as window_samples

# ---------------------------------------------------------------- the model


def model_counts(totals: list[int], weights=None, samples_per_epoch=None, stop=None, repeat=None) -> list[int]:
    """How many samples each source gives per epoch, by the documented rules."""

    def shared(n, w):  # each its quota's floor, the rest one each to the largest remainders, first among equals
        w = [Fraction(repr(x)) if isinstance(x, float) else Fraction(x) for x in w]
        quotas = [n * x / sum(w) for x in w]
        counts = [math.floor(q) for q in quotas]
        by_remainder = sorted(range(len(w)), key=lambda k: (counts[k] - quotas[k], k))
        for k in by_remainder[: n - sum(counts)]:
            counts[k] += 1
        return counts

    if samples_per_epoch is not None:
        return shared(samples_per_epoch, weights if weights is not None else totals)
    if weights is not None:
        shares = [Fraction(repr(w)) / sum(Fraction(repr(x)) for x in weights) for w in weights]
        lengths = [Fraction(t) / s for t, s in zip(totals, shares) if s]
        length = math.floor(min(lengths)) if stop == "first_exhausted" else math.ceil(max(lengths))
        return shared(length, shares)
    return [math.floor(Fraction(repr(r)) * t + Fraction(1, 2)) for r, t in zip(repeat, totals)]


def most_allowed(count: int, total: int) -> int:
    """How often a sample may come in one epoch: once, unless the source is asked for more than it holds."""
    return 1 if count <= total else math.ceil(count / total)


def samples(spans) -> list[tuple[int, int]]:
    """(shard, sample) of every position, pads left out."""
    return [(s.shard, i) for s in spans if not s.pad for i in range(s.start, s.stop)]


def read(plan, rank: int, worker: int, start: int = 0) -> list[tuple[int, int, int, bool]]:
    """What a reader yields, by the plan alone: (source, shard, sample, pad) per position."""
    reader = plan.reader(rank, worker)
    orders = []
    for k, spans in enumerate(reader.spans):
        order = [p for q in range(reader.plans[k].blocks) for p in reader.plans[k].block_positions(q)]
        found = spans.locate(order) if order else ([], [], [])
        orders.append(iter(list(zip(*(x.tolist() if hasattr(x, "tolist") else x for x in found)))
                           [int(reader.taken(start)[k]):]))
    return [(k, *next(orders[k])) for run in reader.sources(start) for k in run.tolist()]


# ---------------------------------------------------------------- strategies

sources_st = st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=4).filter(sum), min_size=1, max_size=3)
how_st = st.sampled_from(["samples_per_epoch", "first_exhausted", "all_exhausted", "repeat", "sizes"])


def _settings(data, sizes, batching=None, mode=None) -> tuple[MixSettings, dict]:
    names = tuple("abc"[: len(sizes)])
    how = data.draw(how_st)
    kw: dict = {}
    if how in ("samples_per_epoch", "first_exhausted", "all_exhausted"):
        weights = data.draw(st.lists(st.sampled_from([0.0, 0.1, 0.2, 0.25, 0.5, 1.0, 3.0]), min_size=len(sizes),
                                     max_size=len(sizes)).filter(any))
        kw["weights"] = tuple(weights)
    if how in ("samples_per_epoch", "sizes"):
        kw["samples_per_epoch"] = data.draw(st.integers(1, 150))
    elif how == "repeat":
        kw["repeat"] = tuple(data.draw(st.lists(st.sampled_from([0.0, 0.3, 0.5, 1.0, 1.5, 2.0, 3.0]),
                                                min_size=len(sizes), max_size=len(sizes))))
    else:
        kw["stop"] = how
    s = MixSettings(names=names, seed=data.draw(st.integers(0, 3)), batch_size=data.draw(st.integers(1, 5)),
                    batching=batching or data.draw(st.sampled_from(["random", "stratified", "per_source"])),
                    mode=mode or data.draw(st.sampled_from(["drop", "pad"])), lanes=2, block=6, **kw)
    return s, kw


# ---------------------------------------------------------------- counts, repeats, equally often


@settings(max_examples=60, deadline=None)
@given(sources_st, st.data())
def test_every_epoch_gives_each_source_its_count_and_repeats_only_what_it_must(sizes, data):
    """Oracle: model_counts and most_allowed (the documented rules), over epochs 0 .. 11."""
    s, kw = _settings(data, sizes)
    totals = [sum(x) for x in sizes]
    expected = model_counts(totals, **kw)
    seen = [Counter() for _ in sizes]
    for epoch in range(12):
        windows = epoch_windows(s, totals, epoch)
        assert [w.count for w in windows] == expected
        for k, window in enumerate(windows):
            got = Counter(samples(window_samples(sizes[k], source_seed(s.seed, s.names[k]), s.shuffle,
                                                 window.cursor(totals[k]), window.count)))
            assert sum(got.values()) == expected[k]
            assert max(got.values(), default=0) <= most_allowed(expected[k], totals[k]), (k, epoch, window)
            if kw.get("stop") == "all_exhausted" and expected[k]:
                assert len(got) == totals[k]  # every sample of every source in every epoch
            seen[k].update(got)
    for k, counter in enumerate(seen):  # every sample equally often over epochs (any two within one of each other)
        if expected[k] and kw.get("stop") != "all_exhausted":
            everyone = [counter[(shard, i)] for shard, n in enumerate(sizes[k]) for i in range(n)]
            assert max(everyone) - min(everyone) <= 1, (k, everyone)


@pytest.mark.parametrize(("sizes", "kw"), [
    # the issue's first case: 0.5/0.3/0.2, first_exhausted, seed 0 (repeats from the second epoch on)
    ([[40, 13, 27, 9, 30, 60, 21], [25, 11, 50], [26, 14]], {"weights": (0.5, 0.3, 0.2), "stop": "first_exhausted"}),
    # the issue's second case: a source of 356 samples, share 301 of each epoch
    ([[100, 120, 136], [50, 50]], {"weights": (301, 99), "samples_per_epoch": 400}),
])
def test_the_issue_s_mixtures_repeat_no_sample_within_an_epoch(sizes, kw):
    """Oracle: the rule 'no sample twice in an epoch where no source is asked for more than it holds'."""
    s = MixSettings(names=("a", "b", "c")[: len(sizes)], seed=0, batch_size=1, **kw)
    totals = [sum(x) for x in sizes]
    for epoch in range(10):
        plan = plan_mixture(sizes, s, epoch, epoch_windows(s, totals, epoch), 1, 1)
        for sequence in plan.sequences:
            assert max(Counter(samples(sequence)).values()) == 1, epoch


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=5).filter(sum), st.integers(1, 100), st.booleans())
def test_fixed_length_epochs_of_one_dataset_keep_the_same_rule(sizes, length, shuffle):
    """Oracle: most_allowed, and every sample equally often (any two within one) over epochs."""
    seen = Counter()
    for epoch in range(10):
        got = Counter(samples(epoch_sequence(sizes, 9, epoch, shuffle, samples_per_epoch=length)))
        assert sum(got.values()) == length
        assert max(got.values()) <= most_allowed(length, sum(sizes))
        seen.update(got)
    everyone = [seen[(shard, i)] for shard, n in enumerate(sizes) for i in range(n)]
    assert max(everyone) - min(everyone) <= 1
    assert epoch_sequence(sizes, 9, 7, shuffle, samples_per_epoch=length) == \
        epoch_sequence(sizes, 9, 7, shuffle, samples_per_epoch=length)
    # ExactEpochs' plan of such an epoch still splits exactly that sequence
    plan = plan_epoch(sizes, PlanSettings(seed=9, samples_per_epoch=length, shuffle=shuffle), 3, 1, 1)
    assert samples(plan.split.sequence) == samples(epoch_sequence(sizes, 9, 3, shuffle, samples_per_epoch=length))


# ---------------------------------------------------------------- resume and elastic resume


@settings(max_examples=40, deadline=None)
@given(sources_st, st.data())
def test_a_resumed_epoch_is_the_uninterrupted_one_and_another_topology_gets_exactly_the_rest(sizes, data):
    """Oracle: the uninterrupted run's readers (same topology), and the multiset of what no
    reader yielded (another topology), as the docs state them."""
    s, _ = _settings(data, sizes)
    totals = [sum(x) for x in sizes]
    epoch = data.draw(st.integers(0, 4))
    windows = epoch_windows(s, totals, epoch)
    world, workers = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    try:
        plan = plan_mixture(sizes, s, epoch, windows, world, workers)
    except ValueError as error:  # an epoch of no whole batch: said, not planned
        assert "holds no samples" in str(error)
        return
    everything = [read(plan, r, w) for r in range(world) for w in range(workers)]
    batches = data.draw(st.integers(0, plan.split.rank_batches))
    per_worker = worker_batches(batches, plan.split.worker_sizes, s.batch_size)
    taken = tuple(min(n * s.batch_size, size) for n, size in zip(per_worker, plan.split.worker_sizes))
    for r in range(world):  # resumed on the same topology: each reader yields the rest of its order
        for w in range(workers):
            assert read(plan, r, w, taken[w]) == everything[r * workers + w][taken[w]:]
    yielded = Counter((k, shard, i) for r in range(world) for w in range(workers)
                      for k, shard, i, pad in everything[r * workers + w][: taken[w]] if not pad)
    planned = Counter((k, shard, i) for reader in everything for k, shard, i, pad in reader if not pad)
    unseen = planned - yielded
    new_world, new_workers = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    rest_plan = plan_mixture(sizes, s, epoch, windows, new_world, new_workers,
                             history=[Segment(world, workers, taken)])
    rest = Counter((k, shard, i) for r in range(new_world) for w in range(new_workers)
                   for k, shard, i, pad in read(rest_plan, r, w) if not pad)
    assert not rest - unseen  # nothing again, nothing from elsewhere
    assert sum((unseen - rest).values()) == rest_plan.split.dropped if s.mode == "drop" else not unseen - rest
    assert len({sum(-(-n // s.batch_size) for n in rest_plan.split.worker_sizes)}) == 1
