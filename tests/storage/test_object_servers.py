"""The test servers (AIStore's S3 API, Azurite, fake-gcs-server) serve independent clients
directly and through the fault proxy, start fast and stop without leaving a process.

Oracle: the bytes written by the fixtures' own writer (``ObjectServer.put``: plain
``urllib``, a hand-made SharedKey signature for Azure) read back by clients that share no
code with it: obstore's S3Store / GCSStore / AzureStore and boto3.
"""

from __future__ import annotations

import random
import socket

import pytest
from fault_proxy import first_faults
from object_servers import (
    ObjectServer,
    ServerError,
    ServerUnavailable,
    _Process,
    group_members,
    start_azurite,
    start_fake_gcs,
)
from server_fixtures import cannot_have

obstore = pytest.importorskip("obstore")

pytestmark = pytest.mark.timeout(180)


def _store(server: ObjectServer, bucket: str, monkeypatch):
    """An obstore store of ``bucket``, configured by nothing but the server's standard env variables."""
    from obstore.store import AzureStore, GCSStore, S3Store

    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    return {"s3": S3Store, "gs": GCSStore, "az": AzureStore}[server.scheme](bucket)


def _objects(seed: int) -> dict[str, bytes]:
    rng = random.Random(seed)
    return {f"dir/obj-{i}.bin": rng.randbytes(rng.randrange(1, 300_000)) for i in range(3)} | {"top.txt": b"x"}


def _round_trip(server: ObjectServer, monkeypatch) -> None:
    bucket = server.new_bucket()
    objects = _objects(len(bucket))
    for key, data in objects.items():
        server.put(bucket, key, data)
    store = _store(server, bucket, monkeypatch)
    for key, data in objects.items():
        assert obstore.get(store, key).bytes() == data
        assert obstore.head(store, key)["size"] == len(data)
        start = len(data) // 3
        assert bytes(obstore.get_range(store, key, start=start, end=len(data))) == data[start:]
    listed = sorted(m["path"] for batch in obstore.list(store, prefix="dir/") for m in batch)
    assert listed == sorted(k for k in objects if k.startswith("dir/"))
    obstore.put(store, "new/written.bin", b"by obstore" * 1000)
    assert obstore.get(store, "new/written.bin").bytes() == b"by obstore" * 1000
    obstore.delete(store, "top.txt")
    with pytest.raises(FileNotFoundError):
        obstore.head(store, "top.txt")


def test_each_store_serves_obstore_put_get_range_list_head_delete(object_server, monkeypatch):
    _round_trip(object_server, monkeypatch)


def test_each_store_serves_obstore_through_a_proxy_that_answers_503_first(object_server, fault_proxy,
                                                                           monkeypatch):
    """Every first GET of an object is answered 503 by the proxy: obstore retries, reads the
    same bytes, and the proxy counts each fault it injected."""
    proxied, proxy = fault_proxy(object_server, first_faults("503"), retry_after=0)
    _round_trip(proxied, monkeypatch)
    assert proxy.injected["503"] >= 4
    assert proxy.faults == proxy.injected["503"]
    assert all(e.status == 0 for e in proxy.log if e.fault == "503")  # the server never saw those


@pytest.mark.parametrize("proxied", [False, True], ids=["direct", "proxy"])
def test_aistore_s3_serves_boto3_put_get_range_list_head_delete(s3_server, fault_proxy, proxied):
    boto3 = pytest.importorskip("boto3")
    from botocore.config import Config

    server, proxy = fault_proxy(s3_server, first_faults("reset")) if proxied else (s3_server, None)
    bucket = server.new_bucket()
    data = random.Random(7).randbytes(100_000)
    server.put(bucket, "a/raw.bin", data)
    s3 = boto3.client("s3", endpoint_url=server.env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                      aws_access_key_id="any", aws_secret_access_key="any",
                      config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3, "mode": "standard"}))
    assert s3.get_object(Bucket=bucket, Key="a/raw.bin")["Body"].read() == data
    assert s3.get_object(Bucket=bucket, Key="a/raw.bin", Range="bytes=10-19")["Body"].read() == data[10:20]
    s3.put_object(Bucket=bucket, Key="a/boto.bin", Body=b"boto" * 1000)
    assert s3.head_object(Bucket=bucket, Key="a/boto.bin")["ContentLength"] == 4000
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="a/")["Contents"]]
    assert keys == ["a/boto.bin", "a/raw.bin"]
    s3.delete_object(Bucket=bucket, Key="a/boto.bin")
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["a/raw.bin"]
    if proxy is not None:
        assert proxy.injected["reset"] == 2  # the first GET of the object and the first of the bucket (a listing)


# ---------------------------------------------------------------- starting and stopping


@pytest.mark.parametrize("start", [start_fake_gcs, start_azurite], ids=["fake-gcs", "azurite"])
def test_a_server_stops_with_nothing_of_it_left(start):
    try:
        with start() as server:
            bucket = server.new_bucket()
            server.put(bucket, "k", b"v")
            pid = server.pid
            assert group_members(pid) == [pid]
    except ServerUnavailable as exn:
        cannot_have(str(exn))
    assert group_members(pid) == []
    host, port = server.endpoint.removeprefix("http://").split(":")
    with pytest.raises(OSError):
        socket.create_connection((host, int(port)), timeout=1).close()


def test_a_server_that_exits_at_start_is_an_error_with_its_log_tail(tmp_path):
    server = _Process("broken", ["sh", "-c", "echo cannot bind the port; exit 3"], tmp_path)
    with pytest.raises(ServerError, match="(?s)exited with status 3.*cannot bind the port"):
        server.wait_ready(lambda: False, timeout=30)
    server.stop()


def test_a_server_that_never_answers_is_an_error_within_the_timeout(tmp_path):
    server = _Process("silent", ["sh", "-c", "echo starting; exec sleep 60"], tmp_path)
    with pytest.raises(ServerError, match="(?s)did not answer within 1 s.*starting"):
        server.wait_ready(lambda: False, timeout=1)
    assert server.proc.poll() is not None and group_members(server.proc.pid) == []


def test_the_servers_cache_folder_is_aisnode_s(monkeypatch, tmp_path):
    import object_servers

    from aisio.cluster.config import cache_dir

    assert object_servers.cache_dir() == cache_dir()
    monkeypatch.setenv("WDS_DATAPIPES_CACHE", str(tmp_path))
    assert object_servers.cache_dir() == cache_dir() == tmp_path
