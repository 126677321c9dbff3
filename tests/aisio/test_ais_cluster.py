"""The local cluster: its installer, its start-up, its command line, and its failure report."""

from __future__ import annotations

import importlib.util
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from aisio import cluster as cl
from aisio.cluster import process

BANNER = "'datapipes', 'dataloader2' modules are deprecated"


def test_installer_falls_back_to_a_wrapper_module_build_when_go_install_fails(tmp_path, monkeypatch, caplog):
    fake_bin = tmp_path / "fakebin"
    fake_bin.mkdir()
    go = fake_bin / "go"
    # A fake Go: 'install' fails as the proxy's 403 makes it; 'build' checks the wrapper go.mod.
    go.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = install ]; then echo "go: loading deprecation: 403 Forbidden" >&2; exit 1; fi\n'
        'grep -q "require github.com/NVIDIA/aistore v1.5.0" go.mod || exit 3\n'
        'while [ "$1" != "-o" ]; do shift; done; echo built > "$2"\n'
    )
    go.chmod(go.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake_bin}:{os.environ['PATH']}")
    monkeypatch.setenv("WDS_DATAPIPES_CACHE", str(tmp_path / "cache"))
    caplog.set_level(logging.INFO, logger="aisio.cluster")
    binary = cl.ensure_aisnode()
    assert binary == tmp_path / "cache" / "bin" / "aisnode" and binary.read_text() == "built\n"
    assert "go install -tags dsort github.com/NVIDIA/aistore/cmd/aisnode@v1.5.0" in caplog.text
    assert "403 Forbidden" in caplog.text and "go build -mod=mod -tags dsort" in caplog.text
    assert os.access(binary, os.X_OK)
    go.write_text("#!/bin/sh\nexit 9\n")  # a Go that fails: must not be called again
    assert cl.ensure_aisnode() == binary  # present: nothing to build


def test_a_just_spawned_node_is_alive_although_proc_shows_no_aisnode_command_line(tmp_path):
    # Between exec and the new program's set-up /proc/PID/cmdline reads empty (measured:
    # 187 of 200 aisnode spawns); a check based on it called a starting proxy "exited".
    fake = tmp_path / "bin" / "aisnode"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    node_dir = tmp_path / "proxy0"
    node_dir.mkdir()
    cluster = cl.LocalCluster(endpoint="http://127.0.0.1:1", run_dir=str(tmp_path), binary=str(fake))
    node = cl.NodeState("proxy", 0, 1, str(node_dir))
    cluster.nodes.append(node)
    cluster._spawn(node)
    try:
        assert not process._is_our_aisnode(node.pid, cluster.run_dir)  # what /proc says
        assert cluster.is_alive(node)  # what the Popen says
    finally:
        os.kill(node.pid, 9)
        cluster._procs[node.pid].wait()
    assert not cluster.is_alive(node)


def test_start_succeeds_on_the_first_try_every_time_and_stop_leaves_nothing(own_cluster_env):
    for _ in range(2):
        cluster = cl.LocalCluster.start(timeout=60, verbose=False, attempts=1)
        try:
            assert cluster.is_up() and cl.LocalCluster.running() == cluster
            assert cluster.target_ports_in_map() == {n.port for n in cluster.targets}
        finally:
            cluster.stop()
        assert cl.LocalCluster.load() is None and not cluster.alive_nodes()
        assert not Path(cluster.run_dir).exists()
    # And once more through the command line, which must not print torchdata's banner.
    env = dict(os.environ)
    run = [sys.executable, "-m", "aisio.cluster"]
    started = subprocess.run([*run, "start"], capture_output=True, text=True, timeout=120, env=env, check=False)
    try:
        assert started.returncode == 0, started.stderr
        assert "AIS_ENDPOINT=http://127.0.0.1:" in started.stdout
        assert "attempt" not in started.stderr and BANNER not in started.stderr
        status = subprocess.run([*run, "status"], capture_output=True, text=True, timeout=60, env=env, check=False)
        assert status.returncode == 0 and status.stdout.count(" up") == 3 and BANNER not in status.stderr
    finally:
        stopped = subprocess.run([*run, "stop"], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert stopped.returncode == 0 and "stopped 3 node(s)" in stopped.stderr and BANNER not in stopped.stderr
    assert cl.LocalCluster.load() is None
    assert not any((own_cluster_env / "run").iterdir())


def test_a_failed_start_reports_the_node_logs_and_leaves_nothing_running(own_cluster_env, caplog):
    broken = {"timeout": {"cplane_operation": "1ms"}}  # below aisnode's minimum
    with pytest.raises(cl.NodeExitedError, match="exited during start-up") as info:
        cl.LocalCluster.start(timeout=30, verbose=False, config=broken)
    assert "cplane_operation" in info.value.logs and not info.value.port_taken
    assert "---- proxy pid" in caplog.text and "cplane_operation" in caplog.text
    assert "trying again" not in caplog.text  # a config error gets no second try
    assert cl.LocalCluster.load() is None
    assert not any((own_cluster_env / "run").iterdir())


def test_status_command_reports_the_running_cluster_without_torchdata_banner(ais_endpoint):
    if cl.LocalCluster.running() is None:
        pytest.skip("the tests run against a cluster given by AIS_ENDPOINT, not the local one")
    out = subprocess.run([sys.executable, "-m", "aisio.cluster", "status"], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert f"running: AIS_ENDPOINT={ais_endpoint}" in out.stdout
    assert out.stdout.count(" up") == 3
    assert BANNER not in out.stderr


def test_importing_aisio_loads_no_dataloader2_and_hides_no_warning_of_the_users():
    code = "import sys, aisio; print('torchdata.dataloader2' in sys.modules)"
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert plain.returncode == 0 and plain.stdout.strip() == "False", plain.stderr
    assert BANNER not in plain.stderr
    if importlib.util.find_spec("torchdata.dataloader2") is None:
        return  # torchdata 0.10+: no DataLoader2, no banner to keep
    code = "import aisio, torchdata.dataloader2"
    user = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert user.returncode == 0 and BANNER in user.stderr  # a user's own import still sees it


def test_config_overrides_merge_section_by_section():
    conf = cl.cluster_config("http://127.0.0.1:1", cl.FAST_FAILOVER)
    assert conf["keepalivetracker"]["num_retries"] == 2
    assert conf["timeout"]["max_keepalive"] == "5s"  # untouched sections and keys stay
    conf = cl.cluster_config("http://127.0.0.1:1", {"timeout": {"cplane_operation": "1s"}})
    assert conf["timeout"]["cplane_operation"] == "1s" and conf["timeout"]["max_keepalive"] == "5s"


def test_xattr_probe_tells_a_filesystem_without_user_xattrs(tmp_path, monkeypatch):
    def refuse(*args):
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr(os, "setxattr", refuse)
    assert cl.supports_user_xattrs(tmp_path) is False
    assert not list(tmp_path.iterdir())  # the probe file is removed
