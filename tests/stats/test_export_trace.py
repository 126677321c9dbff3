"""The Chrome / Perfetto trace file: loaded as JSON (the Trace Event Format's fields), its events
per worker process checked against the loader's worker pids and a wall clock taken outside the
library."""

from __future__ import annotations

import collections
import json
import os
import threading
import time
from pathlib import Path

import torch
from stats_data import fork_loader, write_shards

import wds_datapipes as wd


class _Pids:
    """A DataLoader worker_init_fn that notes each worker's pid in a folder (picklable)."""

    def __init__(self, folder: str):
        self.folder = folder

    def __call__(self, worker: int) -> None:
        with open(os.path.join(self.folder, f"{worker}"), "w") as out:
            out.write(str(os.getpid()))


def test_each_worker_has_its_track_within_the_runs_wall_clock(tmp_path):
    """Oracles: the worker pids DataLoader's workers report themselves (worker_init_fn; on Linux
    a process's main thread has its pid as thread id), the
    training process's perf_counter_ns around the loop (CLOCK_MONOTONIC, the clock of every
    process), the shards opened (one each), the JSON format that chrome://tracing reads."""
    paths = write_shards(tmp_path / "data", 6, 20, size=2000)
    pids = tmp_path / "pids"
    pids.mkdir()
    trace = wd.stats.TraceFile(tmp_path / "run.trace.json", interval_s=0.1)
    wd.stats.enable(observer=trace)
    try:
        dp = wd.ShardLister(paths).load_tar().group_by_key().map_fields({"cls": int}).batch_samples(5)
        began = time.perf_counter_ns()
        batches, waits = _timed_loop(wd.stats.watch(fork_loader(dp, worker_init_fn=_Pids(str(pids)))))
        ended = time.perf_counter_ns()
        written = trace.write()
    finally:
        wd.stats.disable()
    assert sum(len(b["__key__"]) for b in batches) == 120
    data = json.loads(Path(written).read_text())
    events = data["traceEvents"]
    workers = {int(p.read_text()): int(p.name) for p in pids.iterdir()}
    spans = [e for e in events if e["ph"] == "X" and e["pid"] != os.getpid()]
    assert {e["pid"] for e in spans} == set(workers)
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {pid: f"rank 0 worker {worker} (pid {pid})" for pid, worker in workers.items()} | {
        os.getpid(): f"rank 0 training process (pid {os.getpid()})"}
    # The training process read no pipe: its track is the loop's waits, each inside the test's own
    # clock reads around that next() (microseconds in the file: a rounding's slack)
    loop = sorted((e for e in events if e["ph"] == "X" and e["pid"] == os.getpid()), key=lambda e: e["ts"])
    assert [e["name"] for e in loop] == ["wait"] * len(batches) and len(waits) == len(batches)
    for e, (t0, t1) in zip(loop, waits):
        assert t0 / 1000 - 1e-3 <= e["ts"] and e["ts"] + e["dur"] <= t1 / 1000 + 1e-3 and e["tid"] == e["pid"]
    for e in spans:
        assert e["cat"] == "wds_datapipes" and e["dur"] >= 0
        assert e["tid"] == e["pid"]  # a worker's pipes run in its main thread, whose Linux thread id is its pid
        assert began / 1000 <= e["ts"] and e["ts"] + e["dur"] <= ended / 1000 + 1e-3
    per_worker = collections.Counter((e["pid"], e["name"]) for e in spans)
    assert sum(per_worker[(pid, "open")] for pid in workers) == 6
    for pid in workers:
        assert {"list", "open", "read", "tar", "transform", "batch"} <= {name for p, name in per_worker if p == pid}
    opened = sorted(e["args"]["source"] for e in spans if e["name"] == "open")
    assert len(set(opened)) == 1  # one shard list: one source label


def _timed_loop(loop) -> tuple[list, list[tuple[int, int]]]:
    """The items of ``loop``, and the test's own perf_counter_ns before and after each next() that gave one."""
    items, waits = [], []
    while True:
        t0 = time.perf_counter_ns()
        try:
            item = next(loop)
        except StopIteration:
            return items, waits
        waits.append((t0, time.perf_counter_ns()))
        items.append(item)


def test_the_training_process_reading_its_pipes_has_a_track(tmp_path):
    """No loader workers: the spans are the training process's, every read inside the loop's
    wall clock (oracles: os.getpid() and the thread's own OS id, perf_counter_ns around it, the
    shards opened)."""
    paths = write_shards(tmp_path / "data", 2, 10, size=500)
    trace = wd.stats.TraceFile(tmp_path / "own.json")
    wd.stats.enable(observer=trace)
    try:
        began = time.perf_counter_ns()
        got = list(torch.utils.data.DataLoader(wd.ShardLister(paths).load_tar().group_by_key(), batch_size=None))
        ended = time.perf_counter_ns()
        events = json.loads(Path(trace.write()).read_text())["traceEvents"]
    finally:
        wd.stats.disable()
    assert len(got) == 20
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {os.getpid()}
    assert {e["tid"] for e in spans} == {threading.get_native_id()}  # the OS's id of the thread that read
    assert all(began / 1000 <= e["ts"] <= e["ts"] + e["dur"] <= ended / 1000 + 1e-3 for e in spans)
    assert sum(e["name"] == "open" for e in spans) == 2
    assert [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"] == [
        f"rank 0 training process (pid {os.getpid()})"]


def test_write_needs_the_run(tmp_path):
    """After disable() the parts are gone with the run folder: write says so instead of an empty file."""
    trace = wd.stats.TraceFile(tmp_path / "late.json")
    try:
        trace.write()
    except RuntimeError as exn:
        assert "disable()" in str(exn)
    else:
        raise AssertionError("write() with stats off made a file")
    assert not (tmp_path / "late.json").exists()


def test_several_observers_reach_spawned_workers_and_end_with_the_run(tmp_path):
    """observers(TraceFile, ProfilerRanges) pickled into a spawned worker: the trace holds that
    worker's intervals (oracle: the pid the worker reports itself, the shards opened); after
    disable() no trace thread of this process is left running (oracle: threading.enumerate)."""
    paths = write_shards(tmp_path / "data", 2, 10)
    pids = tmp_path / "pids"
    pids.mkdir()
    trace = wd.stats.TraceFile(tmp_path / "spawned.json", interval_s=0.05)
    wd.stats.enable(observer=wd.stats.observers(trace, wd.stats.ProfilerRanges()))
    try:
        loader = torch.utils.data.DataLoader(wd.ShardLister(paths).load_tar().group_by_key().batch_samples(5),
                                             batch_size=None, num_workers=1, multiprocessing_context="spawn",
                                             worker_init_fn=_Pids(str(pids)))
        assert sum(len(b["__key__"]) for b in loader) == 20
        list(wd.ShardLister(paths[:1]).load_tar())  # the training process too: a writer of its own
        events = json.loads(Path(trace.write()).read_text())["traceEvents"]
    finally:
        wd.stats.disable()
    [worker_pid] = [int(p.read_text()) for p in pids.iterdir()]
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {worker_pid, os.getpid()}
    assert sum(e["name"] == "open" and e["pid"] == worker_pid for e in spans) == 2
    deadline = time.monotonic() + 5
    while any(t.name == "wds-stats-trace" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [t for t in threading.enumerate() if t.name == "wds-stats-trace"]
