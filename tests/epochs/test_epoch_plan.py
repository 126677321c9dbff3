"""The epoch plan's rules, checked on shard sizes alone (no shards, no loaders)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wds_datapipes.epochs.plan import (
    PlanSettings,
    ReaderPlan,
    Segment,
    plan_epoch,
    rank_batches,
    split_epoch,
    worker_batches,
    worker_sizes,
)
from wds_datapipes.epochs.spans import SpanList

sizes_st = st.lists(st.integers(0, 60), min_size=1, max_size=9)
topology_st = st.tuples(st.integers(1, 4), st.integers(1, 4))  # world, workers
batch_st = st.integers(1, 9)


def _samples(spans: SpanList) -> list[tuple[int, int, bool]]:
    return [(s.shard, i, s.pad) for s in spans for i in range(s.start, s.stop)]


def _reader_output(plan, rank: int, worker: int) -> list[tuple[int, int, bool]]:
    """The samples one reader yields, in its order."""
    reader = plan.reader(rank, worker)
    share = _samples(plan.reader_spans(rank, worker))
    order = [p for q in range(reader.blocks) for p in reader.block_positions(q)] if reader.length else []
    return [share[p] for p in order]


def _all_samples(sizes) -> list[tuple[int, int]]:
    return [(shard, i) for shard, n in enumerate(sizes) for i in range(n)]


@settings(max_examples=150, deadline=None)
@given(sizes_st, topology_st, batch_st, st.integers(0, 5), st.booleans())
def test_drop_mode_reads_every_sample_at_most_once_and_ranks_get_equal_batches(sizes, topology, batch, epoch, shuffle):
    world, workers = topology
    plan_settings = PlanSettings(seed=3, batch_size=batch, mode="drop", shuffle=shuffle, lanes=3, block=6)
    plan = plan_epoch(sizes, plan_settings, epoch, world, workers)
    outputs = {(r, w): _reader_output(plan, r, w) for r in range(world) for w in range(workers)}
    read = [(shard, i) for out in outputs.values() for shard, i, _ in out]
    assert len(read) == len(set(read))
    assert len(read) == sum(sizes) - sum(sizes) % world
    assert plan.split.dropped == sum(sizes) % world
    batches = [sum(-(-len(outputs[r, w]) // batch) for w in range(workers)) for r in range(world)]
    assert len(set(batches)) == 1
    assert batches[0] == rank_batches(sizes, plan_settings, world, workers)


@settings(max_examples=150, deadline=None)
@given(sizes_st.filter(lambda s: sum(s) > 0), topology_st, batch_st, st.booleans())
def test_pad_mode_reads_every_sample_at_least_once_and_flags_the_repeats(sizes, topology, batch, shuffle):
    world, workers = topology
    plan = plan_epoch(sizes, PlanSettings(seed=1, batch_size=batch, mode="pad", shuffle=shuffle, lanes=2, block=4),
                      0, world, workers)
    read = [s for r in range(world) for w in range(workers) for s in _reader_output(plan, r, w)]
    originals = [(shard, i) for shard, i, pad in read if not pad]
    assert sorted(originals) == _all_samples(sizes)
    pads = [(shard, i) for shard, i, pad in read if pad]
    assert len(pads) == plan.split.padded == -(-sum(sizes) // world) * world - sum(sizes)
    assert set(pads) <= set(originals)
    assert len(read) == world * plan.split.rank_samples


@given(st.integers(0, 500), st.integers(1, 6), batch_st)
def test_worker_shares_are_whole_batches_at_most_one_batch_apart(rank_samples, workers, batch):
    sizes = worker_sizes(rank_samples, workers, batch)
    assert sum(sizes) == rank_samples
    batches = [-(-n // batch) for n in sizes]
    assert max(batches) - min(batches) <= 1
    assert sum(n % batch != 0 for n in sizes) <= 1
    # the one short batch is the rank's last in round-robin order
    order = [w for r in range(max(batches, default=0)) for w in range(workers) if r < batches[w]]
    short = [w for w, n in enumerate(sizes) if n % batch]
    if short:
        assert order[-1] == short[0]


@given(st.integers(0, 300), st.integers(1, 5), batch_st, st.data())
def test_worker_batches_follow_the_loaders_round_robin(rank_samples, workers, batch, data):
    sizes = worker_sizes(rank_samples, workers, batch)
    per_worker = [-(-n // batch) for n in sizes]
    order = [w for r in range(max(per_worker, default=0)) for w in range(workers) if r < per_worker[w]]
    taken = data.draw(st.integers(0, len(order)))
    assert worker_batches(taken, sizes, batch) == [order[:taken].count(w) for w in range(workers)]
    with pytest.raises(ValueError, match="only"):
        worker_batches(len(order) + 1, sizes, batch)


@given(st.integers(0, 200), st.integers(1, 7), st.integers(1, 40), st.booleans(), st.data())
def test_a_reader_yields_its_share_once_and_knows_what_is_left_at_any_point(length, lanes, block, shuffle, data):
    block = max(block, lanes)
    reader = ReaderPlan.build(length, lanes, block, (7, 1, 0, 0, 0), shuffle)
    order = [p for q in range(reader.blocks) for p in reader.block_positions(q)] if length else []
    assert sorted(order) == list(range(length))
    position = data.draw(st.integers(0, length))
    left = [p for start, stop in reader.unread_runs(position) for p in range(start, stop)]
    assert sorted(left) == sorted(order[position:])
    assert left == sorted(left)


@settings(max_examples=100, deadline=None)
@given(sizes_st, topology_st, topology_st, batch_st, st.booleans(), st.data())
def test_a_topology_change_mid_epoch_reads_exactly_the_samples_not_yet_seen(sizes, old, new, batch, shuffle, data):
    plan_settings = PlanSettings(seed=5, batch_size=batch, mode="drop", shuffle=shuffle, lanes=2, block=4)
    first = plan_epoch(sizes, plan_settings, 2, *old)
    taken = tuple(data.draw(st.integers(0, n)) for n in first.split.worker_sizes)
    seen = [s for r in range(old[0]) for w in range(old[1]) for s in _reader_output(first, r, w)[: taken[w]]]
    second = plan_epoch(sizes, plan_settings, 2, *new, history=[Segment(*old, taken)])
    rest = [s for r in range(new[0]) for w in range(new[1]) for s in _reader_output(second, r, w)]
    unseen = len(first.split.sequence) - len(seen)
    assert len(rest) == unseen - unseen % new[0]  # drop mode: what does not divide evenly is left out
    assert not set(seen) & set(rest)
    assert len(set(seen) | set(rest)) == len(seen) + len(rest)
    batches = [sum(-(-len(_reader_output(second, r, w)) // batch) for w in range(new[1])) for r in range(new[0])]
    assert len(set(batches)) == 1


def test_shuffled_orders_change_every_epoch_and_repeat_with_the_seed():
    sizes = [50, 20, 70, 5, 33]
    plan_settings = PlanSettings(seed=11, batch_size=4, lanes=4, block=16)

    def order(epoch, seed_settings=plan_settings):
        return _reader_output(plan_epoch(sizes, seed_settings, epoch, 1, 1), 0, 0)

    assert order(0) == order(0)
    assert order(0) != order(1)
    assert sorted(order(0)) == sorted(order(1))
    assert order(0) != order(0, PlanSettings(seed=12, batch_size=4, lanes=4, block=16))


def test_without_shuffling_the_readers_read_the_dataset_in_order():
    sizes = [5, 3, 4]
    plan = plan_epoch(sizes, PlanSettings(batch_size=2, shuffle=False), 3, 2, 2)
    read = [s[:2] for r in range(2) for w in range(2) for s in _reader_output(plan, r, w)]
    assert read == _all_samples(sizes)


def test_seven_uneven_shards_spread_evenly_over_four_readers():
    sizes = [100, 30, 71, 5, 90, 47, 50]  # 393 samples
    plan = plan_epoch(sizes, PlanSettings(seed=0, batch_size=8), 0, 2, 2)
    assert plan.split.rank_samples == 196 and plan.split.dropped == 1
    assert plan.split.worker_sizes == (100, 96)
    starts_mid_shard = [s.start > 0 for r in range(2) for w in range(2) for s in plan.reader_spans(r, w)]
    assert any(starts_mid_shard)


def test_a_billion_samples_plan_without_per_sample_memory():
    sizes = [10_000] * 100_000
    plan = plan_epoch(sizes, PlanSettings(seed=1, batch_size=64), 3, 1, 1,
                      history=[Segment(1, 1, (123_456_789,))])
    assert len(plan.split.sequence) == 10**9 - 123_456_789
    assert plan.reader(0, 0).length == 10**9 - 123_456_789 - (10**9 - 123_456_789) % 1


def test_split_refuses_impossible_settings():
    with pytest.raises(ValueError, match="mode"):
        split_epoch(SpanList([0], [0], [5]), 1, 1, 1, mode="keep")
    with pytest.raises(ValueError, match="world"):
        split_epoch(SpanList([0], [0], [5]), 0, 1, 1)
    with pytest.raises(ValueError, match="lanes"):
        PlanSettings(lanes=8, block=4)


def test_the_plan_modules_need_no_torch():
    """The pure modules load with the package's __init__ files skipped, and import no torch."""
    root = Path(importlib.util.find_spec("wds_datapipes").origin).parent
    code = ("import sys, types\n"
            f"for name, path in [('wds_datapipes', {str(root)!r}), ('wds_datapipes.epochs', {str(root / 'epochs')!r})]:\n"
            "    sys.modules[name] = types.ModuleType(name)\n"
            "    sys.modules[name].__path__ = [path]\n"
            "import wds_datapipes.epochs.plan, wds_datapipes.epochs.spans, wds_datapipes.epochs.state\n"
            "import wds_datapipes.epochs.mixture, wds_datapipes.epochs.orders\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_counts_of_a_split_match_its_sequence():
    plan = plan_epoch([7, 9, 4], PlanSettings(seed=2, batch_size=3, mode="pad"), 1, 3, 2)
    counts = Counter(len(plan.reader_spans(r, w)) for r in range(3) for w in range(2))
    assert sum(n * c for n, c in counts.items()) == len(plan.split.sequence) == 3 * plan.split.rank_samples


@given(st.integers(0, 300), st.integers(1, 5), batch_st, st.data())
def test_next_worker_is_the_one_the_round_robin_takes_next(rank_samples, workers, batch, data):
    from wds_datapipes.epochs.plan import next_worker

    sizes = worker_sizes(rank_samples, workers, batch)
    per_worker = [-(-n // batch) for n in sizes]
    order = [w for r in range(max(per_worker, default=0)) for w in range(workers) if r < per_worker[w]]
    taken = data.draw(st.integers(0, max(len(order) - 1, 0)))
    if order:
        assert next_worker(taken, sizes, batch) == order[taken]


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 30), st.integers(0, 12), st.booleans()), max_size=12),
       st.data())
def test_locate_finds_each_position_where_iterating_the_spans_finds_it(parts, data):
    spans = SpanList([p[0] for p in parts], [p[1] for p in parts], [p[1] + p[2] for p in parts], [p[3] for p in parts])
    expected = _samples(spans)
    positions = data.draw(st.lists(st.integers(0, max(len(expected) - 1, 0)), max_size=20)) if expected else []
    shards, numbers, pads = spans.locate(positions)
    assert list(zip(shards.tolist(), numbers.tolist(), pads.tolist())) == [expected[p] for p in positions]
    ranges = spans.shard_ranges()
    assert set(ranges) == {shard for shard, _, _ in expected}
    for shard, (lo, hi) in ranges.items():
        numbers_in_shard = [n for s, n, _ in expected if s == shard]
        assert (lo, hi) == (min(numbers_in_shard), max(numbers_in_shard) + 1)
