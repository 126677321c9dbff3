"""The local cluster's configs and folders: where things live, and what each node is told.

Linux only: mountpaths need ``user.*`` extended attributes, and the process checks in
:mod:`aisio.cluster.process` read ``/proc``.
"""

from __future__ import annotations

import copy
import os
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CACHE_ENV = "WDS_DATAPIPES_CACHE"
RUN_DIR_ENV = "AISIO_RUN_DIR"
NUM_TARGETS = 2


class ClusterError(RuntimeError):
    """The local cluster could not be installed, started, changed or stopped."""


def cache_dir() -> Path:
    """``$WDS_DATAPIPES_CACHE`` or ``~/.cache/wds-datapipes``: the node binary and the cluster's state."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "wds-datapipes"


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports that were free on 127.0.0.1 a moment ago."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def supports_user_xattrs(directory: str | os.PathLike) -> bool:
    """Whether files in ``directory`` take ``user.*`` extended attributes (AIStore needs them)."""
    if not hasattr(os, "setxattr"):
        return False
    fd, probe = tempfile.mkstemp(prefix=".xattr-probe-", dir=directory)
    os.close(fd)
    try:
        os.setxattr(probe, "user.aisio", b"1")
        return os.getxattr(probe, "user.aisio") == b"1"
    except OSError:
        return False
    finally:
        os.unlink(probe)


def run_parent() -> Path:
    """The folder to create run folders in: ``$AISIO_RUN_DIR``, else the first of the system
    temp folder and ``<cache>/runs`` whose filesystem has user xattrs."""
    explicit = os.environ.get(RUN_DIR_ENV)
    candidates = [Path(explicit)] if explicit else [Path(tempfile.gettempdir()), cache_dir() / "runs"]
    for parent in candidates:
        parent.mkdir(parents=True, exist_ok=True)
        if supports_user_xattrs(parent):
            return parent
    tried = ", ".join(str(p) for p in candidates)
    raise ClusterError(
        f"no folder with user.* extended attributes among {tried} (tmpfs has none): AIStore "
        f"mountpaths need them; set {RUN_DIR_ENV} to a folder on ext4 or xfs"
    )


def merged(base: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict:
    """A deep copy of ``base`` with ``overrides`` merged in, section by section."""
    out = copy.deepcopy(dict(base))
    for key, value in (overrides or {}).items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def cluster_config(primary_url: str, overrides: Mapping[str, Any] | None = None) -> dict:
    """The cluster-wide config (``-config``), with ``overrides`` merged in; aisnode fills the
    sections left out with its defaults."""
    config = {
        "backend": {},
        "auth": {},
        "proxy": {"primary_url": primary_url, "original_url": primary_url, "discovery_url": ""},
        "timeout": {
            "cplane_operation": "2s",
            "max_keepalive": "5s",
            "cold_get_conflict": "5s",
            "max_host_busy": "20s",
            "startup_time": "30s",
            "join_startup_time": "3m",
            "send_file_time": "5m",
            "ec_streams_time": "10m",
            "object_md": "2h",
        },
        # A busy, shared CI disk must not make the cluster refuse writes or start evicting.
        "space": {
            "cleanupwm": 85,
            "lowwm": 90,
            "highwm": 96,
            "out_of_space": 99,
            "batch_size": 32768,
            "dont_cleanup_time": "120m",
        },
        "memsys": {
            "min_free": "256mb",
            "default_buf": "32kb",
            "to_gc": "1gb",
            "hk_time": "3m",
            "min_pct_total": 0,
            "min_pct_free": 0,
        },
        "versioning": {"enabled": True, "validate_warm_get": False},
        "resilver": {"enabled": True},
        # Membership is fixed, so there is nothing to rebalance; with it on, the primary
        # waits out a quiet period (max_keepalive) before it answers ready (prr). A section
        # whose fields are all zero values is taken as absent (defaults: enabled), hence the
        # explicit dest_retry_time.
        "rebalance": {"enabled": False, "dest_retry_time": "2m"},
        "net": {
            "l4": {"proto": "tcp", "sndrcv_buf_size": 131072},
            "http": {
                "use_https": False,
                "server_crt": "server.crt",
                "server_key": "server.key",
                "idle_conn_time": "6s",
                "idle_conns_per_host": 32,
                "idle_conns": 256,
                "write_buffer_size": 65536,
                "read_buffer_size": 65536,
                "chunked_transfer": True,
                "skip_verify": False,
            },
            "use_ipv6": False,
        },
        "distributed_sort": {
            "duplicated_records": "ignore",
            "missing_shards": "ignore",
            "ekm_malformed_line": "abort",
            "ekm_missing_key": "abort",
            "default_max_mem_usage": "80%",
            "call_timeout": "10m",
            "dsorter_mem_threshold": "100GB",
            "compression": "never",
            "bundle_multiplier": 4,
        },
    }
    return merged(config, overrides)


# The primary removes a node that stopped answering after (time to its next keepalive
# check) + (retries x retry wait). Defaults: 10 s interval, 3 retries 6 s apart: 28-38 s.
# These settings make it 5-11 s, for tests that kill nodes on purpose.
FAST_FAILOVER = {
    "keepalivetracker": {
        "proxy": {"name": "heartbeat", "interval": "5s", "factor": 3},
        "target": {"name": "heartbeat", "interval": "5s", "factor": 3},
        "num_retries": 2,
        "retry_factor": 1,
    },
}


def local_config(node_dir: Path, ports: tuple[int, int, int], mp_root: Path, instance: int) -> dict:
    """One node's local config (``-local_config``); targets get one test mountpath each."""
    public, control, data = ports
    return {
        "confdir": str(node_dir / "conf"),
        "log_dir": str(node_dir / "log"),
        "host_net": {
            "hostname": "127.0.0.1",
            "hostname_intra_control": "127.0.0.1",
            "hostname_intra_data": "127.0.0.1",
            "port": str(public),
            "port_intra_control": str(control),
            "port_intra_data": str(data),
        },
        "fspaths": {},
        "test_fspaths": {"root": str(mp_root), "count": 1 if instance else 0, "instance": instance},
    }
