"""RandomMix: weighted random draws from several pipes, seeded by epoch, worker and rank (not exact)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils.data.datapipes.iter import IterableWrapper

import wds_datapipes as wd


def _pipes(a: int = 600, b: int = 300) -> dict:
    return {"a": IterableWrapper([{"k": f"a{i}"} for i in range(a)]),
            "b": IterableWrapper([{"k": f"b{i}"} for i in range(b)])}


def _keys(dp) -> list[str]:
    return [item["k"] for item in dp]


def test_draws_follow_the_weights_and_say_the_source():
    items = list(wd.RandomMix(_pipes(), weights={"a": 3, "b": 1}, seed=0, stop="all_exhausted"))
    assert len(items) == 900 and all(i["__source__"] == i["k"][0] for i in items)
    first = Counter(i["__source__"] for i in items[:400])
    assert 250 < first["a"] < 350  # 3:1 on average, not exactly


def test_first_exhausted_stops_at_the_first_pipe_that_runs_out():
    items = list(wd.RandomMix(_pipes(600, 30), weights=[1, 1], seed=0))
    assert Counter(i["__source__"] for i in items)["b"] == 30 and len(items) < 200


def test_draws_repeat_with_the_seed_and_change_every_epoch():
    dp = wd.RandomMix(_pipes(), seed=5)
    epoch0 = _keys(dp)
    assert _keys(wd.RandomMix(_pipes(), seed=5)) == epoch0
    assert _keys(dp) != epoch0  # the next epoch
    dp.set_epoch(0)
    assert _keys(dp) == epoch0


def test_workers_draw_differently_under_a_dataloader():
    dp = wd.RandomMix({"a": IterableWrapper(range(400)), "b": IterableWrapper(range(1000, 1400))}, seed=1)
    loader = torch.utils.data.DataLoader(dp, batch_size=None, num_workers=2,
                                         generator=torch.Generator().manual_seed(0))
    items = [int(x) for x in loader]
    worker0, worker1 = items[0::2][:50], items[1::2][:50]  # the loader alternates workers
    assert [x >= 1000 for x in worker0] != [x >= 1000 for x in worker1]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"weights": {"c": 1.0}}, r"not in the mix: \['c'\]"),
    ({"weights": [0.0, 0.0]}, "not all 0"),
    ({"weights": [-1.0, 1.0]}, ">= 0"),
    ({"stop": "never"}, "stop must be one of"),
])
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        wd.RandomMix(_pipes(), **kwargs)
