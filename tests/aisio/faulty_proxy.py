"""The AIS tests' relay: a :class:`fault_proxy.FaultProxy` (tests/fault_proxy.py, the one
home of the fault proxy) set up as these tests use it, in front of a real AIStore cluster.

Clients talk to the relay as if it were the cluster; AIStore's redirects from the proxy
node to a target pass through it too (the proxy rewrites them to ``/_t/<port>/...``). For
the first ``cuts`` GET answers (200/206) of each object (a path starting with
``object_filter``) it forwards only ``cut_after`` body bytes and then closes the
connection: a genuinely dropped TCP stream, which the client must resume with an HTTP
Range request against the real cluster. With ``drop_range`` it strips Range headers (as a
cluster serving an ETL's output would ignore them); ``on_cut`` runs after each cut, before
the client notices it. With ``stall_s``, a cut body stops flowing for that long before the
connection closes (a node that hangs mid-body). ``busy`` maps path prefixes to a number of
requests the relay answers itself with 503 (a busy node) before it forwards the rest.

Every request is recorded in ``log`` as (method, path, Range header, status, body bytes
sent), and its query string in ``queries`` (same index).
"""

from __future__ import annotations

import threading

from fault_proxy import FaultProxy, Request


class FaultyRelay(FaultProxy):
    def __init__(self, upstream: str, cut_after: int, cuts: int = 1, object_filter: str = "/v1/objects/",
                 drop_range: bool = False, on_cut=None, busy: dict[str, int] | None = None,
                 stall_s: float = 0.0):
        self.cut_after, self.cuts, self.object_filter = cut_after, cuts, object_filter
        self.busy = dict(busy or {})  # path prefix -> 503 answers still to give
        self.cut_count: dict[str, int] = {}
        self._claims = threading.Lock()
        super().__init__(upstream, self._schedule, stall_s=stall_s, drop_range=drop_range, on_cut=on_cut,
                         cut_at=self._cut_at)

    def _schedule(self, request: Request) -> str:
        with self._claims:
            prefix = next((p for p, n in self.busy.items() if n > 0 and request.path.startswith(p)), None)
            if prefix is not None:
                self.busy[prefix] -= 1
                return "503"
        if request.method == "GET" and request.path.startswith(self.object_filter) and self.cuts:
            return "stall" if self.stall_s else "cut"  # cut only if _cut_at claims one
        return "ok"

    def _cut_at(self, request: Request, length: int | None) -> int | None:
        with self._claims:
            done = self.cut_count.get(request.path, 0)
            if done >= self.cuts:
                return None
            self.cut_count[request.path] = done + 1
            return self.cut_after

    @property
    def log(self) -> list[tuple[str, str, str | None, int, int]]:
        """(method, path, Range header, status, body bytes sent) of each request; 503 where the relay answered."""
        return [(e.method, e.path, e.range, int(e.fault) if e.fault in ("500", "503") else e.status, e.sent)
                for e in self.exchanges]
