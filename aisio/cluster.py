"""A real local AIStore cluster (1 proxy + 2 targets on 127.0.0.1) for development and CI.

Command line::

    python -m aisio.cluster start    # installs aisnode if missing, prints AIS_ENDPOINT=http://127.0.0.1:PORT
    python -m aisio.cluster status   # says whether it runs (exit status 0 when it does)
    python -m aisio.cluster stop     # stops the nodes and removes their data

The node binary lives in ``$WDS_DATAPIPES_CACHE/bin/aisnode`` (default cache:
``~/.cache/wds-datapipes``); when it is missing, :func:`ensure_aisnode` builds it with Go
(``go install``, falling back to a build inside a throw-away wrapper module). The
cluster's state (pids, folders, endpoint) is kept in ``<cache>/cluster/state.json``, so
``stop`` and ``status`` work from any process. Configs, logs and mountpaths go to a fresh
temporary folder (``$AISIO_RUN_DIR`` or the system temp folder), which must be on a
filesystem with ``user.*`` extended attributes (ext4, xfs; not tmpfs).

Python::

    from aisio.cluster import LocalCluster
    cluster = LocalCluster.start()      # or LocalCluster.running() to find one
    print(cluster.endpoint)
    cluster.stop()
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .client import ENDPOINT_ENV

AISTORE_MODULE = "github.com/NVIDIA/aistore"
AISTORE_VERSION = "v1.5.0"
GO_VERSION = "1.26"
BUILD_TAGS = "dsort"
NUM_TARGETS = 2
HEALTH_TIMEOUT_S = 90.0
START_ATTEMPTS = 3  # a node that exits during start-up gets new ports and another try
STOP_TIMEOUT_S = 20.0


class ClusterError(RuntimeError):
    """The local cluster could not be installed, started or stopped."""


# ---------------------------------------------------------------------------- install


def cache_dir() -> Path:
    """``$WDS_DATAPIPES_CACHE`` or ``~/.cache/wds-datapipes``."""
    env = os.environ.get("WDS_DATAPIPES_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "wds-datapipes"


def aisnode_path() -> Path:
    """Where the node binary is kept between runs."""
    return cache_dir() / "bin" / "aisnode"


def _say(msg: str) -> None:
    print(f"[aisio.cluster] {msg}", file=sys.stderr, flush=True)


def ensure_aisnode(verbose: bool = True) -> Path:
    """The path of the aisnode binary, building it with Go first when it is missing.

    It runs ``go install -tags dsort github.com/NVIDIA/aistore/cmd/aisnode@v1.5.0``. Where
    that fails (a Go module proxy that serves the version but refuses the version list makes
    ``go install``'s deprecation lookup fatal), it builds the same package from a throw-away
    wrapper module that requires ``github.com/NVIDIA/aistore v1.5.0``. Either takes minutes.
    """
    binary = aisnode_path()
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    say = _say if verbose else (lambda msg: None)
    go = shutil.which("go")
    if go is None:
        raise ClusterError(
            f"aisnode is not installed at {binary} and Go is not on PATH: install Go "
            f">= {GO_VERSION} (https://go.dev/dl) or copy an aisnode binary built with "
            f"'-tags {BUILD_TAGS}' there"
        )
    binary.parent.mkdir(parents=True, exist_ok=True)
    pkg = f"{AISTORE_MODULE}/cmd/aisnode"
    env = dict(os.environ, GOBIN=str(binary.parent))
    cmd = [go, "install", "-tags", BUILD_TAGS, f"{pkg}@{AISTORE_VERSION}"]
    say(f"installing aisnode: {' '.join(cmd)} (GOBIN={binary.parent}; takes minutes)")
    first = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True)
    if first.returncode == 0 and binary.is_file():
        say(f"installed {binary}")
        return binary
    say(f"go install failed ({_last_lines(first.stderr, 3)}); building from a wrapper module instead")
    with tempfile.TemporaryDirectory(prefix="aisbuild-") as tmp:
        Path(tmp, "go.mod").write_text(
            f"module aisbuild\n\ngo {GO_VERSION}\n\nrequire {AISTORE_MODULE} {AISTORE_VERSION}\n"
        )
        partial = binary.with_name(binary.name + ".partial")
        cmd = [go, "build", "-mod=mod", "-tags", BUILD_TAGS, "-o", str(partial), pkg]
        say(f"in {tmp}: {' '.join(cmd)}")
        second = subprocess.run(cmd, check=False, cwd=tmp, env=env, capture_output=True, text=True)
        if second.returncode != 0 or not partial.is_file():
            raise ClusterError(
                "cannot build aisnode:\n  go install: "
                + _last_lines(first.stderr, 10)
                + "\n  wrapper-module build: "
                + _last_lines(second.stderr, 20)
            )
        partial.chmod(partial.stat().st_mode | 0o111)
        partial.replace(binary)
    say(f"built {binary}")
    return binary


def _last_lines(text: str, n: int) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return "\n    ".join(lines[-n:]) or "(no output)"


# ---------------------------------------------------------------------------- configs


def _free_ports(n: int) -> list[int]:
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


def _run_parent() -> Path:
    """The folder to create the run folder in: one whose filesystem has user xattrs."""
    explicit = os.environ.get("AISIO_RUN_DIR")
    candidates = [Path(explicit)] if explicit else [Path(tempfile.gettempdir()), cache_dir() / "runs"]
    for parent in candidates:
        parent.mkdir(parents=True, exist_ok=True)
        if supports_user_xattrs(parent):
            return parent
    tried = ", ".join(str(p) for p in candidates)
    raise ClusterError(
        f"no folder with user.* extended attributes among {tried} (tmpfs has none): AIStore "
        "mountpaths need them; set AISIO_RUN_DIR to a folder on ext4 or xfs"
    )


def cluster_config(primary_url: str) -> dict:
    """The cluster-wide config (``-config``); aisnode fills the sections left out with defaults."""
    return {
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


# ---------------------------------------------------------------------------- state


@dataclass
class NodeState:
    role: str
    pid: int
    port: int
    dir: str


@dataclass
class LocalCluster:
    """A local cluster started by :meth:`start`; its state is saved in :func:`state_path`."""

    endpoint: str
    run_dir: str
    nodes: list[NodeState] = field(default_factory=list)

    # -- finding

    @staticmethod
    def state_path() -> Path:
        return cache_dir() / "cluster" / "state.json"

    def save(self) -> None:
        path = self.state_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)

    @classmethod
    def load(cls) -> LocalCluster | None:
        """The saved cluster, running or not; ``None`` when no state is saved."""
        try:
            raw = json.loads(cls.state_path().read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return cls(raw["endpoint"], raw["run_dir"], [NodeState(**n) for n in raw["nodes"]])

    @classmethod
    def running(cls) -> LocalCluster | None:
        """The saved cluster when all its nodes run and it answers healthy, else ``None``."""
        cluster = cls.load()
        if cluster is not None and cluster.alive_nodes() == cluster.nodes and cluster.healthy():
            return cluster
        return None

    # -- starting

    @classmethod
    def start(cls, timeout: float = HEALTH_TIMEOUT_S, verbose: bool = True) -> LocalCluster:
        """Start 1 proxy + 2 targets and wait until healthy; returns the running one if any.

        On failure it prints the nodes' log tails, stops what it started and raises
        :class:`ClusterError`.
        """
        say = _say if verbose else (lambda msg: None)
        current = cls.load()
        if current is not None:
            if current.alive_nodes() == current.nodes and current.healthy():
                say(f"already running at {current.endpoint}")
                return current
            say("removing the state of a cluster that no longer runs")
            current.stop(verbose=False)
        binary = ensure_aisnode(verbose)
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                return cls._start_once(binary, timeout, verbose)
            except ClusterError as exn:
                # The free ports are picked, released, then bound by the nodes: another
                # process can take one meanwhile. New ports and a new folder fix that.
                if attempt == START_ATTEMPTS or "exited during start-up" not in str(exn):
                    raise
                say(f"attempt {attempt} failed ({exn}); trying again with other ports")
        raise AssertionError("unreachable")

    @classmethod
    def _start_once(cls, binary: Path, timeout: float, verbose: bool) -> LocalCluster:
        say = _say if verbose else (lambda msg: None)
        run_dir = Path(tempfile.mkdtemp(prefix="aisio-cluster-", dir=_run_parent()))
        ports = _free_ports(3 * (1 + NUM_TARGETS))
        primary_url = f"http://127.0.0.1:{ports[0]}"
        config = cluster_config(primary_url)
        env = {k: v for k, v in os.environ.items() if k not in ("AIS_ENDPOINT", "AIS_PRIMARY_EP")}
        cluster = cls(endpoint=primary_url, run_dir=str(run_dir))
        started = time.monotonic()
        try:
            for i in range(1 + NUM_TARGETS):
                role = "proxy" if i == 0 else "target"
                node_dir = run_dir / f"{role}{i}"
                (node_dir / "conf").mkdir(parents=True)
                (node_dir / "log").mkdir()
                node_ports = (ports[3 * i], ports[3 * i + 1], ports[3 * i + 2])
                (node_dir / "ais.json").write_text(json.dumps(config, indent=1))
                (node_dir / "ais_local.json").write_text(
                    json.dumps(local_config(node_dir, node_ports, run_dir / "mp", i), indent=1)
                )
                cmd = [
                    str(binary),
                    f"-role={role}",
                    f"-config={node_dir / 'ais.json'}",
                    f"-local_config={node_dir / 'ais_local.json'}",
                ]
                if role == "proxy":
                    cmd.append(f"-ntargets={NUM_TARGETS}")
                with open(node_dir / "console.log", "wb") as console:
                    proc = subprocess.Popen(
                        cmd,
                        cwd=node_dir,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=console,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # outlives the CLI that started it
                    )
                cluster.nodes.append(NodeState(role, proc.pid, node_ports[0], str(node_dir)))
                if role == "proxy":
                    # A target whose first join finds no listener retries only after
                    # max(2 s, max_keepalive): start targets once the primary listens.
                    cluster._wait_listening(node_ports[0], min(timeout, 30.0))
            cluster.save()
            say(f"started 1 proxy + {NUM_TARGETS} targets under {run_dir}; waiting for {primary_url}")
            cluster._wait_healthy(timeout)
        except BaseException as exn:
            if verbose:
                print(cluster.log_tails(), file=sys.stderr)
            cluster.stop(verbose=False)
            if isinstance(exn, ClusterError):
                raise
            raise ClusterError(f"cannot start the local cluster: {exn}") from exn
        say(f"healthy after {time.monotonic() - started:.1f} s")
        return cluster

    def _wait_listening(self, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.nodes[0] not in self.alive_nodes():
                raise ClusterError(f"proxy (pid {self.nodes[0].pid}) exited during start-up")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise ClusterError(f"proxy did not listen on 127.0.0.1:{port} in {timeout:.0f} s")

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            dead = [n for n in self.nodes if n not in self.alive_nodes()]
            if dead:
                names = ", ".join(f"{n.role} (pid {n.pid})" for n in dead)
                raise ClusterError(f"node exited during start-up: {names}")
            if self.healthy():
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"{self.endpoint}/v1/health?prr=true did not answer 200 in {timeout:.0f} s")
            time.sleep(0.5)

    # -- inspecting

    def healthy(self) -> bool:
        """Whether the primary answers ``GET /v1/health?prr=true`` with 200 (cluster ready)."""
        try:
            with urllib.request.urlopen(f"{self.endpoint}/v1/health?prr=true", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def alive_nodes(self) -> list[NodeState]:
        return [n for n in self.nodes if _is_our_aisnode(n.pid, self.run_dir)]

    def log_tails(self, lines: int = 25) -> str:
        """The last lines of every node's console output and log files."""
        out = []
        for node in self.nodes:
            node_dir = Path(node.dir)
            files = [node_dir / "console.log"]
            log_dir = node_dir / "log"
            if log_dir.is_dir():
                files += sorted(p for p in log_dir.iterdir() if p.is_file() and not p.is_symlink())
            for path in files:
                try:
                    text = path.read_text(errors="replace").strip().splitlines()
                except OSError:
                    continue
                if text:
                    out.append(f"---- {node.role} pid {node.pid}: {path} (last {lines} lines)")
                    out.extend(text[-lines:])
        return "\n".join(out) or "(the nodes wrote no logs)"

    # -- stopping

    def stop(self, verbose: bool = True, keep_data: bool = False) -> None:
        """SIGTERM every node (SIGKILL after a grace period), then remove the run folder and state."""
        say = _say if verbose else (lambda msg: None)
        alive = self.alive_nodes()
        # Targets first: a proxy that loses its targets while they stop logs less noise.
        for node in sorted(alive, key=lambda n: n.role == "proxy"):
            _signal(node.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline and self.alive_nodes():
            time.sleep(0.2)
        for node in self.alive_nodes():
            say(f"{node.role} pid {node.pid} ignored SIGTERM; killing it")
            _signal(node.pid, signal.SIGKILL)
        for node in self.nodes:
            _reap(node.pid)
        if not keep_data:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        saved = self.load()
        if saved is not None and saved.run_dir == self.run_dir:
            self.state_path().unlink(missing_ok=True)
        say(f"stopped {len(alive)} node(s){'' if keep_data else ' and removed ' + self.run_dir}")


@contextlib.contextmanager
def cluster_endpoint(verbose: bool = True) -> Iterator[str]:
    """The endpoint to work against, for scripts: ``$AIS_ENDPOINT`` if set, else the running
    local cluster, else a local cluster started here and stopped on exit."""
    given = os.environ.get(ENDPOINT_ENV)
    if given:
        yield given.rstrip("/")
        return
    started = None
    cluster = LocalCluster.running()
    if cluster is None:
        cluster = started = LocalCluster.start(verbose=verbose)
    os.environ[ENDPOINT_ENV] = cluster.endpoint  # worker processes started later inherit it
    try:
        yield cluster.endpoint
    finally:
        os.environ.pop(ENDPOINT_ENV, None)
        if started is not None:
            started.stop(verbose=verbose)


def _is_our_aisnode(pid: int, run_dir: str) -> bool:
    """Whether ``pid`` is a live aisnode of the cluster in ``run_dir`` (not a recycled pid, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except (OSError, IndexError):
        return False
    ours = os.fsencode(run_dir) + b"/"
    return state != b"Z" and os.path.basename(argv[0]) == b"aisnode" and any(ours in a for a in argv[1:])


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    # Nodes started by this process are its children; collect them so no zombie remains.
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


# ---------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m aisio.cluster", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="install aisnode if missing, start the cluster, print AIS_ENDPOINT")
    start.add_argument("--timeout", type=float, default=HEALTH_TIMEOUT_S, help="seconds to wait for health")
    sub.add_parser("stop", help="stop the cluster and remove its data")
    sub.add_parser("status", help="say whether the cluster runs (exit status 0 if it does)")
    sub.add_parser("install", help="only install the aisnode binary")
    sub.add_parser("logs", help="print the tails of the nodes' logs")
    args = parser.parse_args(argv)

    if args.command == "install":
        print(ensure_aisnode())
        return 0
    if args.command == "start":
        try:
            cluster = LocalCluster.start(timeout=args.timeout)
        except ClusterError as exn:
            print(f"error: {exn}", file=sys.stderr)
            return 1
        print(f"AIS_ENDPOINT={cluster.endpoint}", flush=True)
        return 0
    cluster = LocalCluster.load()
    if args.command == "stop":
        if cluster is None:
            print("no local cluster is recorded; nothing to stop")
            return 0
        cluster.stop()
        return 0
    if args.command == "logs":
        print(cluster.log_tails() if cluster else "no local cluster is recorded")
        return 0
    # status
    if cluster is None:
        print("not running (no local cluster is recorded)")
        return 3
    alive = cluster.alive_nodes()
    healthy = cluster.healthy()
    state = "running" if healthy and alive == cluster.nodes else "not healthy"
    print(f"{state}: AIS_ENDPOINT={cluster.endpoint}")
    for node in cluster.nodes:
        print(f"  {node.role:6} pid {node.pid:<7} port {node.port:<5} {'up' if node in alive else 'DOWN'}")
    print(f"  data: {cluster.run_dir}")
    return 0 if state == "running" else 3


if __name__ == "__main__":
    sys.exit(main())
