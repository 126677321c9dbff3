"""Node faults mid-epoch on a real local cluster: nothing lost, nothing repeated, honest errors.

Each test reads an epoch with 2 worker processes (DataLoader2 where torchdata has it), injects a fault after the first
samples (most shards are not opened yet, a few are mid-body), and checks what the
epoch delivered. The cluster is the module's own (``fault_cluster``): a dead node leaves
its map in 5-11 s there, which bounds how long these tests wait.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from ais_helpers import make_samples, write_shards
from stack import two_worker_loader

from aisio import AISSourceLister, ShardUploader
from aisio.client import get_client
from wds_datapipes import ShardOpenError

pytestmark = pytest.mark.timeout(240)  # a fault test that hangs fails instead

NUM_SHARDS, PER_SHARD = 16, 40


@pytest.fixture(autouse=True)
def all_nodes_up(fault_cluster):
    """Every test starts with every node running and in the cluster map."""
    for node in fault_cluster.nodes:
        if not fault_cluster.is_alive(node):
            fault_cluster.restart_node(node)
    assert fault_cluster.target_ports_in_map() == {n.port for n in fault_cluster.targets}
    yield


def _shards(cluster, tmp_path: Path, *, erasure_coded: bool, seed: int) -> tuple[str, list[dict]]:
    """16 shards in a fresh bucket (replicated on both targets when ``erasure_coded``); (spec, samples)."""
    name = f"faults-{uuid.uuid4().hex[:8]}"
    bucket = get_client().bucket(name).create()
    if erasure_coded:
        # Replication mode: a whole copy of every object on each of the two targets.
        ec = {"enabled": True, "objsize_limit": -1, "data_slices": 1, "parity_slices": 1}
        bucket.make_request("PATCH", "set-bprops", value={"ec": ec})
    samples = make_samples(NUM_SHARDS * PER_SHARD, seed=seed)
    paths = write_shards(tmp_path, samples, per_shard=PER_SHARD, post=ShardUploader(f"ais://{name}/"))
    assert len(paths) == NUM_SHARDS
    if erasure_coded:
        _wait_for_copies(cluster, name, [Path(p).name for p in paths])
    return f"ais://{name}/train-", samples


def _wait_for_copies(cluster, bucket: str, names: list[str], timeout: float = 60.0) -> None:
    """Wait until both targets hold each object (EC replicates after the PUT returns).

    AIStore's on-disk layout keeps an object's data under ``<mountpath>/@ais/<bucket>/%ob/``
    on every target that has a copy.
    """
    mp = Path(cluster.run_dir) / "mp"
    deadline = time.monotonic() + timeout
    while True:
        copies = {n: len(list(mp.glob(f"*/*/@ais/{bucket}/%ob/{n}"))) for n in names}
        if all(count >= 2 for count in copies.values()):
            return
        assert time.monotonic() < deadline, f"EC copies not made in {timeout:.0f} s: {copies}"
        time.sleep(0.2)


def _read_epoch(spec: str, fault: Callable[[], None], log: Path, after: int = 20,
                raised: list[float] | None = None) -> tuple[list[dict], float]:
    """The samples of one epoch read with 2 workers; after ``after`` samples, ``fault()`` runs
    in a thread while reading goes on. Also returns the seconds the epoch lasted after the
    fault began. The readers' warnings (what they retried) go to ``log``: the workers are
    forked, so they inherit the handler. When the epoch fails, the time the error reached
    the loop (before the loader shuts down) is appended to ``raised``."""
    handler = logging.FileHandler(log)
    handler.setFormatter(logging.Formatter("%(created).3f %(message)s"))  # wall time, for _last_byte_seen
    logging.getLogger("aisio").addHandler(handler)
    dp = AISSourceLister(spec, shuffle=True).load_tar().group_by_key()
    got: list[dict] = []
    faulted, failures = None, []

    def run_fault():
        try:
            fault()
        except BaseException as exn:  # noqa: BLE001 - reported below, in the test's thread
            failures.append(exn)

    injector = threading.Thread(target=run_fault, daemon=True)
    try:
        with two_worker_loader(dp) as loader:
            try:
                for sample in loader:
                    got.append(sample)
                    if len(got) == after:
                        faulted = time.monotonic()
                        injector.start()
            except Exception:
                if raised is not None:
                    raised.append(time.monotonic())
                raise
    finally:
        logging.getLogger("aisio").removeHandler(handler)
        handler.close()
        if injector.is_alive() or faulted is not None:
            injector.join(timeout=120)
    assert faulted is not None, f"the epoch ended after {len(got)} samples, before the fault"
    assert not failures, f"the fault itself failed: {failures[0]!r}"
    return got, time.monotonic() - faulted


def _last_byte_seen(log: Path) -> float:
    """When (wall time) the last byte reached a reader whose stream then went quiet, from the
    readers' warnings: one logged at T that saw "no data ... for S s" got its last byte at T - S."""
    last = 0.0
    for line in log.read_text().splitlines():
        match = re.match(r"(\d+\.\d+) .*no data from \S+ for (\d+(?:\.\d+)?) s", line)
        if match:
            last = max(last, float(match.group(1)) - float(match.group(2)))
    return last


def _assert_each_sample_once(got: list[dict], samples: list[dict]) -> None:
    keys = [s["__key__"] for s in got]
    assert len(keys) == len(set(keys)), "a sample came twice"
    missing = {s["__key__"] for s in samples} - set(keys)
    assert not missing, f"{len(missing)} of {len(samples)} samples never came"
    by_key = {s["__key__"]: s for s in samples}
    for sample in got:
        assert {k: v for k, v in sample.items() if k != "__url__"} == by_key[sample["__key__"]]


def test_sigkill_of_a_target_mid_epoch_on_an_erasure_coded_bucket_loses_and_repeats_nothing(
        fault_cluster, tmp_path, capsys):
    spec, samples = _shards(fault_cluster, tmp_path, erasure_coded=True, seed=11)
    victim = fault_cluster.targets[0]
    log = tmp_path / "readers.log"
    got, after_fault = _read_epoch(spec, lambda: fault_cluster.signal_node(victim, signal.SIGKILL), log)
    _assert_each_sample_once(got, samples)
    # The readers met the dead target, by its id and URL, and kept trying.
    said = log.read_text()
    assert f"at {victim.url}" in said and "trying again" in said, f"the readers' warnings:\n{said[-3000:]}"
    # The reader waited for the cluster to route around the dead target (its map dropped
    # it), rather than never meeting the fault.
    in_map = fault_cluster.target_ports_in_map()
    assert in_map == {n.port for n in fault_cluster.targets if n is not victim}, \
        f"targets in the map {sorted(in_map)}, victim {victim.port}, {after_fault:.1f} s after the kill"
    assert after_fault > 3, f"the epoch ended {after_fault:.1f} s after the kill: did it meet the fault?"
    with capsys.disabled():
        print(f"\n  [faults] SIGKILL of a target: the epoch completed {after_fault:.1f} s after the kill")


def test_a_target_stopped_with_sigterm_and_restarted_mid_epoch_loses_and_repeats_nothing(
        fault_cluster, tmp_path, capsys):
    spec, samples = _shards(fault_cluster, tmp_path, erasure_coded=False, seed=12)
    victim = fault_cluster.targets[1]

    def restart():
        fault_cluster.signal_node(victim, signal.SIGTERM)
        time.sleep(1.0)  # reads meanwhile find the target gone: refused, or "does not exist"
        fault_cluster.restart_node(victim)

    log = tmp_path / "readers.log"
    got, after_fault = _read_epoch(spec, restart, log)
    _assert_each_sample_once(got, samples)
    # "does not exist" while the target was out of the map was retried, not reported.
    assert "does not exist (the cluster map is changing" in log.read_text()
    # The shards on the stopped target could only be read once it was back.
    assert after_fault > 1.0, f"the epoch ended {after_fault:.1f} s after the SIGTERM: did it meet the fault?"
    with capsys.disabled():
        print(f"\n  [faults] SIGTERM + restart of a target: the epoch completed {after_fault:.1f} s after")


def test_a_stopped_cluster_fails_the_epoch_within_the_budget_naming_the_cluster_and_the_tries(
        fault_cluster, tmp_path, monkeypatch, capsys):
    spec, _ = _shards(fault_cluster, tmp_path, erasure_coded=False, seed=13)
    budget = 4.0
    monkeypatch.setenv("AISIO_RETRY_BUDGET", str(budget))  # the workers inherit it
    stopped_at = stopped_wall = None

    def stop_all():
        nonlocal stopped_at, stopped_wall
        stopped_at, stopped_wall = time.monotonic(), time.time()
        for node in fault_cluster.nodes:
            fault_cluster.signal_node(node, signal.SIGSTOP)

    raised: list[float] = []
    try:
        with pytest.raises(ShardOpenError) as info:
            _read_epoch(spec, stop_all, tmp_path / "readers.log", raised=raised)
        elapsed = time.monotonic() - stopped_at
    finally:
        for node in fault_cluster.nodes:
            fault_cluster.signal_node(node, signal.SIGCONT)
    message = str(info.value)
    assert f"no usable answer from the cluster at {fault_cluster.endpoint}" in message, message
    assert f"retry budget {budget:g} s" in message and "timed out" in message, message
    # The budget runs from a reader's last byte, and a reader the main process did not ask
    # for a while can still drain bytes its socket took before the stop (seen: 4.3 s after
    # it, 1 run in ~30), so the bound counts from the last byte any reader got. DataLoader2
    # shuts the loader down before it raises a worker's error; that must not wait for the
    # other worker's own retry (it did, before the shutdown grace).
    error_after = raised[0] - stopped_at
    last_byte = max(_last_byte_seen(tmp_path / "readers.log") - stopped_wall, 0.0)
    assert last_byte < budget + 1, f"a reader got bytes {last_byte:.1f} s after the cluster stopped"
    assert error_after - last_byte < budget + 3, (
        f"the error came {error_after:.1f} s after the cluster stopped, {error_after - last_byte:.1f} s after "
        f"the last byte a reader got")
    assert elapsed - last_byte < budget + 4, f"the loader shut down {elapsed:.1f} s after the cluster stopped"
    deadline = time.monotonic() + 60
    while not fault_cluster.healthy():  # resumed: it serves again
        assert time.monotonic() < deadline, "the cluster did not recover from SIGSTOP/SIGCONT"
        time.sleep(0.2)
    with capsys.disabled():
        print(f"\n  [faults] cluster stopped: the epoch failed {error_after:.1f} s later, the loader was shut "
              f"down after {elapsed:.1f} s (budget {budget:g} s): "
              + message.split("\n")[-3])
