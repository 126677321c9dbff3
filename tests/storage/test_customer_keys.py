"""Customer-provided encryption keys (S3 SSE-C, Azure CPK): the key is a secret, and an object
encrypted with one is never read by a presigned URL (its key headers cannot ride in one: S3
answers 400, Azure 409).

The local servers cannot show SSE-C (AIStore's /s3 and Azurite do not implement it, and
obstore sends SSE-C headers only over https), so these tests pin the option handling and the
decision logic without a server: a stand-in for the store calls records what was asked, and
a local HTTP server answers a presigned GET as S3 answers one for an SSE-C object without
its headers (400 InvalidRequest).

Oracles: the key's bytes searched for in every text and pickle a settings object makes; the
calls the stand-in saw; the bytes it served.
"""

from __future__ import annotations

import http.server
import json
import pickle
import threading

import pytest

from wds_datapipes.errors import ShardOpenError, redact
from wds_datapipes.limits import Limits
from wds_datapipes.storage import cloud_settings, object_store, store_calls
from wds_datapipes.storage.cloud_settings import StoreSettings, customer_keyed, object_identity, with_stores
from wds_datapipes.storage.store_calls import StoreFailure

KEY = "c2VjcmV0LXNzZS1jLWtleS0zMi1ieXRlcy1sb25nISE="  # base64 of a 32-byte key
DATA = bytes(range(256)) * 40


@pytest.mark.parametrize("option", ["aws_sse_customer_key_base64", "sse_customer_key_base64",
                                    "azure_storage_encryption_key", "encryption_key"])
def test_a_customer_key_is_refused_as_a_plain_option_and_named_by_its_variable_only(option, monkeypatch):
    with pytest.raises(ValueError, match="must not hold secrets") as refused:
        StoreSettings(options={option: KEY})
    assert KEY not in str(refused.value)
    monkeypatch.setenv("MY_SSE_KEY", KEY)
    settings = StoreSettings(endpoint="https://s3.example", credentials_env={option: "MY_SSE_KEY"})
    url = with_stores("s3://b/k.tar", cloud_settings.PipelineStores.of(settings))
    shown = [repr(settings), str(settings), json.dumps(settings.to_json()), object_identity(url), repr(url)]
    assert not any(KEY in text for text in shown)
    assert KEY.encode() not in pickle.dumps(settings) + pickle.dumps(url)
    assert customer_keyed("s3", settings) and not customer_keyed("s3", StoreSettings())
    assert customer_keyed("s3", StoreSettings(options={"aws_server_side_encryption": "sse-c"}))
    assert not customer_keyed("s3", StoreSettings(options={"aws_server_side_encryption": "aws:kms"}))


def test_a_customer_key_in_a_header_or_an_option_is_redacted():
    for text in (f"x-amz-server-side-encryption-customer-key: {KEY}",
                 f"X-Amz-Server-Side-Encryption-Customer-Key-MD5:{KEY}",
                 f"x-ms-encryption-key: {KEY}",
                 f"config {{'aws_sse_customer_key_base64': '{KEY}', 'region': 'x'}}",
                 f"azure_storage_encryption_key={KEY}"):
        assert KEY not in redact(text), text
    assert KEY not in str(ShardOpenError("s3://b/k", f"failed: x-amz-server-side-encryption-customer-key: {KEY}"))


class _Calls:
    """A stand-in for the agent: signs to ``signed_url`` (or cannot sign), serves DATA by get."""

    def __init__(self, signed_url: str | None):
        self.signed_url, self.asked = signed_url, []

    def sign(self, target, key, expires_s):
        self.asked.append("sign")
        if self.signed_url is None:
            raise StoreFailure(store_calls.REFUSED, "cannot sign here")
        return self.signed_url

    def get(self, target, key, offset, if_match):
        self.asked.append("get")
        return {"size": len(DATA), "e_tag": '"e1"', "range_start": offset}, iter([DATA[offset:]])

    def head(self, target, key):
        return {"size": len(DATA), "e_tag": '"e1"'}


@pytest.fixture
def forked_stand_in(monkeypatch):
    """This process as one forked after obstore started, its store calls made by a stand-in."""
    monkeypatch.setattr(store_calls, "_runtime_pid", -1)
    monkeypatch.setattr(object_store, "_unsigned", set())
    monkeypatch.delenv(cloud_settings.SETTINGS_ENV, raising=False)
    monkeypatch.setattr(cloud_settings, "_settings", {})
    monkeypatch.setattr(cloud_settings, "_loaded_env", None)
    for name in ("AWS_SSE_CUSTOMER_KEY_BASE64", "AZURE_STORAGE_ENCRYPTION_KEY", "AZURE_ENCRYPTION_KEY"):
        monkeypatch.delenv(name, raising=False)

    def use(calls: _Calls) -> _Calls:
        monkeypatch.setattr(object_store, "calls", lambda: calls)
        return calls
    return use


def _read(url: str) -> bytes:
    with object_store.open_object(url, 0, Limits(http_timeout=3, http_retries=2)) as stream:
        return stream.read()


@pytest.mark.parametrize("how", ["settings", "environment"])
def test_a_customer_keyed_store_is_never_read_by_a_presigned_url(forked_stand_in, monkeypatch, how):
    """Oracle: the calls the stand-in saw (no sign where a customer key is set; a sign first otherwise)."""
    url = "s3://b/k.tar"
    if how == "settings":
        url = with_stores(url, cloud_settings.PipelineStores.of(
            StoreSettings(credentials_env={"aws_sse_customer_key_base64": "MY_SSE_KEY"})))
    else:
        monkeypatch.setenv("AWS_SSE_CUSTOMER_KEY_BASE64", KEY)
    calls = forked_stand_in(_Calls(signed_url="http://127.0.0.1:9/never"))
    assert _read(url) == DATA and calls.asked == ["get"]
    monkeypatch.delenv("AWS_SSE_CUSTOMER_KEY_BASE64", raising=False)
    plain = forked_stand_in(_Calls(signed_url=None))
    assert _read("s3://b/plain.tar") == DATA and plain.asked == ["sign", "get"]


@pytest.mark.parametrize(("status", "code"), [(400, "InvalidRequest"), (409, "BlobUsesCustomerSpecifiedEncryption")])
def test_a_presigned_get_refused_for_a_missing_key_header_falls_back_to_the_agent(forked_stand_in, status, code):
    """S3 answers 400 (Azure 409) to a presigned GET of an SSE-C (CPK) object without its key
    headers: the read goes on through the agent, which sends them. Oracle: the bytes the
    stand-in served, and the one GET the local server saw."""
    seen = []

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            body = f"<Error><Code>{code}</Code><Message>key headers missing</Message></Error>".encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        calls = forked_stand_in(_Calls(f"http://127.0.0.1:{server.server_port}/b/k.tar?X-Amz-Signature=s"))
        assert _read("s3://b/k.tar") == DATA
    finally:
        server.shutdown()
        server.server_close()
    assert calls.asked == ["sign", "get"] and len(seen) == 1
    assert any(key[1].bucket == "b" for key in object_store._unsigned)
