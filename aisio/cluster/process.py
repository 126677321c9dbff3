"""Starting, watching, faulting and stopping the local cluster's node processes.

A :class:`LocalCluster` is 1 proxy + 2 targets on 127.0.0.1, each an ``aisnode`` process
in its own session (they outlive the process that started them). Its state (pids, ports,
folders, endpoint) is saved in ``<cache>/cluster/state.json``, so ``status`` and ``stop``
work from any process. Tests use :meth:`LocalCluster.signal_node` and
:meth:`LocalCluster.restart_node` to inject faults. Linux only (reads ``/proc``).
"""

from __future__ import annotations

import contextlib
import json
import logging
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
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..client import ENDPOINT_ENV
from . import config as cfg
from .build import aisnode_path, ensure_aisnode
from .config import NUM_TARGETS, ClusterError

HEALTH_TIMEOUT_S = 90.0
START_ATTEMPTS = 2  # only a node that lost its port to another process gets a second try
STOP_TIMEOUT_S = 20.0

logger = logging.getLogger("aisio.cluster")


class NodeExitedError(ClusterError):
    """A node process exited while the cluster started or a node restarted.

    ``port_taken`` says whether its log blames a port that another process bound between
    the pick and the node's bind (then new ports help); ``logs`` holds the nodes' log tails.
    """

    def __init__(self, message: str, logs: str = "", port_taken: bool = False):
        super().__init__(message)
        self.logs = logs
        self.port_taken = port_taken


def report_to_stderr() -> None:
    """Show the ``aisio.cluster`` logger's progress messages on stderr (once per process)."""
    if not any(getattr(h, "_aisio_cluster", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[aisio.cluster] %(message)s"))
        handler._aisio_cluster = True
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


@dataclass
class NodeState:
    role: str
    pid: int
    port: int
    dir: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class LocalCluster:
    """A local cluster started by :meth:`start`; its state is saved in :meth:`state_path`."""

    endpoint: str
    run_dir: str
    nodes: list[NodeState] = field(default_factory=list)
    binary: str = ""
    _procs: dict[int, subprocess.Popen] = field(default_factory=dict, repr=False, compare=False)

    # -- finding

    @staticmethod
    def state_path() -> Path:
        return cfg.cache_dir() / "cluster" / "state.json"

    def save(self) -> None:
        path = self.state_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        state = {"endpoint": self.endpoint, "run_dir": self.run_dir, "binary": self.binary,
                 "nodes": [asdict(n) for n in self.nodes]}
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(path)

    @classmethod
    def load(cls) -> LocalCluster | None:
        """The saved cluster, running or not; ``None`` when no state is saved."""
        try:
            raw = json.loads(cls.state_path().read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return cls(raw["endpoint"], raw["run_dir"], [NodeState(**n) for n in raw["nodes"]], raw.get("binary", ""))

    @classmethod
    def running(cls) -> LocalCluster | None:
        """The saved cluster when all its nodes run and it answers healthy, else ``None``."""
        cluster = cls.load()
        return cluster if cluster is not None and cluster.is_up() else None

    # -- starting

    @classmethod
    def start(cls, timeout: float = HEALTH_TIMEOUT_S, verbose: bool = True,
              config: Mapping[str, Any] | None = None, attempts: int = START_ATTEMPTS) -> LocalCluster:
        """Start 1 proxy + 2 targets and wait until healthy; returns the running one if any.

        Args:
            timeout: seconds to wait for the cluster to answer healthy.
            verbose: log progress on stderr.
            config: cluster config sections merged over :func:`~aisio.cluster.config.cluster_config`'s
                (e.g. :data:`~aisio.cluster.config.FAST_FAILOVER`).
            attempts: starts to try when a node loses its port to another process.

        On failure it logs the nodes' log tails, stops what it started and raises
        :class:`~aisio.cluster.config.ClusterError`.
        """
        if verbose:
            report_to_stderr()
        current = cls.load()
        if current is not None:
            if current.is_up():
                logger.info("already running at %s", current.endpoint)
                return current
            logger.info("removing the state of a cluster that no longer runs")
            current.stop()
        binary = ensure_aisnode()
        for attempt in range(1, attempts + 1):
            try:
                return cls._start_once(binary, timeout, config)
            except NodeExitedError as exn:
                # Free ports are picked, released, then bound by the nodes: another process
                # can take one meanwhile. New ports and a new folder fix that, nothing else.
                if attempt == attempts or not exn.port_taken:
                    raise
                logger.info("attempt %d failed (%s); trying again with other ports", attempt, exn)
        raise ClusterError(f"no start attempts made (attempts={attempts})")

    @classmethod
    def _start_once(cls, binary: Path, timeout: float, config: Mapping[str, Any] | None) -> LocalCluster:
        run_dir = Path(tempfile.mkdtemp(prefix="aisio-cluster-", dir=cfg.run_parent()))
        ports = cfg.free_ports(3 * (1 + NUM_TARGETS))
        primary_url = f"http://127.0.0.1:{ports[0]}"
        cluster_json = json.dumps(cfg.cluster_config(primary_url, config), indent=1)
        cluster = cls(endpoint=primary_url, run_dir=str(run_dir), binary=str(binary))
        started = time.monotonic()
        try:
            for i in range(1 + NUM_TARGETS):
                role = "proxy" if i == 0 else "target"
                node_dir = run_dir / f"{role}{i}"
                (node_dir / "conf").mkdir(parents=True)
                (node_dir / "log").mkdir()
                node_ports = (ports[3 * i], ports[3 * i + 1], ports[3 * i + 2])
                (node_dir / "ais.json").write_text(cluster_json)
                (node_dir / "ais_local.json").write_text(
                    json.dumps(cfg.local_config(node_dir, node_ports, run_dir / "mp", i), indent=1)
                )
                node = NodeState(role, 0, node_ports[0], str(node_dir))
                cluster.nodes.append(node)
                cluster._spawn(node)
                if role == "proxy":
                    # A target whose first join finds no listener retries only after
                    # max(2 s, max_keepalive): start targets once the primary listens.
                    cluster._wait_listening(node, min(timeout, 30.0))
            cluster.save()
            logger.info("started 1 proxy + %d targets under %s; waiting for %s", NUM_TARGETS, run_dir, primary_url)
            cluster._wait_healthy(timeout)
        except BaseException as exn:
            logs = cluster.log_tails()
            logger.error("the local cluster did not start; the nodes' logs:\n%s", logs)
            cluster.stop()
            if isinstance(exn, NodeExitedError):
                exn.logs = logs
                exn.port_taken = "address already in use" in logs
                raise
            if isinstance(exn, ClusterError):
                raise
            raise ClusterError(f"cannot start the local cluster: {exn}") from exn
        logger.info("healthy after %.1f s", time.monotonic() - started)
        return cluster

    def _spawn(self, node: NodeState) -> None:
        node_dir = Path(node.dir)
        cmd = [
            self.binary or str(aisnode_path()),
            f"-role={node.role}",
            f"-config={node_dir / 'ais.json'}",
            f"-local_config={node_dir / 'ais_local.json'}",
        ]
        if node.role == "proxy":
            cmd.append(f"-ntargets={NUM_TARGETS}")
        env = {k: v for k, v in os.environ.items() if k not in (ENDPOINT_ENV, "AIS_PRIMARY_EP")}
        with open(node_dir / "console.log", "ab") as console:
            proc = subprocess.Popen(
                cmd,
                cwd=node_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives the process that started it
            )
        node.pid = proc.pid
        self._procs[proc.pid] = proc

    def _wait_listening(self, node: NodeState, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.is_alive(node):
                raise NodeExitedError(f"{node.role} (pid {node.pid}) exited during start-up")
            try:
                socket.create_connection(("127.0.0.1", node.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise ClusterError(f"{node.role} did not listen on 127.0.0.1:{node.port} in {timeout:.0f} s")

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            dead = [n for n in self.nodes if not self.is_alive(n)]
            if dead:
                names = ", ".join(f"{n.role} (pid {n.pid})" for n in dead)
                raise NodeExitedError(f"node exited during start-up: {names}")
            if self.healthy():
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"{self.endpoint}/v1/health?prr=true did not answer 200 in {timeout:.0f} s")
            time.sleep(0.5)

    # -- inspecting

    def healthy(self) -> bool:
        """Whether the primary answers ``GET /v1/health?prr=true`` with 200 (cluster ready)."""
        return _answers_200(f"{self.endpoint}/v1/health?prr=true")

    def is_alive(self, node: NodeState) -> bool:
        """Whether ``node``'s process runs.

        For a process started here, the answer is its :class:`subprocess.Popen`'s: between
        ``exec`` and the new program's set-up, ``/proc/PID/cmdline`` reads empty, which made
        a just-spawned proxy look gone (the "proxy exited during start-up" of issue 9).
        Otherwise ``/proc`` tells, guarding against recycled pids and zombies.
        """
        proc = self._procs.get(node.pid)
        if proc is not None:
            return proc.poll() is None
        return _is_our_aisnode(node.pid, self.run_dir)

    def alive_nodes(self) -> list[NodeState]:
        return [n for n in self.nodes if self.is_alive(n)]

    def is_up(self) -> bool:
        """Whether every node runs and the primary answers healthy."""
        return len(self.alive_nodes()) == len(self.nodes) and self.healthy()

    @property
    def targets(self) -> list[NodeState]:
        return [n for n in self.nodes if n.role == "target"]

    def target_ports_in_map(self) -> set[int]:
        """The public ports of the targets in the primary's cluster map (empty when it does not answer)."""
        try:
            with urllib.request.urlopen(f"{self.endpoint}/v1/daemon?what=smap", timeout=2) as resp:
                smap = json.load(resp)
        except (urllib.error.URLError, OSError, ValueError):
            return set()
        return {int(t["public_net"]["daemon_port"]) for t in (smap.get("tmap") or {}).values()}

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

    # -- faults

    def signal_node(self, node: NodeState, sig: int) -> None:
        """Send ``sig`` to ``node`` (SIGKILL, SIGTERM, SIGSTOP, SIGCONT...) and reap it if it died."""
        if not self.is_alive(node):
            raise ClusterError(f"{node.role} on port {node.port} (pid {node.pid}) does not run")
        _signal(node.pid, sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while self.is_alive(node) and time.monotonic() < deadline:
                time.sleep(0.05)
            _reap(node.pid)

    def restart_node(self, node: NodeState, timeout: float = 60.0) -> None:
        """Start a stopped ``node`` again, with its config and data, and wait until the primary
        has it in its cluster map (targets) and answers healthy."""
        if self.is_alive(node):
            raise ClusterError(f"{node.role} on port {node.port} (pid {node.pid}) still runs")
        self._spawn(node)
        self.save()
        deadline = time.monotonic() + timeout
        while True:
            if not self.is_alive(node):
                logs = self.log_tails()
                raise NodeExitedError(f"{node.role} on port {node.port} exited on restart", logs)
            in_map = node.role != "target" or node.port in self.target_ports_in_map()
            if in_map and _answers_200(f"{node.url}/v1/health") and self.healthy():
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"{node.role} on port {node.port} did not rejoin in {timeout:.0f} s")
            time.sleep(0.2)

    # -- stopping

    def stop(self, keep_data: bool = False) -> None:
        """SIGTERM every node (SIGKILL after a grace period), then remove the run folder and state."""
        alive = self.alive_nodes()
        for node in alive:
            _signal(node.pid, signal.SIGCONT)  # a paused node cannot act on SIGTERM
        # Targets first: a proxy that loses its targets while they stop logs less noise.
        for node in sorted(alive, key=lambda n: n.role == "proxy"):
            _signal(node.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline and self.alive_nodes():
            time.sleep(0.2)
        for node in self.alive_nodes():
            logger.info("%s pid %d ignored SIGTERM; killing it", node.role, node.pid)
            _signal(node.pid, signal.SIGKILL)
        for node in self.nodes:
            proc = self._procs.pop(node.pid, None)
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=STOP_TIMEOUT_S)
            else:
                _reap(node.pid)
        if not keep_data:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        saved = self.load()
        if saved is not None and saved.run_dir == self.run_dir:
            self.state_path().unlink(missing_ok=True)
        logger.info("stopped %d node(s)%s", len(alive), "" if keep_data else " and removed " + self.run_dir)


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
            started.stop()


def _answers_200(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


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
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _reap(pid: int) -> None:
    # Nodes started by this process are its children; collect them so no zombie remains.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
