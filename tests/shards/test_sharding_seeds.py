"""Shard order and split across workers and ranks, as the loaders set them up."""

from __future__ import annotations

import copy

from stack import needs_dataloader2
from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES
from torch.utils.data.graph_settings import apply_sharding

from wds_datapipes import ShardLister

URLS = [f"mem://shard-{i:03d}.tar" for i in range(12)]


def _full_order(lister: ShardLister) -> list[str]:
    """The shuffled order before the split (the ShardingFilter's source)."""
    return list(lister.sharded.source_datapipe)


@needs_dataloader2
def test_dataloader2_seeds_give_every_worker_the_same_shard_order() -> None:
    from torchdata.dataloader2.graph.settings import set_graph_random_seed
    from torchdata.dataloader2.random import SeedGenerator

    # DataLoader2 seeds each worker's copy of the graph from a generator spawned per
    # worker; pipes before the sharding point must get the seed shared by all of them.
    lister = ShardLister(URLS, shuffle=True)
    for epoch_seed in (7, 8):
        generator = SeedGenerator(epoch_seed)
        orders = []
        for worker in range(3):
            copy_in_worker = copy.deepcopy(lister)
            set_graph_random_seed(copy_in_worker, generator.spawn(worker))
            orders.append(_full_order(copy_in_worker))
        assert orders[0] == orders[1] == orders[2]
        assert sorted(orders[0]) == URLS and orders[0] != URLS


@needs_dataloader2
def test_dataloader2_seed_changes_the_shard_order() -> None:
    from torchdata.dataloader2.graph.settings import set_graph_random_seed
    from torchdata.dataloader2.random import SeedGenerator

    lister = ShardLister(URLS, shuffle=True)
    orders = []
    for seed in (1, 2):
        copy_in_worker = copy.deepcopy(lister)
        set_graph_random_seed(copy_in_worker, SeedGenerator(seed).spawn(0))
        orders.append(_full_order(copy_in_worker))
    assert orders[0] != orders[1]


def test_ranks_and_workers_read_disjoint_shards_covering_all_every_epoch() -> None:
    base = ShardLister(URLS, shuffle=True, seed=3)
    parts = {}
    for rank in range(2):
        for worker in range(3):
            dp = copy.deepcopy(base)
            apply_sharding(dp, 2, rank, SHARDING_PRIORITIES.DISTRIBUTED)
            apply_sharding(dp, 3, worker, SHARDING_PRIORITIES.MULTIPROCESSING)
            parts[rank, worker] = [list(dp), list(dp)]  # two epochs
    for epoch in range(2):
        shares = [set(p[epoch]) for p in parts.values()]
        assert sum(len(s) for s in shares) == len(URLS)
        assert set().union(*shares) == set(URLS)
        assert all(len(s) == 2 for s in shares)
    assert [p[0] for p in parts.values()] != [p[1] for p in parts.values()]  # reshuffled
