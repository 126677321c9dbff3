"""The local cluster: its installer, its command line, and its failure report."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from aisio import cluster as cl


def test_installer_falls_back_to_a_wrapper_module_build_when_go_install_fails(tmp_path, monkeypatch, capsys):
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
    binary = cl.ensure_aisnode()
    assert binary == tmp_path / "cache" / "bin" / "aisnode" and binary.read_text() == "built\n"
    err = capsys.readouterr().err
    assert "go install -tags dsort github.com/NVIDIA/aistore/cmd/aisnode@v1.5.0" in err
    assert "403 Forbidden" in err and "go build -mod=mod -tags dsort" in err
    assert os.access(binary, os.X_OK)
    go.write_text("#!/bin/sh\nexit 9\n")  # a Go that fails: must not be called again
    assert cl.ensure_aisnode() == binary  # present: nothing to build


def test_a_failed_start_prints_the_node_logs_and_leaves_nothing_running(ais_endpoint, tmp_path, monkeypatch, capsys):
    real = cl.ensure_aisnode()
    cache = tmp_path / "cache"
    (cache / "bin").mkdir(parents=True)
    (cache / "bin" / "aisnode").symlink_to(real)
    monkeypatch.setenv("WDS_DATAPIPES_CACHE", str(cache))
    monkeypatch.setenv("AISIO_RUN_DIR", str(tmp_path / "run"))
    broken = cl.cluster_config

    def config(primary_url):
        conf = broken(primary_url)
        conf["timeout"]["cplane_operation"] = "1ms"  # below aisnode's minimum
        return conf

    monkeypatch.setattr(cl, "cluster_config", config)
    with pytest.raises(cl.ClusterError, match="exited during start-up"):
        cl.LocalCluster.start(timeout=30)
    err = capsys.readouterr().err
    assert "---- proxy pid" in err and "cplane_operation" in err
    assert cl.LocalCluster.load() is None
    assert not any((tmp_path / "run").iterdir())


def test_status_command_reports_the_running_cluster(ais_endpoint):
    if cl.LocalCluster.running() is None:
        pytest.skip("the tests run against a cluster given by AIS_ENDPOINT, not the local one")
    out = subprocess.run([sys.executable, "-m", "aisio.cluster", "status"], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert f"running: AIS_ENDPOINT={ais_endpoint}" in out.stdout
    assert out.stdout.count(" up") == 3


def test_xattr_probe_tells_a_filesystem_with_user_xattrs(tmp_path):
    assert cl.supports_user_xattrs(tmp_path) in (True, False)
    assert Path(tmp_path).is_dir() and not list(tmp_path.iterdir())
