"""The fault proxy does to a client exactly what its schedule says, and passes the rest through.

Oracle: the bytes a plain local HTTP server (http.server, below) holds, read through the
proxy by ``http.client``, which reports each fault as Python's HTTP stack sees it.
"""

from __future__ import annotations

import http.client
import http.server
import random
import socket
import threading
import time

import pytest
from fault_proxy import FAULTS, FaultProxy, Request, first_faults, random_faults

pytestmark = pytest.mark.timeout(60)

BODY = random.Random(3).randbytes(200_000)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        asked = self.headers.get("Range")
        start = int(asked.split("=")[1].split("-")[0]) if asked else 0
        self.send_response(206 if asked else 200)
        self.send_header("Content-Length", str(len(BODY) - start))
        self.send_header("X-Seen-Host", self.headers.get("Host", ""))
        self.end_headers()
        self.wfile.write(BODY[start:])

    def do_PUT(self):
        data = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.send_header("X-Got", str(len(data)))
        self.send_header("Location", f"http://127.0.0.1:{self.server.server_address[1]}/elsewhere")
        self.end_headers()


@pytest.fixture(scope="module")
def upstream():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _get(proxy: FaultProxy, headers: dict[str, str] | None = None, timeout: float = 10):
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=timeout)
    conn.request("GET", "/obj", headers=headers or {})
    return conn, conn.getresponse()


def test_without_faults_bodies_ranges_and_the_host_header_pass_unchanged(upstream):
    with FaultProxy(upstream) as proxy:
        _, resp = _get(proxy)
        assert resp.status == 200 and resp.read() == BODY
        assert resp.getheader("X-Seen-Host") == f"127.0.0.1:{proxy.port}"  # what a SigV4 client signed
        _, resp = _get(proxy, {"Range": "bytes=1000-"})
        assert resp.status == 206 and resp.read() == BODY[1000:]
    assert proxy.faults == 0 and [e.range for e in proxy.log] == [None, "bytes=1000-"]


def test_a_put_s_body_and_expect_100_continue_reach_the_server_and_redirects_come_back_through_it(upstream):
    with FaultProxy(upstream) as proxy:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        conn.request("PUT", "/obj", body=b"x" * 5000, headers={"Expect": "100-continue"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("X-Got") == "5000"
        upstream_port = upstream.rsplit(":", 1)[1]
        assert resp.getheader("Location") == f"{proxy.url}/_t/{upstream_port}/elsewhere"


def test_a_reset_is_a_reset_before_any_answer(upstream):
    with FaultProxy(upstream, first_faults("reset")) as proxy:
        with pytest.raises((ConnectionResetError, http.client.RemoteDisconnected)):
            _get(proxy)
        assert _get(proxy)[1].read() == BODY  # the second GET passes
    assert proxy.injected == {"reset": 1} and proxy.log[0].status == 0


@pytest.mark.parametrize("status", [500, 503])
def test_a_5xx_is_answered_by_the_proxy_with_retry_after(upstream, status):
    with FaultProxy(upstream, first_faults(str(status)), retry_after=2) as proxy:
        _, resp = _get(proxy)
        assert resp.status == status and resp.getheader("Retry-After") == "2"
        resp.read()
    assert proxy.injected == {str(status): 1} and proxy.log[0].status == 0  # the server was not asked


@pytest.mark.parametrize("fault", ["cut", "cut-unsized"])
def test_a_cut_body_ends_early_with_or_without_content_length(upstream, fault):
    with FaultProxy(upstream, first_faults(fault), seed=5) as proxy:
        _, resp = _get(proxy)
        if fault == "cut":
            assert resp.getheader("Content-Length") == str(len(BODY))
            with pytest.raises(http.client.IncompleteRead) as caught:
                resp.read()
            got = caught.value.partial
        else:
            assert resp.version == 10 and resp.getheader("Content-Length") is None
            got = resp.read()  # only the bytes can tell
        assert len(got) < len(BODY) and BODY.startswith(got)
    assert proxy.injected == {fault: 1} and proxy.log[0].sent == len(got)


def test_a_stall_outlasts_the_client_s_timeout_then_the_proxy_closes(upstream):
    with FaultProxy(upstream, first_faults("stall"), stall_s=3) as proxy:
        _, resp = _get(proxy, timeout=0.5)
        began = time.monotonic()
        with pytest.raises((TimeoutError, socket.timeout)):
            resp.read()
        assert time.monotonic() - began < 2.5
    assert proxy.injected == {"stall": 1}


def test_a_stalled_head_sends_nothing(upstream):
    with FaultProxy(upstream, first_faults("stall-head"), stall_s=3) as proxy, pytest.raises(
            (TimeoutError, socket.timeout)):
        _get(proxy, timeout=0.5)
    assert proxy.injected == {"stall-head": 1}


def test_a_body_fault_on_an_answer_without_a_body_counts_as_none(upstream):
    with FaultProxy(upstream, lambda r: "cut") as proxy:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        conn.request("PUT", "/obj", body=b"abc")
        assert conn.getresponse().status == 200
    assert proxy.faults == 0 and proxy.log[0].fault == "ok"


def test_a_seeded_schedule_draws_the_same_faults_and_counts_each(upstream):
    """Two proxies with the same seed meet the same request sequence with the same faults;
    ``injected`` equals the faults the client saw (oracle: what each GET came back as)."""
    requests = [Request("GET", f"/o{i % 7}", "", None, i // 7) for i in range(300)]
    first, second = random_faults(11, 0.5, FAULTS[1:]), random_faults(11, 0.5, FAULTS[1:])
    assert [first(r) for r in requests] == [second(r) for r in requests]
    assert random_faults(11, 0.0)(requests[0]) == "ok"
    assert random_faults(11, 1.0, methods=("GET",))(Request("PUT", "/o", "", None, 0)) == "ok"

    seen = 0
    with FaultProxy(upstream, random_faults(4, 0.5, ("reset", "503", "cut")), seed=4) as proxy:
        for _ in range(60):
            try:
                _, resp = _get(proxy)
                data = resp.read()
                seen += resp.status == 503 or data != BODY
            except (http.client.HTTPException, OSError):
                seen += 1
    assert proxy.faults == seen and 15 < seen < 45
    assert sum(proxy.injected.values()) == sum(e.fault != "ok" for e in proxy.log)


def test_unknown_faults_are_refused():
    with pytest.raises(ValueError, match="unknown faults"):
        random_faults(0, 0.5, ("explode",))
    with pytest.raises(ValueError, match="unknown fault"):
        first_faults("explode")
