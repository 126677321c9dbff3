"""Reads in a process that calls obstore itself (the main process, a spawned worker): ``s3://``
and ``az://`` bodies come by a URL this process presigns (``obstore.sign``) and
``http.client`` reads (``storage/signed_get.py``); ``gs://``, and any store behind a proxy
set in the environment, keep obstore's own GET. The resume, retry and ETag-pin tests of
``test_object_store_reads.py`` run on this path for s3 and az; the signature-leak test of
``test_forked_reads.py`` runs here too.

Oracles: the bytes the servers' own writer put (``ObjectServer.put``: plain urllib); which
requests carried a signature (the fault proxy's record of each request's query string, and
a forwarding proxy's record of the requests sent through it).
"""

from __future__ import annotations

import logging
import os
import random
import socket
import socketserver
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from store_helpers import configured

from wds_datapipes.limits import Limits
from wds_datapipes.shards.openers import open_shard, source_stamp
from wds_datapipes.storage import object_store, store_calls

pytest.importorskip("obstore")
pytestmark = pytest.mark.timeout(240)

FAST = Limits(http_timeout=3, http_retries=8)
SIGNATURE = ("X-Amz-Signature=", "sig=")  # the query parameters holding S3's and Azure's signatures


@pytest.fixture(autouse=True)
def in_process(monkeypatch):
    """This process as the main one (never forked after obstore), with no store marked unsignable."""
    monkeypatch.setattr(store_calls, "_runtime_pid", None)
    monkeypatch.setattr(object_store, "_unsigned", set())


def _data(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def _recording(queries: list[str]):
    def schedule(request):
        if request.method == "GET":
            queries.append(request.query)
        return "ok"
    return schedule


def test_s3_and_az_bodies_come_by_presigned_url_in_process_and_gs_by_obstore(store, fault_proxy, monkeypatch):
    bucket = store.new_bucket()
    data = _data(1, 300_001)
    store.put(bucket, "dir/obj.tar", data)
    queries: list[str] = []
    through, _ = fault_proxy(store, _recording(queries))
    configured(through, monkeypatch)
    url = through.url(bucket, "dir/obj.tar")
    stamp = source_stamp(url, FAST)
    starts = (0, 1, 4096, 150_000, len(data) - 1)
    for start in starts:
        with open_shard(url, start, FAST) as stream:
            assert stream.read() == data[start:], start
            assert (stream.size, stream.version) == stamp
    signed = [q for q in queries if any(name in q for name in SIGNATURE)]
    if store.scheme in ("s3", "az"):
        assert len(signed) == len(starts) == len(queries)  # every body by its presigned URL
    else:
        assert queries and not signed  # gs:// reads through obstore's GET


class _ForwardingProxy(socketserver.ThreadingTCPServer):
    """A plain HTTP forward proxy (``HTTP_PROXY``): each request, sent in absolute form, is
    recorded and forwarded to its origin, one request per connection."""

    allow_reuse_address = True
    daemon_threads = True

    def __init__(self):
        self.seen: list[str] = []
        proxy = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                line = self.rfile.readline().decode("latin-1")
                method, target, _ = line.split(" ", 2)
                headers, length = [], 0
                while (header := self.rfile.readline()) not in (b"\r\n", b"\n", b""):
                    name = header.split(b":", 1)[0].strip().lower()
                    if name == b"content-length":
                        length = int(header.split(b":", 1)[1])
                    if name not in (b"connection", b"proxy-connection"):
                        headers.append(header)
                body = self.rfile.read(length) if length else b""
                proxy.seen.append(f"{method} {target}")
                host_port, _, path = target.partition("://")[2].partition("/")
                host, _, port = host_port.partition(":")
                with socket.create_connection((host, int(port or 80)), timeout=30) as upstream:
                    upstream.sendall(f"{method} /{path} HTTP/1.1\r\n".encode("latin-1") + b"".join(headers)
                                     + b"Connection: close\r\n\r\n" + body)
                    while data := upstream.recv(1 << 16):
                        self.wfile.write(data)

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


@pytest.mark.parametrize("scheme", ["s3", "az"])
def test_a_proxy_in_the_environment_keeps_obstore_s_get_in_process(request, monkeypatch, caplog, scheme):
    """http.client would not honour ``HTTP_PROXY``: with one set, bodies come by obstore's GET,
    through the proxy, and unsigned (logged once)."""
    store = configured(request.getfixturevalue({"s3": "s3_server", "az": "azure_server"}[scheme]), monkeypatch)
    bucket = store.new_bucket()
    data = _data(2, 200_000)
    store.put(bucket, "obj.tar", data)
    proxy = _ForwardingProxy()
    try:
        for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.server_address[1]}")
        caplog.set_level(logging.INFO, logger="wds_datapipes")
        for start in (0, 1000):
            with open_shard(store.url(bucket, "obj.tar"), start, FAST) as stream:
                assert stream.read() == data[start:]
    finally:
        proxy.shutdown()
        proxy.server_close()
    gets = [seen for seen in proxy.seen if seen.startswith("GET ") and "obj.tar" in seen]
    assert len(gets) == 2 and not [g for g in gets if any(name in g for name in SIGNATURE)]
    assert len([r for r in caplog.records if "no presigned reads" in r.getMessage()]) == 1


PROXY_NAMES = st.sampled_from(["http_proxy", "HTTP_PROXY", "https_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY",
                               "WDS_NOT_A_PROXY", "proxy"])
PROXY_VALUES = st.sampled_from(["", "http://127.0.0.1:3128", "127.0.0.1", "example.com,localhost", "*"])


@settings(max_examples=60, deadline=None)
@given(env=st.dictionaries(PROXY_NAMES, PROXY_VALUES, max_size=4),
       url=st.sampled_from(["http://127.0.0.1:9000/b/k?sig=x", "https://example.com/b/k?sig=x",
                            "http://localhost/b/k?X-Amz-Signature=y"]))
def test_whether_a_signed_url_goes_through_a_proxy_is_urllib_s_answer(env, url):
    """Oracle: urllib.request.getproxies() and proxy_bypass() asked directly (the fast path that
    skips them when no variable is named ``*_proxy`` must agree)."""
    import urllib.request
    from urllib.parse import urlsplit

    from wds_datapipes.storage.signed_get import SignedUrl, proxied

    names = [n for n in os.environ if n.lower().endswith("_proxy") or n.lower() == "proxy"]
    saved = {n: os.environ.pop(n) for n in names}
    try:
        os.environ.update(env)
        parts = urlsplit(url)
        expected = bool(urllib.request.getproxies().get(parts.scheme)) and not urllib.request.proxy_bypass(
            parts.hostname)
        assert proxied(SignedUrl(url)) == expected
    finally:
        for name in env:
            os.environ.pop(name, None)
        os.environ.update(saved)
