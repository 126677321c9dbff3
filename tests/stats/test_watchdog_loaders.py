"""The stall watchdog under every loader and across ranks: a shard whose body stops is named, with
its server, byte offset and the process that waits on it, from spawned workers, DataLoader2's
workers, a ``torchdata.nodes`` thread, and on the one rank of two whose data stalls (the other,
waiting in the step's collective, logs nothing)."""

from __future__ import annotations

import json
import os
import textwrap
import time

import pytest
from shard_server import StallingServer
from stack import needs_dataloader2
from stall_log import stuck_on
from stats_data import loader_named, start_ranks, write_shards

import wds_datapipes as wd

pytestmark = pytest.mark.timeout(180)

AT = 10_037  # the body bytes the server sends before it stops


def _spawned(dp):
    import torch

    return torch.utils.data.DataLoader(dp, batch_size=None, num_workers=1, multiprocessing_context="spawn")


@pytest.mark.parametrize("name", ["DataLoader, spawned worker", pytest.param("DataLoader2", marks=needs_dataloader2),
                                  "torchdata.nodes"])
def test_a_hung_read_is_named_under_each_loader(tmp_path, stats_on, stall_log, name):
    """Oracles: the server's own count of the bytes it sent before it stopped, its address, the
    loader's processes (a worker's pid is not this one's; a nodes thread is this process's),
    and every sample read in the end."""
    write_shards(tmp_path, 4, 12, size=3000)
    with StallingServer(str(tmp_path), "s-002.tar", at=AT) as server:
        stall_log.release_on(server.url("s-002.tar"), "reading", server.release)
        dp = wd.ShardLister(server.url("s-{000..003}.tar")).load_tar().group_by_key().batch_samples(4)
        loader = _spawned(dp) if name == "DataLoader, spawned worker" else loader_named(name, dp)
        try:
            keys = [key for batch in wd.stats.watch(loader, stall_s=1.5) for key in batch["__key__"]]
        finally:
            getattr(loader, "shutdown", lambda: None)()
    assert len(keys) == len(set(keys)) == 48 and server.stalling.is_set()
    warnings = [r for r in stall_log.warnings() if stuck_on(r, server.url("s-002.tar"))]
    assert len(warnings) == 1, [r.getMessage()[:300] for r in stall_log.records]
    (process, thread), = stuck_on(warnings[0], server.url("s-002.tar"))
    assert thread["shard"]["offset"] == server.sent_before_stall == AT
    assert thread["shard"]["host"] == f"127.0.0.1:{server.server_address[1]}"
    if name == "torchdata.nodes":  # the pipe runs in a thread of the training process
        assert process["pid"] == os.getpid() and process["worker"] == -1 and thread["thread"] != "MainThread"
    else:
        assert process["pid"] != os.getpid() and process["worker"] >= 0
    assert warnings[0].stall["silent"] == []


RANK = textwrap.dedent("""
    import datetime, json, logging, os, sys
    import torch, torch.distributed as dist
    import wds_datapipes as wd

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=90))
    wd.stats.enable(interval_s=0.2)
    stalls = []

    class Kept(logging.Handler):
        def emit(self, record):
            if hasattr(record, "stall"):
                stalls.append(record.stall)
                with open(sys.argv[1] + ".log", "a") as log:  # the test watches for it
                    log.write(record.getMessage() + "\\n")

    logging.getLogger("wds_datapipes.stats").addHandler(Kept())
    dp = wd.ShardLister(sys.argv[2]).load_tar().group_by_key().batch_samples(4)
    loader = torch.utils.data.DataLoader(dp, batch_size=None, num_workers=1, multiprocessing_context="fork")
    steps = 0
    for batch in wd.stats.watch(loader, stall_s=1.5):
        dist.all_reduce(torch.ones(1))  # the step's collective: the rank with data waits here for the other
        steps += 1
    with open(sys.argv[1], "w") as out:
        json.dump({"steps": steps, "stalls": stalls}, out)
    dist.destroy_process_group()
""")


def test_the_rank_whose_read_hangs_is_the_one_that_logs_it(tmp_path):
    """Two gloo ranks; rank 0 reads over HTTP and one of its shards stops, rank 1 reads local
    shards and then waits for rank 0 in each step's all_reduce (a long step, not a wait on data).
    Oracles: which rank the test made read the stalling server, the server's byte count, and
    the steps both ranks took."""
    local = write_shards(tmp_path / "local", 4, 12, size=3000, prefix="l")
    write_shards(tmp_path / "remote", 4, 12, size=3000)
    outs = [tmp_path / f"rank{rank}.json" for rank in range(2)]
    with StallingServer(str(tmp_path / "remote"), "s-002.tar", at=AT) as server:
        specs = [server.url("s-{000..003}.tar"), str(tmp_path / "local" / "l-{000..003}.tar")]
        ranks = start_ranks(RANK, [[str(out), spec] for out, spec in zip(outs, specs)])
        try:
            log = outs[0].with_name("rank0.json.log")
            deadline = time.monotonic() + 120
            while not (log.exists() and server.url("s-002.tar") in log.read_text()) and time.monotonic() < deadline:
                time.sleep(0.1)
            server.release.set()  # released once rank 0 said where it waits (or at the deadline: then it fails)
            logs = [p.communicate(timeout=120)[0].decode() for p in ranks]
        finally:
            for p in ranks:
                p.kill()
    assert [p.returncode for p in ranks] == [0, 0], logs
    results = [json.loads(out.read_text()) for out in outs]
    assert [r["steps"] for r in results] == [6, 6] and local  # each rank its half of 4 shards: s-000 and s-002 on 0
    assert results[1]["stalls"] == []  # rank 1 never waited on its loader: its steps were long
    assert len(results[0]["stalls"]) >= 1
    stall = results[0]["stalls"][0]
    assert {p["rank"] for p in stall["processes"]} == {0}
    stuck = [(p, t) for p in stall["processes"] for t in p["threads"]
             if t["shard"] and t["shard"]["url"] == server.url("s-002.tar") and t["shard"]["phase"] == "reading"]
    assert len(stuck) == 1 and stuck[0][0]["worker"] == 0 and stuck[0][1]["shard"]["offset"] == AT
