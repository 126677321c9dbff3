"""What this process knows of a cluster's map: node names for errors, and whether a 404 can be trusted.

While a node is down or rejoining, a cluster answers for objects that exist "does not
exist" (404) or "no targets" (400): the proxy routes the request by a map that has lost
the node that holds the object, or by one that still lists a node that does not answer.
:meth:`ClusterView.unsettled` tells such a moment: a target this process has seen has
left the map, a target in the map does not answer its health check, or the map changed
in the last few seconds. Then an error answer is retried within the budget; otherwise it
is the truth and fails fast.
"""

from __future__ import annotations

import json
import os
import threading
import time

from aistore.sdk.types import Smap

from . import rest
from .errors import NoAnswer, NodeAnswer

# Answers that say "try again later" whatever the cluster map looks like, and those no retry changes.
_BUSY = frozenset((429, 502, 503, 504))
_FINAL = frozenset((501,))
_HEALTH_TIMEOUT_S = 1.0
# After a map change, answers stay suspect this long: nodes learn the new map one by one,
# and a target that just rejoined may still be loading. Measured: a target that leaves on
# SIGTERM is out of the primary's map before its process has exited.
_SETTLE_S = 5.0


class ClusterView:
    """The cluster map of the cluster at ``endpoint`` as this process last saw it.

    ``seen`` holds every target (id -> public URL) seen in any map since the view was made,
    which :func:`view_of` does once per process and endpoint, when the first object opens.
    """

    def __init__(self, endpoint: str):
        self.endpoint = endpoint.rstrip("/")
        self.seen: dict[str, str] = {}
        self._names: dict[str, str] = {self.endpoint: f"proxy at {self.endpoint}"}
        self._smap: Smap | None = None
        self._changed_at = float("-inf")
        self._change = ""
        self._lock = threading.Lock()

    def refresh(self, timeout: float = 2.0) -> Smap | None:
        """The primary's current map; ``None`` when it does not answer."""
        try:
            with rest.request("GET", f"{self.endpoint}/v1/daemon?what=smap", timeouts=(timeout, timeout)) as reply:
                if reply.status != 200:
                    return None
                smap = Smap(**json.loads(reply.read()))
        except (NoAnswer, ValueError, TypeError):
            return None
        with self._lock:
            if self._smap is not None and smap.version != self._smap.version:
                self._changed_at = time.monotonic()
                self._change = f"version {self._smap.version} -> {smap.version}"
            self._smap = smap
            for role, nodes in (("target", smap.tmap), ("proxy", smap.pmap)):
                for node_id, node in nodes.items():
                    url = node.public_net.direct_url.rstrip("/") if node.public_net else ""
                    if url:
                        self._names[url] = f"{role} {'t' if role == 'target' else 'p'}[{node_id}] at {url}"
                        if role == "target":
                            self.seen[node_id] = url
        return smap

    def name(self, url: str) -> str:
        """``target t[ID] at http://host:port`` for a node's URL (``node at URL`` when unknown)."""
        node = rest.node_of(url) if "://" in url else url
        with self._lock:
            return self._names.get(node) or f"node at {node}"

    def unsettled(self, timeout: float = 2.0) -> str | None:
        """Why the cluster map is changing now (a sentence), or ``None`` when it is settled.

        Asks the primary and then each target's health, all within about ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        smap = self.refresh(timeout)
        if smap is None:
            return f"the primary at {self.endpoint} did not answer for its cluster map"
        gone = [f"t[{tid}] at {url}" for tid, url in self.seen.items() if tid not in smap.tmap]
        if gone:
            return f"target {', '.join(gone)} left the cluster map"
        ago = time.monotonic() - self._changed_at
        if ago < _SETTLE_S:
            return f"the cluster map changed {ago:.1f} s ago ({self._change})"
        for tid, node in smap.tmap.items():
            if node.in_maint_or_decomm():
                return f"target t[{tid}] is in maintenance or being decommissioned"
            url = self.seen.get(tid, "")
            try:
                wait = min(_HEALTH_TIMEOUT_S, max(deadline - time.monotonic(), 0.05))
                with rest.request("GET", f"{url}/v1/health", timeouts=(wait, wait)) as r:
                    rest.read_error_body(r)
                    if r.status != 200:
                        return f"target t[{tid}] at {url} answers its health check with HTTP {r.status}"
            except NoAnswer:
                return f"target t[{tid}] at {url} does not answer its health check"
        return None


_VIEWS: dict[tuple[int, str], ClusterView] = {}
_VIEWS_LOCK = threading.Lock()


def view_of(endpoint: str, timeout: float = 2.0) -> ClusterView:
    """This process's view of the cluster at ``endpoint`` (made, and its map fetched within
    ``timeout`` seconds, on first use)."""
    key = (os.getpid(), endpoint.rstrip("/"))
    with _VIEWS_LOCK:
        view = _VIEWS.get(key)
        if view is None:
            view = _VIEWS[key] = ClusterView(endpoint)
            fresh = True
        else:
            fresh = False
    if fresh:
        view.refresh(timeout)
    return view


def retry_reason(answer: NodeAnswer, view: ClusterView, time_left: float) -> str | None:
    """Why an error answer may change if asked again, or ``None`` when it is final (report it).

    Busy answers (429, 502-504) are retried; 501 (not supported) never is; any other answer
    (404 "does not exist" above all) only while the cluster map is changing.
    """
    if answer.status in _BUSY:
        return "the node is busy"
    if answer.status in _FINAL:
        return None
    unsettled = view.unsettled(timeout=min(2.0, max(time_left, 0.05)))
    return f"the cluster map is changing: {unsettled}" if unsettled else None
