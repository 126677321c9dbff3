"""Settings that cannot make a store fail at once, naming what is wrong, and are never retried
as network failures; an Azure connection string is read as the Azure SDKs read it. No
server is needed: a store that cannot be built sends no request.

Oracles: the Azure SDKs' rules for a connection string (azure-storage-blob's
``parse_connection_str``: pairs split at the first ``=``, ``BlobEndpoint`` else
``DefaultEndpointsProtocol://AccountName.blob.EndpointSuffix``, ``AccountKey`` else
``SharedAccessSignature``; ``UseDevelopmentStorage=true`` as Azurite's defaults), written out
by hand per case; and a count of the stores built (one per attempt) with a clock.
"""

from __future__ import annotations

import logging
import pickle
import time

import pytest
from store_env import only

from wds_datapipes.errors import ShardOpenError
from wds_datapipes.limits import Limits
from wds_datapipes.shards.openers import backend_for, open_shard, source_stamp
from wds_datapipes.storage import cloud_settings
from wds_datapipes.storage.cloud_env import (
    DEV_KEY,
    ConfigError,
    azure_connection,
    gcs_emulator,
    parse_connection_string,
)
from wds_datapipes.storage.cloud_settings import StoreSettings

pytest.importorskip("obstore")
pytestmark = pytest.mark.timeout(120)

KEY = "c2VjcmV0LWtleS1vZi10aGUtdGVzdC0xMjM0NTY3ODkwYWJjZGVm"  # base64, like a real account key
SAS = "sv=2022-11-02&ss=b&srt=co&sp=rl&se=2030-01-01T00:00:00Z&sig=abc%2Bdef%3D"


@pytest.mark.parametrize(("text", "expected"), [
    (f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={KEY};EndpointSuffix=core.windows.net",
     {"account_name": "acct", "endpoint": "https://acct.blob.core.windows.net", "account_key": KEY,
      "credential_type": "access_key"}),
    (f"AccountName=acct;AccountKey={KEY}",  # no protocol, no suffix: https, core.windows.net
     {"account_name": "acct", "endpoint": "https://acct.blob.core.windows.net", "account_key": KEY,
      "credential_type": "access_key"}),
    (f"DefaultEndpointsProtocol=http;AccountName=acct;AccountKey={KEY};EndpointSuffix=core.chinacloudapi.cn;",
     {"account_name": "acct", "endpoint": "http://acct.blob.core.chinacloudapi.cn", "account_key": KEY,
      "credential_type": "access_key"}),
    ((f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};"  # Azurite's docs' form
     "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1;"),
     {"account_name": "devstoreaccount1", "endpoint": "http://127.0.0.1:10000/devstoreaccount1", "account_key": KEY,
      "credential_type": "access_key"}),
    (f"BlobEndpoint=https://acct.blob.core.windows.net/;SharedAccessSignature={SAS}",  # a SAS: the account from the host
     {"account_name": "acct", "endpoint": "https://acct.blob.core.windows.net", "sas_key": SAS,
      "credential_type": "sas_token"}),
    (f"blobendpoint=http://localhost:10000/devstoreaccount1;sharedaccesssignature=?{SAS}",  # any case; a leading ?
     {"account_name": "devstoreaccount1", "endpoint": "http://localhost:10000/devstoreaccount1", "sas_key": SAS,
      "credential_type": "sas_token"}),
    (f"AccountName=acct;AccountKey={KEY};SharedAccessSignature={SAS}",  # both: the key, as the SDKs choose
     {"account_name": "acct", "endpoint": "https://acct.blob.core.windows.net", "account_key": KEY,
      "credential_type": "access_key"}),
    ("BlobEndpoint=https://public.blob.core.windows.net",  # no credential: anonymous, as the SDKs go
     {"account_name": "public", "endpoint": "https://public.blob.core.windows.net", "skip_signature": "true"}),
    ("UseDevelopmentStorage=true",
     {"account_name": "devstoreaccount1", "endpoint": "http://127.0.0.1:10000/devstoreaccount1",
      "account_key": DEV_KEY, "credential_type": "access_key"}),
    ("UseDevelopmentStorage=true;DevelopmentStorageProxyUri=http://emulator.local",
     {"account_name": "devstoreaccount1", "endpoint": "http://emulator.local:10000/devstoreaccount1",
      "account_key": DEV_KEY, "credential_type": "access_key"}),
])
def test_connection_strings_are_read_as_the_azure_sdks_read_them(text, expected):
    assert parse_connection_string(text) == expected


def test_use_development_storage_goes_where_obstore_s_emulator_setting_goes():
    """AZURITE_BLOB_STORAGE_URL moves obstore's emulator; it moves UseDevelopmentStorage=true too."""
    environ = {"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true",
               "AZURITE_BLOB_STORAGE_URL": "http://127.0.0.1:41234/"}
    assert azure_connection(environ)["endpoint"] == "http://127.0.0.1:41234/devstoreaccount1"


def test_obstore_s_own_account_variable_comes_before_a_connection_string():
    """What worked before keeps working: where AZURE_STORAGE_ACCOUNT_NAME names the account,
    obstore reads the AZURE_* variables as it did, and the connection string is not read."""
    text = f"AccountName=other;AccountKey={KEY}"
    assert azure_connection({"AZURE_STORAGE_CONNECTION_STRING": text})["account_name"] == "other"
    assert azure_connection({"AZURE_STORAGE_CONNECTION_STRING": text, "AZURE_STORAGE_ACCOUNT_NAME": "mine"}) is None
    assert azure_connection({}) is None and azure_connection({"AZURE_STORAGE_CONNECTION_STRING": " "}) is None


@pytest.mark.parametrize(("text", "words"), [
    (f"AccountName=acct;{KEY}", "part 2 of 2 is not Name=Value"),  # a key pasted without its name
    (f"AccountKey={KEY}", "names no storage account"),
    (f"AccountName=acct;AccountKey={KEY};DefaultEndpointsProtocol=ftp", "DefaultEndpointsProtocol must be"),
    (f"BlobEndpoint=acct.blob.core.windows.net;AccountKey={KEY}", "BlobEndpoint is not a URL"),
])
def test_a_connection_string_that_cannot_be_used_is_refused_naming_the_part_never_its_value(text, words):
    with pytest.raises(ConfigError, match=words) as refused:
        parse_connection_string(text)
    assert KEY not in str(refused.value) and "acct.blob" not in str(refused.value)


def test_the_emulator_host_is_a_base_url_as_google_s_clients_take_it():
    assert gcs_emulator({"STORAGE_EMULATOR_HOST": "localhost:4443"}) == "http://localhost:4443"
    assert gcs_emulator({"STORAGE_EMULATOR_HOST": "https://gcs.local:8443/"}) == "https://gcs.local:8443"
    assert gcs_emulator({}) is None and gcs_emulator({"STORAGE_EMULATOR_HOST": ""}) is None


class _Counted:
    """``cloud_settings.build_store``, counting the stores asked for: one per attempt."""

    def __init__(self, monkeypatch):
        self.calls = 0
        self._build = cloud_settings.build_store
        monkeypatch.setattr(cloud_settings, "build_store", self)

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self._build(*args, **kwargs)


def _fails_at_once(monkeypatch, caplog, action) -> ShardOpenError:
    """``action()`` raises a ShardOpenError after one attempt, within 2 s (a retried failure
    takes 10-12 s: six tries with backoff), with no retry logged."""
    counted = _Counted(monkeypatch)
    caplog.set_level(logging.INFO, logger="wds_datapipes")
    started = time.monotonic()
    with pytest.raises(ShardOpenError) as failed:
        action()
    elapsed = time.monotonic() - started
    assert counted.calls == 1, f"{counted.calls} attempts: {failed.value}"
    assert elapsed < 2.0, f"{elapsed:.1f} s: {failed.value}"
    assert not [r for r in caplog.records if "trying again" in r.getMessage()]
    return failed.value


LIMITS = Limits(http_timeout=3, http_retries=5)  # the defaults' count of retries, shorter reads


@pytest.mark.parametrize("how", ["open", "stamp", "list"])
def test_no_azure_account_fails_at_once_naming_what_is_missing(monkeypatch, caplog, how):
    """No AZURE_* variable at all (obstore: "Account must be specified"): one attempt, and the
    error says which variables name an account, the connection string among them."""
    only(monkeypatch)
    url = "az://container/train/shard-0.tar"
    action = {"open": lambda: open_shard(url, 0, LIMITS), "stamp": lambda: source_stamp(url, LIMITS),
              "list": lambda: list(backend_for(url).list("az://container/train/*.tar", LIMITS))}[how]
    message = str(_fails_at_once(monkeypatch, caplog, action))
    assert "no storage account is named" in message and "AZURE_STORAGE_CONNECTION_STRING" in message
    assert "transient" not in message


def test_a_connection_string_that_cannot_be_used_fails_at_once_and_never_shows_its_key(monkeypatch, caplog):
    only(monkeypatch, AZURE_STORAGE_CONNECTION_STRING=f"AccountName=acct;{KEY}")
    failed = _fails_at_once(monkeypatch, caplog, lambda: open_shard("az://c/k.tar", 0, LIMITS))
    assert "AZURE_STORAGE_CONNECTION_STRING is malformed: part 2 of 2" in str(failed)
    for shown in (str(failed), repr(failed), pickle.dumps(failed), caplog.text):
        assert (KEY.encode() if isinstance(shown, bytes) else KEY) not in shown


@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
def test_an_option_the_store_does_not_know_fails_at_once_naming_it(monkeypatch, caplog, scheme):
    only(monkeypatch, AZURE_STORAGE_ACCOUNT_NAME="acct", AZURE_STORAGE_ACCOUNT_KEY=KEY)
    store = StoreSettings(options={"no_such_option_42": "1"})
    cloud_settings.set_store_settings(f"{scheme}://", store)
    failed = _fails_at_once(monkeypatch, caplog, lambda: open_shard(f"{scheme}://b/k.tar", 0, LIMITS))
    assert f"the settings for {scheme}://b cannot be used" in str(failed) and "no_such_option_42" in str(failed)


def test_a_credentials_variable_that_is_not_set_fails_at_once_naming_it(monkeypatch, caplog):
    only(monkeypatch)
    cloud_settings.set_store_settings("s3://", StoreSettings(
        endpoint="http://127.0.0.1:9", credentials_env={"access_key_id": "TEAM_KEY_ID_42",
                                                        "secret_access_key": "TEAM_SECRET_42"}))
    failed = _fails_at_once(monkeypatch, caplog, lambda: open_shard("s3://b/k.tar", 0, LIMITS))
    assert "the settings for s3://b cannot be used" in str(failed) and "$TEAM_KEY_ID_42" in str(failed)


def test_no_azure_account_fails_at_once_through_the_store_agent_too(monkeypatch, caplog, forked):
    """In a process forked after obstore started, the store is built in its agent: the same
    words come back over the pipe, and nothing is retried (no "trying again" logged)."""
    only(monkeypatch)
    caplog.set_level(logging.INFO, logger="wds_datapipes")
    with pytest.raises(ShardOpenError) as failed:
        open_shard("az://container/shard-0.tar", 0, LIMITS)
    assert "no storage account is named" in str(failed.value) and "transient" not in str(failed.value)
    assert not [r for r in caplog.records if "trying again" in r.getMessage()]


@pytest.mark.parametrize("named", [{"credentials_env": {"account_key": "TEAM_KEY"}}, {"options": {"use_azure_cli": "true"}},
                                   {"options": {"client_id": "y", "tenant_id": "z", "msi_endpoint": "http://169.254.169.254"}},
                                   {"anonymous": True}])
def test_credentials_named_in_code_are_not_mixed_with_the_connection_string_s(monkeypatch, named):
    """StoreSettings naming a credential (its secret through a variable, or a way to get one as
    options: the Azure CLI, a managed identity) or none at all (anonymous): the connection string gives the account and endpoint only (its SAS
    would otherwise be forced by credential_type beside the key named in code)."""
    only(monkeypatch, AZURE_STORAGE_CONNECTION_STRING=f"AccountName=acct;SharedAccessSignature={SAS}",
         TEAM_KEY=KEY)
    options = cloud_settings._environment_options("az", StoreSettings(**named))
    assert options == {"account_name": "acct", "endpoint": "https://acct.blob.core.windows.net"}
    assert cloud_settings._environment_options("az", StoreSettings())["credential_type"] == "sas_token"
    for own in ({"options": {"container_name": "c"}}, {"credentials_env": {"encryption_key": "TEAM_KEY"}}):
        assert cloud_settings._environment_options("az", StoreSettings(**own))["sas_key"] == SAS  # no credential


@pytest.mark.parametrize("named", [{"options": {"service_account_path": "/k.json"}}, {"options": {"base_url": "http://gcs"}},
                                   {"credentials_env": {"service_account_key": "TEAM_KEY"}},
                                   {"endpoint": "http://gcs"}])
def test_credentials_or_a_base_url_named_in_code_come_before_the_gcs_emulator_variable(monkeypatch, named):
    """As the docs say: a StoreSettings with an endpoint or credentials comes first; a bucket option does not count."""
    only(monkeypatch, STORAGE_EMULATOR_HOST="localhost:4443", TEAM_KEY=KEY)
    assert cloud_settings._environment_options("gs", StoreSettings(**named)) == {}
    assert cloud_settings._environment_options("gs", StoreSettings(options={"bucket": "b"}))["base_url"] == \
        "http://localhost:4443"
