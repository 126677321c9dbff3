"""A 503 or 429 with ``Retry-After``, where our own code sees the HTTP answer (the presigned
reads of ``signed_get``, the ``http(s)://`` opener), waits that long before the next try,
up to ``retry.RETRY_AFTER_CAP_S`` and never past the retry budget. (obstore's own retries
cannot see the header: docs/storage.md.)

Oracle: the times the fault proxy's schedule was asked about each request (a custom
schedule noting ``time.monotonic()``): the gap between the 503 and the next try, against the
Retry-After the proxy sent and the backoff alone (0.25-0.5 s for the first retry).
"""

from __future__ import annotations

import functools
import http.server
import random
import threading
import time

import pytest
from fault_proxy import first_faults
from store_helpers import configured

from wds_datapipes.limits import Limits
from wds_datapipes.shards.http_stream import HttpStream
from wds_datapipes.shards.openers import open_shard
from wds_datapipes.storage import retry
from wds_datapipes.storage.retry import Attempts, RetryPolicy, retry_after

pytestmark = pytest.mark.timeout(240)
LIMITS = Limits(http_timeout=10, http_retries=4)
DATA = random.Random(3).randbytes(200_000)


def _timed(schedule, times: list[float]):
    def timing(request):
        if request.method == "GET":
            times.append(time.monotonic())
        return schedule(request)
    return timing


@pytest.fixture
def file_server(tmp_path):
    """A plain HTTP server of ``tmp_path`` (its base URL)."""
    (tmp_path / "o.tar").write_bytes(DATA)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_the_http_opener_waits_the_retry_after_of_a_503(file_server, fault_proxy):
    times = []
    base, proxy = fault_proxy(file_server, _timed(first_faults("503"), times), retry_after=2)
    stream = HttpStream(f"{base}/o.tar", 0, LIMITS)
    assert stream.read() == DATA
    assert len(times) == 2 and proxy.injected["503"] == 1
    assert times[1] - times[0] >= 1.9  # the backoff alone: 0.25-0.5 s


def test_a_retry_after_past_the_cap_is_waited_only_up_to_the_cap(file_server, fault_proxy, monkeypatch):
    monkeypatch.setattr(retry, "RETRY_AFTER_CAP_S", 1.0)
    times = []
    base, _ = fault_proxy(file_server, _timed(first_faults("503"), times), retry_after=3600)
    assert HttpStream(f"{base}/o.tar", 0, LIMITS).read() == DATA
    assert 0.9 <= times[1] - times[0] < 10


def test_a_presigned_read_waits_the_retry_after_of_a_503(azure_server, fault_proxy, monkeypatch, forked):
    """Azurite accepts presigned (SAS) URLs; the 503 meets the presigned GET (its query has ``sig=``)."""
    bucket = azure_server.new_bucket()
    azure_server.put(bucket, "o.tar", DATA)
    times, signed = [], []

    def schedule(request):
        if request.method == "GET" and "sig=" in request.query:
            signed.append(time.monotonic())
            return "503" if len(signed) == 1 else "ok"
        return "ok"

    through, proxy = fault_proxy(azure_server, _timed(schedule, times), retry_after=2)
    configured(through, monkeypatch)
    with open_shard(through.url(bucket, "o.tar"), 0, LIMITS) as stream:
        assert stream.read() == DATA
    assert len(signed) == 2 and proxy.injected["503"] == 1
    assert signed[1] - signed[0] >= 1.9


def test_retry_after_reads_seconds_and_http_dates_and_waits_within_the_budget():
    assert retry_after("7") == 7.0 and retry_after(None) is None and retry_after("soon") is None
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date past: no wait
    attempts = Attempts(RetryPolicy(budget_s=0.3, first_wait_s=0.01, max_wait_s=0.01))
    started = time.monotonic()
    attempts.failed("503", retry_after=20)
    assert time.monotonic() - started < 1.5  # the budget left (0.3 s) bounds the wait
