"""s3://, gs:// and az:// objects read through the back ends: from any byte, resumed at the
exact byte, pinned to their version, and each failure to open named for what it is.

Oracle: the bytes the servers' own writer put (``ObjectServer.put``: plain ``urllib``,
sharing no code with obstore or the back ends).
"""

from __future__ import annotations

import random
import socketserver
import threading
import time

import pytest
from fault_proxy import first_faults, random_faults

from wds_datapipes.errors import ShardOpenError, ShardReadError
from wds_datapipes.limits import Limits
from wds_datapipes.shards.openers import backend_for, open_shard, source_stamp
from wds_datapipes.storage import object_store

pytest.importorskip("obstore")
pytestmark = pytest.mark.timeout(240)

FAST = Limits(http_timeout=3, http_retries=8)


def _data(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def test_the_schemes_are_found_through_the_backends_entry_points():
    for scheme, record in (("s3", object_store.S3), ("gs", object_store.GCS), ("az", object_store.AZURE)):
        assert backend_for(f"{scheme}://bucket/key.tar") == record


def test_reads_start_at_any_byte_and_carry_the_stamp(store):
    bucket = store.new_bucket()
    data = _data(1, 300_001)
    store.put(bucket, "dir/obj.tar", data)
    url = store.url(bucket, "dir/obj.tar")
    stamp = source_stamp(url, FAST)
    assert stamp[0] == len(data) and stamp[1]
    for start in (0, 1, 4095, 4096, 150_000, len(data) - 1, len(data)):
        with open_shard(url, start, FAST) as stream:
            assert stream.read() == data[start:], start
            assert (stream.size, stream.version) == stamp


@pytest.mark.parametrize("fault", ["cut", "reset", "503", "cut-unsized", "stall"])
def test_a_broken_body_resumes_at_the_exact_byte(store, fault_proxy, monkeypatch, caplog, fault):
    """Every byte arrives once, in order, though the first answers of the object break (a
    stalled body is given up after Limits.http_timeout, 3 s here, not the proxy's 30 s)."""
    from store_helpers import configured

    bucket = store.new_bucket()
    data = _data(2, 2_000_000)
    store.put(bucket, "obj.tar", data)
    through, _ = fault_proxy(store, first_faults(fault, times=2 if fault == "stall" else 3), stall_s=30)
    configured(through, monkeypatch)
    started = time.monotonic()
    with open_shard(through.url(bucket, "obj.tar"), 1000, FAST) as stream:
        got = bytearray()
        while chunk := stream.read(65536):
            got += chunk
    assert bytes(got) == data[1000:]
    assert [r for r in caplog.records if "resuming at byte" in r.message or "trying again" in r.message]
    assert time.monotonic() - started < 25  # no stall waited out


def test_random_faults_over_many_reads_lose_and_repeat_nothing(store, fault_proxy, monkeypatch):
    from store_helpers import configured

    bucket = store.new_bucket()
    objects = {f"o{i}.tar": _data(10 + i, 200_000 + i) for i in range(6)}
    for key, data in objects.items():
        store.put(bucket, key, data)
    through, proxy = fault_proxy(store, random_faults(seed=3, rate=0.3, kinds=("reset", "503", "cut")))
    configured(through, monkeypatch)
    for key, data in objects.items():
        with open_shard(through.url(bucket, key), 0, FAST.replace(http_retries=20)) as stream:
            assert stream.read() == data
    assert proxy.faults >= 1


def test_an_object_changed_mid_read_is_a_read_error_saying_so(store, fault_proxy, monkeypatch):
    """The first answer is cut; before the resumed request reaches the server, the object is
    written again: the stream refuses to splice the new object onto the old one."""
    from store_helpers import check_a_change_mid_read_is_a_read_error

    check_a_change_mid_read_is_a_read_error(store, fault_proxy, monkeypatch, FAST)


def test_a_failure_that_lasts_ends_in_an_error_naming_the_object_and_the_tries(store, fault_proxy, monkeypatch):
    from store_helpers import configured

    bucket = store.new_bucket()
    store.put(bucket, "obj.tar", _data(6, 500_000))
    through, _ = fault_proxy(store, lambda r: "cut" if r.method == "GET" and r.number > 0 else "ok")
    configured(through, monkeypatch)
    limits = Limits(http_timeout=3, http_retries=2)
    with pytest.raises(ShardReadError) as caught:
        with open_shard(through.url(bucket, "obj.tar"), 0, limits) as stream:
            stream.read()  # the first GET (number 0) answers in full
            stream.close()
        with open_shard(through.url(bucket, "obj.tar"), 0, limits) as stream:
            stream.read()
    message = str(caught.value)
    assert "obj.tar" in message and "gave up" in message and "Limits.http_retries" in message


def test_missing_object_and_missing_bucket_are_distinct_open_errors(store):
    bucket = store.new_bucket()
    with pytest.raises(ShardOpenError, match="does not exist in") as missing_object:
        open_shard(store.url(bucket, "nope.tar"), 0, FAST)
    assert not isinstance(missing_object.value, ShardReadError)
    with pytest.raises(ShardOpenError, match="does not exist in"):
        source_stamp(store.url(bucket, "nope.tar"), FAST)
    # fake-gcs-server answers a GET in a missing bucket with a bare 404 (GCS itself answers
    # NoSuchBucket): the back end asks the bucket, and says which is missing there too.
    with pytest.raises(ShardOpenError, match="the bucket .* does not exist") as missing_bucket:
        open_shard(store.url("no-such-bucket-4242", "x.tar"), 0, FAST)
    assert not isinstance(missing_bucket.value, ShardReadError)
    with pytest.raises(ShardOpenError, match="the bucket .* does not exist"):
        source_stamp(store.url("no-such-bucket-4242", "x.tar"), FAST)
    with pytest.raises(ShardOpenError, match="the bucket .* does not exist"):
        list(backend_for(store.url(bucket)).list(store.url("no-such-bucket-4242", "*.tar"), FAST))


class _Denying(socketserver.ThreadingTCPServer):
    """An S3 server that denies everything: 403 AccessDenied, as S3 answers a key without the permission."""

    allow_reuse_address = True
    daemon_threads = True

    def __init__(self):
        body = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
                b"<Message>Access Denied</Message></Error>")

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\n"
                                 b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def test_access_denied_and_missing_credentials_are_distinct_open_errors(monkeypatch):
    from wds_datapipes.storage import cloud_settings

    monkeypatch.setattr(cloud_settings, "_settings", {})
    monkeypatch.setattr(cloud_settings, "_loaded_env", None)
    monkeypatch.delenv(cloud_settings.SETTINGS_ENV, raising=False)
    denying = _Denying()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{denying.server_address[1]}")
        monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-never-shown")
        with pytest.raises(ShardOpenError, match="access denied") as denied:
            open_shard("s3://bucket/obj.tar", 0, FAST)
        assert "s3cr3t-never-shown" not in str(denied.value)
        # No key in the environment, and no instance metadata service answering (a closed port).
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
        monkeypatch.setenv("AWS_METADATA_ENDPOINT", "http://127.0.0.1:9")
        with pytest.raises(ShardOpenError, match="no usable credentials .*AWS_ACCESS_KEY_ID"):
            open_shard("s3://bucket/obj.tar", 0, FAST)
    finally:
        denying.shutdown()
        denying.server_close()
