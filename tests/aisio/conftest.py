"""A real AIStore cluster for the tests in this folder.

The session's cluster is ``ais_endpoint`` (tests/server_fixtures.py): with ``AIS_ENDPOINT``
set, the tests use that cluster. Otherwise the session starts the local cluster of
:mod:`aisio.cluster` (1 proxy + 2 targets on 127.0.0.1; building aisnode first if it is missing) and stops it at the end; one already started with
``python -m aisio.cluster start`` is used and left running, except under CI, where the session
always starts its own. Where no cluster can be had
the tests skip with the reason, except under CI (``CI`` set), where they fail instead.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest
from ais_helpers import make_samples, write_shards

from aisio.client import ENDPOINT_ENV, get_client
from aisio.cluster import FAST_FAILOVER, ClusterError, LocalCluster, ensure_aisnode

IN_CI = bool(os.environ.get("CI"))


def _no_cluster(reason: str):
    if IN_CI:
        pytest.fail(f"AIStore tests must run in CI: {reason}", pytrace=False)
    pytest.skip(reason)


# What the local cluster's nodes said around each failed test here, printed at the end of the
# run (CI shows its tail): the node logs go with the cluster when the session stops it.
_NODE_CLUES: list[str] = []


def _node_clues(nodeid: str, lines: int = 8) -> str:
    cluster = LocalCluster.load()
    given = os.environ.get(ENDPOINT_ENV, "").rstrip("/")
    if cluster is None or cluster.endpoint.rstrip("/") != given:
        return f"{nodeid}: the cluster at {given or '(none)'} is not a local one of aisio.cluster"
    disk = shutil.disk_usage(cluster.run_dir)
    out = [f"{nodeid}: disk {100 * disk.used / disk.total:.0f}% used, {disk.free / 2**30:.1f} GiB free"]
    for node in cluster.nodes:
        out.append(f"  {node.role} :{node.port} {'up' if cluster.is_alive(node) else 'NOT RUNNING'}")
        for log in sorted((Path(node.dir) / "log").glob("ais*.INFO")):
            text = log.read_text(errors="replace").splitlines()
            notable = [t for t in text if t[:2] in ("E ", "W ") or "dsort" in t or "srt-" in t]
            out.extend(f"    {t[:200]}" for t in notable[-lines:])
    return "\n".join(out)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and report.when == "call" and len(_NODE_CLUES) < 3:
        try:
            _NODE_CLUES.append(_node_clues(item.nodeid))
        except OSError as exn:
            _NODE_CLUES.append(f"{item.nodeid}: no clues from the nodes: {exn}")


def pytest_terminal_summary(terminalreporter):
    if _NODE_CLUES:
        terminalreporter.section("AIStore nodes at the first failures")
        for clue in _NODE_CLUES:
            terminalreporter.write_line(clue)


# ais_endpoint (the session's cluster) and the `ais` marker are in tests/server_fixtures.py,
# shared with the object-store tests (whose S3 server is this cluster's /s3).


@pytest.fixture
def own_cluster_env(tmp_path, monkeypatch):
    """A cache and run folder of the test's own (the real aisnode linked in, built first if
    missing), so that the clusters it starts and stops are never the session's or anyone's."""
    try:
        real = ensure_aisnode()
    except ClusterError as exn:
        _no_cluster(f"no aisnode binary: {exn}")
    cache = tmp_path / "cache"
    (cache / "bin").mkdir(parents=True)
    (cache / "bin" / "aisnode").symlink_to(real)
    monkeypatch.setenv("WDS_DATAPIPES_CACHE", str(cache))
    monkeypatch.setenv("AISIO_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.delenv(ENDPOINT_ENV, raising=False)
    return tmp_path


@pytest.fixture(scope="module")
def fault_cluster(tmp_path_factory):
    """A local cluster of the module's own, for tests that kill, stop and restart its nodes.

    It has its own cache and run folders (never the session's cluster, nor one given by
    AIS_ENDPOINT), and the primary drops a silent node within 5-11 s instead of 28-38 s
    (FAST_FAILOVER), so that fault tests take as long as the failover, not AIStore's
    defaults. ``$AIS_ENDPOINT`` points at it while the module runs.
    """
    try:
        real = ensure_aisnode()
    except ClusterError as exn:
        _no_cluster(f"no aisnode binary: {exn}")
    root = tmp_path_factory.mktemp("fault-cluster")
    (root / "cache" / "bin").mkdir(parents=True)
    (root / "cache" / "bin" / "aisnode").symlink_to(real)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WDS_DATAPIPES_CACHE", str(root / "cache"))
        mp.setenv("AISIO_RUN_DIR", str(root / "run"))
        mp.delenv(ENDPOINT_ENV, raising=False)
        try:
            cluster = LocalCluster.start(timeout=90, verbose=False, config=FAST_FAILOVER)
        except ClusterError as exn:
            _no_cluster(f"cannot start a local cluster for the fault tests: {exn}")
        try:
            mp.setenv(ENDPOINT_ENV, cluster.endpoint)
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture
def bucket(ais_endpoint):
    """A fresh, empty bucket (its name), deleted after the test."""
    name = f"test-{uuid.uuid4().hex[:10]}"
    bck = get_client().bucket(name).create(exist_ok=False)
    yield name
    bck.delete(missing_ok=True)


@pytest.fixture(scope="session")
def dataset(ais_endpoint, tmp_path_factory):
    """Six shards of 12 samples in a session bucket: (bucket name, local shard paths, samples)."""
    from aisio import ShardUploader

    name = f"data-{uuid.uuid4().hex[:10]}"
    local = tmp_path_factory.mktemp("shards")
    samples = make_samples(72, seed=1)
    uploader = ShardUploader(f"ais://{name}/", remove=False)
    paths = write_shards(local, samples, per_shard=12, post=uploader)
    yield name, paths, samples
    get_client().bucket(name).delete(missing_ok=True)
