"""The command line: ``python -m aisio.cluster start|stop|status|logs|install``."""

from __future__ import annotations

import argparse
import sys

from .build import ensure_aisnode
from .config import ClusterError
from .process import HEALTH_TIMEOUT_S, LocalCluster, report_to_stderr


def _install(args: argparse.Namespace) -> int:
    print(ensure_aisnode())
    return 0


def _start(args: argparse.Namespace) -> int:
    try:
        cluster = LocalCluster.start(timeout=args.timeout)
    except ClusterError as exn:
        print(f"error: {exn}", file=sys.stderr)
        return 1
    print(f"AIS_ENDPOINT={cluster.endpoint}", flush=True)
    return 0


def _stop(args: argparse.Namespace) -> int:
    cluster = LocalCluster.load()
    if cluster is None:
        print("no local cluster is recorded; nothing to stop")
        return 0
    cluster.stop()
    return 0


def _logs(args: argparse.Namespace) -> int:
    cluster = LocalCluster.load()
    print(cluster.log_tails() if cluster else "no local cluster is recorded")
    return 0


def _status(args: argparse.Namespace) -> int:
    cluster = LocalCluster.load()
    if cluster is None:
        print("not running (no local cluster is recorded)")
        return 3
    alive = cluster.alive_nodes()
    state = "running" if cluster.is_up() else "not healthy"
    print(f"{state}: AIS_ENDPOINT={cluster.endpoint}")
    for node in cluster.nodes:
        print(f"  {node.role:6} pid {node.pid:<7} port {node.port:<5} {'up' if node in alive else 'DOWN'}")
    print(f"  data: {cluster.run_dir}")
    return 0 if state == "running" else 3


def main(argv: list[str] | None = None) -> int:
    from . import __doc__ as package_doc

    parser = argparse.ArgumentParser(prog="python -m aisio.cluster", description=package_doc.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="install aisnode if missing, start the cluster, print AIS_ENDPOINT")
    start.add_argument("--timeout", type=float, default=HEALTH_TIMEOUT_S, help="seconds to wait for health")
    start.set_defaults(run=_start)
    sub.add_parser("stop", help="stop the cluster and remove its data").set_defaults(run=_stop)
    sub.add_parser("status", help="say whether the cluster runs (exit status 0 if it does)").set_defaults(run=_status)
    sub.add_parser("install", help="only install the aisnode binary").set_defaults(run=_install)
    sub.add_parser("logs", help="print the tails of the nodes' logs").set_defaults(run=_logs)
    args = parser.parse_args(argv)
    report_to_stderr()
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
