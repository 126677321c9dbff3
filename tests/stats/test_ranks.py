"""Across ranks: two real gloo ranks (torch's env:// variables), one of them with slow data; the
gather names it the straggler on both ranks. And the rule, on rows made by hand."""

from __future__ import annotations

import json
import textwrap

import pytest
from server_process import free_port
from stats_data import start_ranks, write_shards

from wds_datapipes.stats import rank_stats

RANK = textwrap.dedent("""
    import datetime, json, os, sys, time
    import torch, torch.distributed as dist
    import wds_datapipes as wd

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    wd.stats.enable()

    def label(value):
        time.sleep(0.02 if rank == 1 else 0.0)  # rank 1's data: 20 ms a sample
        return int(value)

    dp = wd.ShardLister(sys.argv[2:]).load_tar().group_by_key().map_fields({"cls": label}).batch_samples(4)
    loader = torch.utils.data.DataLoader(dp, batch_size=None, num_workers=1, multiprocessing_context="fork")
    steps = 0
    for batch in wd.stats.watch(loader, gather_every=2):  # steps 1-2, then 3-4, gathered
        dist.all_reduce(torch.ones(1))  # the step's collective: a fast rank waits here for the slow one
        steps += 1
    snapshot = wd.stats.snapshot()
    ranks, d = snapshot.ranks, wd.stats.diagnose(snapshot)
    with open(sys.argv[1], "w") as out:
        json.dump({"steps": steps, "straggler": ranks.straggler, "named": d.straggler,
                   "stalls": [r.stall_per_batch for r in ranks.ranks], "report": wd.stats.report()}, out)
    dist.destroy_process_group()
""")


def test_the_straggler_of_two_gloo_ranks_is_named(tmp_path):
    """Oracle: the injected delay is on rank 1's data only (rank 0's steps wait for it in the
    all_reduce, so its own data wait stays low)."""
    paths = write_shards(tmp_path, 4, 8)  # each rank reads 2 shards: 4 batches of 4
    outs = [tmp_path / f"rank{rank}.json" for rank in range(2)]
    ranks = start_ranks(RANK, [[str(out), *paths] for out in outs])
    try:
        logs = [p.communicate(timeout=180)[0].decode() for p in ranks]
    finally:
        for p in ranks:
            p.kill()
    assert [p.returncode for p in ranks] == [0, 0], logs
    results = [json.loads(out.read_text()) for out in outs]
    for result in results:
        assert result["steps"] == 4 and result["straggler"] == 1 and result["named"] == 1, result
        assert result["stalls"][1] > 3 * result["stalls"][0] and "straggler: rank 1" in result["report"]


@pytest.mark.parametrize(("stalls", "straggler"), [
    ([0.001, 0.001, 0.002, 0.080], 3),  # one rank waits 80 ms a batch, the others 1-2 ms
    ([0.010, 0.012, 0.011, 0.013], None),  # an even spread names no one
    ([0.0, 0.0005], None),  # below a millisecond's difference: nothing to name
    ([0.050], None),  # one rank alone
])
def test_the_straggler_rule(stalls, straggler):
    """Oracle: the rule's own numbers (over 1.5 times the others' median, and 1 ms over it)."""
    rows = [[rank, 10, stall * 10, 1.0, 2.0] for rank, stall in enumerate(stalls)]
    result = rank_stats(rows)
    assert result.straggler == straggler
    assert (result.stall_min, result.stall_max) == pytest.approx((min(stalls), max(stalls)))
    assert [r.batches_per_s for r in result.ranks] == [5.0] * len(stalls)


def test_no_collective_runs_unless_a_gather_is_asked_for(tmp_path, monkeypatch):
    """A gloo process group of one rank in this process; every collective of torch.distributed
    wrapped to count its calls (the oracle). Stats on, a loop read through ``watch``: no call.
    With ``gather_every=2`` over 6 batches: 3 calls."""
    import datetime

    import torch.distributed as dist

    import wds_datapipes as wd

    calls = []
    names = ("all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce", "all_to_all", "barrier",
             "broadcast", "broadcast_object_list", "gather", "reduce", "reduce_scatter", "scatter")
    for name in names:
        real = getattr(dist, name)
        monkeypatch.setattr(dist, name, lambda *a, _real=real, _name=name, **k: (calls.append(_name), _real(*a, **k))[1])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    wd.stats.enable()
    try:
        paths = write_shards(tmp_path, 2, 12)
        dp = wd.ShardLister(paths).load_tar().group_by_key().batch_samples(4)
        assert sum(1 for _ in wd.stats.watch(dp)) == 6
        assert calls == [] and wd.stats.snapshot().ranks is None
        assert sum(1 for _ in wd.stats.watch(dp, gather_every=2)) == 6
        assert calls == ["all_gather"] * 3 and wd.stats.snapshot().ranks.straggler is None
    finally:
        wd.stats.disable()
        dist.destroy_process_group()


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="nccl needs a CUDA device (none on this machine)")
def test_the_gather_runs_over_nccl_on_the_cuda_device(tmp_path):
    """One rank of an nccl group on this machine's GPU: ``gather_every=2`` over 6 batches gathers 3
    times, its tensor on the CUDA device nccl needs (oracle: the tensors all_gather was handed)."""
    import datetime

    import torch
    import torch.distributed as dist

    import wds_datapipes as wd

    devices = []
    real = dist.all_gather

    def all_gather(rows, tensor, *args, **kwargs):
        devices.append(tensor.device.type)
        return real(rows, tensor, *args, **kwargs)

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    wd.stats.enable()
    try:
        dist.all_gather = all_gather
        paths = write_shards(tmp_path, 2, 12)
        dp = wd.ShardLister(paths).load_tar().group_by_key().batch_samples(4)
        assert sum(1 for _ in wd.stats.watch(dp, gather_every=2)) == 6
        ranks = wd.stats.snapshot().ranks
    finally:
        dist.all_gather = real
        wd.stats.disable()
        dist.destroy_process_group()
    assert devices == ["cuda"] * 3
    assert [r.rank for r in ranks.ranks] == [0] and ranks.ranks[0].steps == 2 and ranks.straggler is None
