"""The first things object-store users meet, against the real emulators with only the
settings such a user already has: Azurite with ``AZURE_STORAGE_CONNECTION_STRING`` alone,
fake-gcs-server with ``STORAGE_EMULATOR_HOST`` alone; "no credentials" told apart from
"denied"; a missing bucket named as one on every scheme; a connection string's key shown
nowhere.

Oracles: the bytes the servers' own writer put (``ObjectServer.put``: plain ``urllib`` and a
SharedKey signer of the tests, sharing no code with obstore or the back ends), and objects
the library uploaded read back by that independent path (Azure: a SharedKey-signed GET;
GCS: the JSON API's ``alt=media``).
"""

from __future__ import annotations

import http.server
import pickle
import random
import threading
import urllib.parse
import urllib.request

import pytest
from object_servers import AZURE_ACCOUNT, _az_request
from store_env import only
from store_helpers import read_object

from wds_datapipes.cache.store import key_of
from wds_datapipes.errors import ShardOpenError, ShardReadError
from wds_datapipes.limits import Limits
from wds_datapipes.shards.openers import backend_for, open_shard, source_stamp
from wds_datapipes.storage.cloud_settings import object_identity

pytest.importorskip("obstore")
pytestmark = pytest.mark.timeout(240)

FAST = Limits(http_timeout=3, http_retries=3)


def _round_trip(server, bucket: str, read_back, tmp_path) -> None:
    """Read, stamp and list what the independent writer put; upload a file and read it back
    by the independent reader ``read_back(bucket, key)``."""
    data = random.Random(36).randbytes(300_001)
    server.put(bucket, "train/shard-000000.tar", data)
    url = server.url(bucket, "train/shard-000000.tar")
    assert read_object(url) == data
    with open_shard(url, 123_456, FAST) as stream:
        assert stream.read() == data[123_456:]
    assert source_stamp(url, FAST)[0] == len(data)
    assert list(backend_for(url).list(server.url(bucket, "train/*.tar"), FAST)) == [url]
    written = random.Random(37).randbytes(70_000)
    (tmp_path / "up.tar").write_bytes(written)
    backend_for(url).put(str(tmp_path / "up.tar"), server.url(bucket, "out/up.tar"), FAST)
    assert read_back(bucket, "out/up.tar") == written


def _azure_get(server):
    return lambda bucket, key: _az_request("GET", f"{server.endpoint}/{AZURE_ACCOUNT}/{bucket}/{key}")


def _gcs_get(server):
    def get(bucket: str, key: str) -> bytes:
        name = urllib.parse.quote(key, safe="")
        with urllib.request.urlopen(f"{server.endpoint}/storage/v1/b/{bucket}/o/{name}?alt=media", timeout=30) as r:
            return r.read()
    return get


@pytest.mark.parametrize("process", ["in-process", "forked"])
def test_the_azure_connection_string_alone_reaches_azurite(azure_server, monkeypatch, tmp_path, request, process):
    """The string Azurite's docs give (DefaultEndpointsProtocol, AccountName, AccountKey,
    BlobEndpoint) and nothing else; in a process forked after obstore started too (its
    calls go through the store agent, which inherits the environment)."""
    only(monkeypatch, AZURE_STORAGE_CONNECTION_STRING=azure_server.env["AZURE_STORAGE_CONNECTION_STRING"])
    if process == "forked":
        request.getfixturevalue("forked")
    _round_trip(azure_server, azure_server.new_bucket(), _azure_get(azure_server), tmp_path)


def test_use_development_storage_reaches_azurite_where_obstore_s_emulator_url_points(azure_server, monkeypatch,
                                                                                      tmp_path):
    """``UseDevelopmentStorage=true``: Azurite's published account and key; its address is
    obstore's ``AZURITE_BLOB_STORAGE_URL`` (the fixture's Azurite is not on port 10000)."""
    only(monkeypatch, AZURE_STORAGE_CONNECTION_STRING="UseDevelopmentStorage=true",
         AZURITE_BLOB_STORAGE_URL=azure_server.endpoint)
    _round_trip(azure_server, azure_server.new_bucket(), _azure_get(azure_server), tmp_path)


def test_a_connection_string_s_key_is_in_no_error_log_pickle_or_cache_key(azure_server, monkeypatch, caplog):
    """A wrong key (valid base64, not Azurite's): the denial names the object, and the key
    appears in no message, repr, pickle, log record, cache key or object identity."""
    key = "d3Jvbmcta2V5LWZvci10aGUtdGVzdC0wMTIzNDU2Nzg5YWJjZGVmZ2hpamtsbW5v"
    text = azure_server.env["AZURE_STORAGE_CONNECTION_STRING"].replace(_account_key(azure_server), key)
    assert key in text
    only(monkeypatch, AZURE_STORAGE_CONNECTION_STRING=text)
    caplog.set_level("DEBUG")
    bucket = azure_server.new_bucket()
    azure_server.put(bucket, "k.tar", b"x" * 1000)
    url = azure_server.url(bucket, "k.tar")
    with pytest.raises(ShardOpenError) as denied:
        open_shard(url, 0, FAST)
    assert f"az://{bucket}" in str(denied.value)
    shown = [str(denied.value), repr(denied.value), pickle.dumps(denied.value).decode("latin-1"), caplog.text,
             object_identity(url), key_of(url)]
    for where in shown:
        assert key not in where and text not in where
    assert f"account={AZURE_ACCOUNT}" in object_identity(url)  # the account is named, its key is not


def _account_key(server) -> str:
    return dict(part.split("=", 1) for part in server.env["AZURE_STORAGE_CONNECTION_STRING"].split(";")
                if part)["AccountKey"]


@pytest.mark.parametrize("host", ["url", "host:port"])
@pytest.mark.parametrize("process", ["in-process", "forked"])
def test_the_gcs_emulator_variable_alone_reaches_fake_gcs_server(gcs_server, monkeypatch, tmp_path, request,
                                                                  process, host):
    """``STORAGE_EMULATOR_HOST`` alone (as a URL, and as ``host:port`` the way Google's clients
    take it): unauthenticated requests to it, no metadata server asked."""
    emulator = gcs_server.endpoint if host == "url" else gcs_server.endpoint.partition("://")[2]
    only(monkeypatch, STORAGE_EMULATOR_HOST=emulator, HOME=str(tmp_path))
    if process == "forked":
        request.getfixturevalue("forked")
    _round_trip(gcs_server, gcs_server.new_bucket(), _gcs_get(gcs_server), tmp_path)


class _Refusing(http.server.ThreadingHTTPServer):
    """An HTTP server that answers 403 to every request (and counts them)."""

    def __init__(self):
        self.requests = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _refuse(self):
                outer.requests += 1
                body = b"<Error><Code>AccessDenied</Code><Message>denied</Message></Error>"
                self.send_response(403)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = do_PUT = do_POST = _refuse

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def refusing():
    server = _Refusing()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("metadata", ["refuses", "absent"])
def test_no_gcs_credentials_is_not_called_a_denial(gcs_server, monkeypatch, tmp_path, refusing, metadata):
    """No credentials anywhere, and the metadata server refusing (403, as a sandbox's egress
    rule answers) or not there: "no usable credentials", never "access denied"."""
    where = refusing.address if metadata == "refuses" else "127.0.0.1:9"  # the discard port: nothing listens
    only(monkeypatch, GOOGLE_BASE_URL=gcs_server.endpoint, GCE_METADATA_HOST=where, GCE_METADATA_IP=where,
         HOME=str(tmp_path))
    bucket = gcs_server.new_bucket()
    gcs_server.put(bucket, "k.tar", b"x" * 100)
    with pytest.raises(ShardOpenError) as failed:
        open_shard(gcs_server.url(bucket, "k.tar"), 0, FAST)
    message = str(failed.value)
    assert f"no usable credentials for gs://{bucket}" in message and "STORAGE_EMULATOR_HOST" in message
    assert "access denied" not in message and "lack the permission" not in message
    assert metadata == "absent" or refusing.requests > 0  # the refusal did come from it


def test_a_gcs_denial_is_called_a_denial(monkeypatch, tmp_path, refusing):
    """The store itself answers 403: "access denied" naming the object, not "no credentials"."""
    only(monkeypatch, STORAGE_EMULATOR_HOST=f"http://{refusing.address}", HOME=str(tmp_path))
    with pytest.raises(ShardOpenError) as failed:
        open_shard("gs://bucket/k.tar", 0, FAST)
    assert "access denied to gs://bucket/k.tar" in str(failed.value)
    assert "no usable credentials" not in str(failed.value) and refusing.requests > 0


def test_a_missing_bucket_and_a_missing_object_are_named_alike_on_every_scheme(store):
    """One wording on s3://, gs:// and az:// (fake-gcs-server answers a GET in a missing bucket
    with a bare 404, so the back end asks whether the bucket is there)."""
    bucket = store.new_bucket()
    missing = f"no-such-bucket-{random.Random().randrange(10**9)}"
    for action in (lambda url: open_shard(url, 0, FAST), lambda url: source_stamp(url, FAST)):
        with pytest.raises(ShardOpenError) as no_object:
            action(store.url(bucket, "train/nope.tar"))
        assert f"the object 'train/nope.tar' does not exist in {store.scheme}://{bucket} (" in str(no_object.value)
        with pytest.raises(ShardOpenError) as no_bucket:
            action(store.url(missing, "train/x.tar"))
        assert f"the bucket {store.scheme}://{missing} does not exist (" in str(no_bucket.value)
        assert not isinstance(no_bucket.value, ShardReadError)
    with pytest.raises(ShardOpenError) as no_bucket:
        list(backend_for(store.url(bucket)).list(store.url(missing, "train/*.tar"), FAST))
    assert f"the bucket {store.scheme}://{missing} does not exist (" in str(no_bucket.value)
