"""The mixture plan on sizes and weights alone: counts, windows, the orders of sources, readers, resume."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wds_datapipes.epochs.mixture import (
    MixSettings,
    Window,
    epoch_counts,
    epoch_windows,
    next_cursor,
    plan_mixture,
)
from wds_datapipes.epochs.orders import PerSourceOrder, RandomOrder, StratifiedOrder, apportion
from wds_datapipes.epochs.plan import Segment
from wds_datapipes.epochs.stream import Cursor

sizes_st = st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=6), min_size=1, max_size=4)


def _mix(names, **kw) -> MixSettings:
    return MixSettings(names=tuple(names), **kw)


def _layout(order) -> np.ndarray:
    return np.concatenate(list(order.runs(0))) if order.length else np.zeros(0, dtype=np.int32)


# ---------------------------------------------------------------- counts


@given(st.integers(0, 10**6), st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=8))
def test_apportion_gives_every_share_its_quota_floor_or_ceiling(total, weights):
    if not any(weights):
        return
    counts = apportion(total, weights)
    assert sum(counts) == total
    whole = sum(Fraction(w) for w in weights)
    for count, weight in zip(counts, weights):
        quota = total * Fraction(weight) / whole
        assert quota - 1 < count < quota + 1


def test_samples_per_epoch_is_shared_by_the_weights_exactly():
    s = _mix("abc", weights=(0.5, 0.3, 0.2), samples_per_epoch=1000)
    assert epoch_counts(s, [10, 10, 10]) == [500, 300, 200]
    s = _mix("ab", weights=(1, 2), samples_per_epoch=10)
    assert epoch_counts(s, [5, 5]) == [3, 7]  # 3.33 and 6.67: the larger remainder gets the one left
    assert epoch_counts(_mix("ab", samples_per_epoch=9), [100, 200]) == [3, 6]  # no weights: by size


def test_stop_rules_end_the_epoch_when_the_first_or_every_source_has_given_all():
    first = _mix("ab", weights=(0.5, 0.5), stop="first_exhausted")
    assert epoch_counts(first, [100, 30]) == [30, 30]
    every = _mix("ab", weights=(0.5, 0.5), stop="all_exhausted")
    assert epoch_counts(every, [100, 30]) == [100, 100]
    tilted = _mix("ab", weights=(0.7, 0.3), stop="first_exhausted")
    counts = epoch_counts(tilted, [1000, 100])
    assert counts[1] <= 100 and counts[0] <= 1000 and abs(counts[0] / sum(counts) - 0.7) < 0.01


def test_repeat_and_choose_set_each_source_s_count():
    s = _mix("abc", repeat=(0.5, 3.0, None), choose=(None, None, 7))
    assert epoch_counts(s, [11, 4, 100]) == [6, 12, 7]
    assert epoch_counts(_mix("ab"), [11, 4]) == [11, 4]  # each once


@pytest.mark.parametrize("kwargs, message", [
    ({"weights": (-1.0, 1.0), "samples_per_epoch": 5}, "finite and >= 0"),
    ({"weights": (0.0, 0.0), "samples_per_epoch": 5}, "all weights are 0"),
    ({"weights": (1.0, 1.0)}, "need a stop rule"),
    ({"weights": (1.0, 1.0), "repeat": (2.0, None), "samples_per_epoch": 4}, "not both"),
    ({"repeat": (2.0, None), "samples_per_epoch": 4}, "one or the other"),
    ({"stop": "cycle"}, "needs samples_per_epoch"),
    ({"weights": (1.0, 1.0), "stop": "sometimes"}, "need a stop rule"),
    ({"batching": "zipped"}, "batching must be one of"),
])
def test_bad_settings_are_refused_with_the_reason(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _mix("ab", **kwargs)


def test_two_sources_with_one_name_are_refused():
    with pytest.raises(ValueError, match="same name.*'web'"):
        _mix(["web", "books", "web"])


def test_a_positive_weight_on_an_empty_source_is_refused():
    with pytest.raises(ValueError, match=r"\['b'\] have a positive weight and no samples"):
        epoch_counts(_mix("ab", weights=(1.0, 1.0), samples_per_epoch=10), [5, 0])


# ---------------------------------------------------------------- windows


def test_windows_walk_on_through_passes_and_all_exhausted_starts_each_epoch_at_a_pass():
    s = _mix("ab", repeat=(0.5, 3.0))
    assert [epoch_windows(s, [10, 4], e) for e in range(3)] == [
        [Window(0, 5), Window(0, 12)], [Window(5, 5), Window(12, 12)], [Window(10, 5), Window(24, 12)]]
    every = _mix("ab", weights=(0.5, 0.5), stop="all_exhausted")
    windows = [epoch_windows(every, [10, 4], e) for e in range(2)]
    assert windows == [[Window(0, 10), Window(0, 10)], [Window(10, 10), Window(12, 10)]]  # 12: pass 3 of b
    assert next_cursor(Window(0, 10), 4, "all_exhausted") == Cursor(3)
    # An anchor: where the sources stood at epoch 5 (after other weights), then the counts of these settings.
    # Source a from 3: 3..7, then 8, 9 and its pass's first 3 again (pass 1 leaves those 3 out once).
    assert epoch_windows(s, [10, 4], 7, anchor=5, starts=[Cursor(0, 3), Cursor(0, 1)]) == [
        Window(10, 5, 0, 3), Window(24, 12, 0, 1)]


# ---------------------------------------------------------------- orders of sources


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3000), min_size=1, max_size=5), st.integers(0, 2**32), st.data())
def test_a_random_order_holds_the_counts_and_knows_every_prefix(counts, seed, data):
    order = RandomOrder(counts, (seed,), leaf=64)
    layout = _layout(order)
    assert np.bincount(layout, minlength=len(counts)).tolist() == counts
    for t in data.draw(st.lists(st.integers(0, sum(counts)), max_size=6)):
        assert order.counts_before(t).tolist() == np.bincount(layout[:t], minlength=len(counts)).tolist()
        assert np.array_equal(np.concatenate([np.zeros(0, np.int32), *order.runs(t)]), layout[t:])


def test_a_random_order_changes_with_its_key_and_repeats_with_it():
    a, b = _layout(RandomOrder([500, 300], (1,))), _layout(RandomOrder([500, 300], (2,)))
    assert not np.array_equal(a, b) and np.array_equal(a, _layout(RandomOrder([500, 300], (1,))))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 400), min_size=1, max_size=6), st.integers(1, 64), st.integers(0, 2**32))
def test_every_stratified_batch_holds_each_source_s_share_within_one_sample(counts, batch, seed):
    total = sum(counts) // batch * batch
    if total == 0:
        return
    counts = apportion(total, counts) if sum(counts) else counts
    order = StratifiedOrder(counts, batch, (seed,))
    layout = _layout(order)
    assert np.bincount(layout, minlength=len(counts)).tolist() == counts
    batches = total // batch
    for j in range(batches):
        held = np.bincount(layout[j * batch : (j + 1) * batch], minlength=len(counts))
        assert (np.abs(held - np.asarray(counts) / batches) < 1).all()
    for t in range(0, total + 1, max(1, total // 13)):
        assert order.counts_before(t).tolist() == np.bincount(layout[:t], minlength=len(counts)).tolist()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=5), st.integers(1, 16), st.integers(0, 2**32))
def test_per_source_batches_are_each_of_one_source(batches, batch, seed):
    counts = [n * batch for n in batches]
    order = PerSourceOrder(counts, batch, (seed,))
    layout = _layout(order)
    assert np.bincount(layout, minlength=len(counts)).tolist() == counts
    assert all(len(set(layout[j : j + batch].tolist())) == 1 for j in range(0, len(layout), batch))
    for t in range(0, len(layout) + 1, max(1, len(layout) // 11)):
        assert order.counts_before(t).tolist() == np.bincount(layout[:t], minlength=len(counts)).tolist()


# ---------------------------------------------------------------- the plan


def _read(plan, rank, worker, start=0):
    """What a reader yields, by the plan alone: (source, shard, sample, pad) per position."""
    reader = plan.reader(rank, worker)
    positions = [iter(_plan_order(reader.plans[k], reader.spans[k], int(reader.taken(start)[k])))
                 for k in range(len(reader.spans))]
    out = []
    for run in reader.sources(start):
        for k in run.tolist():
            out.append((k, *next(positions[k])))
    return out


def _plan_order(reader_plan, spans, start):
    shards, samples, pads = spans.locate(list(range(len(spans)))) if len(spans) else ([], [], [])
    for q in range(reader_plan.blocks):
        for p in reader_plan.block_positions(q):
            if q * reader_plan.block_size + reader_plan.block_positions(q).index(p) >= start:
                yield int(shards[p]), int(samples[p]), bool(pads[p])


def _settings(batching, mode="drop", **kw):
    return _mix(["a", "b", "c"], weights=(0.5, 0.3, 0.2), samples_per_epoch=kw.pop("spe", 600), batching=batching,
                mode=mode, batch_size=kw.pop("batch_size", 8), lanes=4, block=32, seed=kw.pop("seed", 3), **kw)


SIZES = [[37, 50, 13], [20, 41], [9]]


@pytest.mark.parametrize("batching", ["random", "stratified", "per_source"])
@pytest.mark.parametrize("mode", ["drop", "pad"])
def test_every_reader_of_every_rank_gets_its_share_and_ranks_equal_batches(batching, mode):
    s = _settings(batching, mode)
    windows = epoch_windows(s, [sum(x) for x in SIZES], 1)
    plan = plan_mixture(SIZES, s, 1, windows, world=3, workers=2)
    assert len({plan.split.rank_batches for _ in range(3)}) == 1
    got = [_read(plan, r, w) for r in range(3) for w in range(2)]
    flat = [x for reader in got for x in reader]
    assert len(flat) == 3 * plan.split.rank_samples
    per_source = Counter(k for k, *_ in flat if not _[-1])
    real = [len(seq.without_pads()) for seq in plan.sequences]
    assert [per_source[k] for k in range(3)] == real
    for k, sequence in enumerate(plan.sequences):  # exactly the planned samples, pads included
        shards, samples, pads = sequence.locate(list(range(len(sequence)))) if len(sequence) else ([], [], [])
        assert Counter((kk, shard, i, pad) for kk, shard, i, pad in flat if kk == k) == \
            Counter((k, int(a), int(b), bool(c)) for a, b, c in zip(shards, samples, pads))
    if mode == "drop":
        assert sum(real) + plan.split.dropped == 600
    else:
        assert sum(real) == 600 and sum(len(seq) for seq in plan.sequences) == 600 + plan.split.padded
    if batching != "random":
        for reader in got:
            for j in range(0, len(reader), 8):
                held = Counter(k for k, *_ in reader[j : j + 8])
                if batching == "per_source":
                    assert len(held) == 1
                else:
                    share = [len(seq) / len(flat) * 8 for seq in plan.sequences]
                    assert all(abs(held[k] - share[k]) < 1 for k in range(3))


def test_the_rest_of_an_epoch_on_another_topology_holds_exactly_what_no_reader_yielded():
    s = _settings("stratified")
    windows = epoch_windows(s, [sum(x) for x in SIZES], 0)
    old = plan_mixture(SIZES, s, 0, windows, world=2, workers=2)
    taken = (24, 16)
    yielded = [x for r in range(2) for w in range(2) for x in _read(old, r, w)[: taken[w]]]
    new = plan_mixture(SIZES, s, 0, windows, world=1, workers=3, history=[Segment(2, 2, taken)])
    rest = [x for w in range(3) for x in _read(new, 0, w)]
    everything = [x for r in range(2) for w in range(2) for x in _read(old, r, w)]
    assert Counter((k, shard, i) for k, shard, i, _ in yielded + rest) == \
        Counter((k, shard, i) for k, shard, i, _ in everything)


def test_a_reader_resumed_at_any_position_yields_the_rest_of_its_order():
    s = _settings("random")
    plan = plan_mixture(SIZES, s, 2, epoch_windows(s, [sum(x) for x in SIZES], 2), world=1, workers=2)
    whole = _read(plan, 0, 1)
    for start in (0, 1, 31, 150, len(whole)):
        assert _read(plan, 0, 1, start) == whole[start:]


def test_a_source_of_weight_zero_gives_nothing_and_plans_repeat_with_the_seed():
    s = _mix("ab", weights=(1.0, 0.0), samples_per_epoch=50, batch_size=5, lanes=2, block=8)
    plan = plan_mixture([[30], [30]], s, 0, epoch_windows(s, [30, 30], 0), 1, 1)
    assert [len(q) for q in plan.sequences] == [50, 0]
    assert _read(plan, 0, 0) == _read(plan_mixture([[30], [30]], s, 0, epoch_windows(s, [30, 30], 0), 1, 1), 0, 0)
    other = plan_mixture([[30], [30]], s, 1, epoch_windows(s, [30, 30], 1), 1, 1)
    assert _read(plan, 0, 0) != _read(other, 0, 0)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 30), st.integers(0, 30), st.booleans()), max_size=8),
       st.lists(st.tuples(st.integers(-3, 200), st.integers(-3, 200)), max_size=8))
def test_taking_runs_of_spans_is_slicing_each_and_joining(spans, runs):
    from wds_datapipes.epochs.spans import SpanList

    spans = SpanList([s[0] for s in spans], [min(s[1], s[2]) for s in spans], [max(s[1], s[2]) for s in spans],
                     [s[3] for s in spans])
    runs = [(min(a, b), max(a, b)) for a, b in runs]
    assert spans.take(runs) == SpanList.join([spans.slice(a, b) for a, b in runs])


def test_a_small_source_s_stratified_extras_are_spread_over_the_epoch_not_bunched():
    counts = [6400 - 50 * 7, 50, 50, 50, 50, 50, 50, 50]  # seven sources of under one sample a batch
    order = StratifiedOrder(counts, 64, (9,))
    layout = _layout(order).reshape(-1, 64)  # 100 batches
    for source in range(1, 8):
        batches = np.flatnonzero((layout == source).any(axis=1))
        assert len(batches) == 50 and np.diff(batches).max() <= 3  # about every other batch,
        assert batches[0] <= 3 and batches[-1] >= 96  # from the start of the epoch to its end


@given(st.integers(0, 300), st.integers(1, 60), st.integers(0, 100), st.integers(0, 200))
def test_the_floor_sum_is_the_sum(n, m, a, b):
    from wds_datapipes.epochs.orders import _floor_sum

    assert _floor_sum(n, m, a, b) == sum((a * i + b) // m for i in range(n))


def test_an_unknown_batching_is_an_error_not_per_source():
    from wds_datapipes.epochs.orders import arrangement

    with pytest.raises(ValueError, match="not 'strata'"):
        arrangement("strata", [4, 4], 4, (0,))
