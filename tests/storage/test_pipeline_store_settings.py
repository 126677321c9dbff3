"""Object-store settings given to one pipeline in code (``ShardLister(urls, store=...)``,
``ExactEpochs``/``MixedEpochs``/``build_index``'s ``store``): each pipeline reaches its own
server, ahead of the process's ``set_store_settings``, in the main process and in
DataLoader workers started by fork and by spawn, with no secret in a pickle.

Oracles: the objects' bytes as written, read back by Python's ``tarfile``; which server each
request reached (each pipeline's own fault proxy's request log, and an empty log for the
proxy that the process's settings or environment point at).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import socket
import subprocess
import sys
import tarfile
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stack import needs_dataloader2
from store_helpers import configured, shard_bytes

import wds_datapipes as wd
from wds_datapipes.cache import store as cache_store
from wds_datapipes.epochs.index import ShardIndex, ShardInfo, build_index
from wds_datapipes.errors import ShardOpenError, ShardReadError
from wds_datapipes.shards.openers import LocalPath
from wds_datapipes.storage import cloud_settings
from wds_datapipes.storage.cloud_settings import (
    PipelineStores,
    StoreSettings,
    StoreUrl,
    object_identity,
    settings_for,
    with_stores,
)

pytestmark = pytest.mark.timeout(300)


def _members(data: bytes) -> list[tuple[str, bytes]]:
    """The oracle: the files of a tar as Python's tarfile reads them."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers() if m.isfile()]


def _settings(endpoint: str, **more) -> StoreSettings:
    return StoreSettings(endpoint=endpoint, region="us-east-1", path_style=True, **more)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _gets(proxy) -> list[str]:
    """The objects the proxy's clients asked for (GETs of shards; listings left out)."""
    return sorted(e.path for e in proxy.log if e.method == "GET" and e.path.endswith(".tar"))


# ------------------------------------------------------------ no server


def test_a_pipeline_s_settings_come_before_the_process_s_even_under_a_longer_prefix(monkeypatch):
    monkeypatch.delenv(cloud_settings.SETTINGS_ENV, raising=False)
    monkeypatch.setattr(cloud_settings, "_settings", {})
    monkeypatch.setattr(cloud_settings, "_loaded_env", None)
    process = StoreSettings(endpoint="http://process:1")
    cloud_settings.set_store_settings("s3://bucket/train/", process)
    try:
        own = PipelineStores.of(StoreSettings(endpoint="http://own:2"))
        by_prefix = PipelineStores.of({"s3://bucket": StoreSettings(endpoint="http://b:3"),
                                       "s3://bucket/val/": StoreSettings(endpoint="http://v:4")})
        url = "s3://bucket/train/a.tar"
        assert settings_for(url) == process
        assert settings_for(with_stores(url, own)).endpoint == "http://own:2"
        assert settings_for(with_stores(url, by_prefix)).endpoint == "http://b:3"
        assert settings_for(with_stores("s3://bucket/val/a.tar", by_prefix)).endpoint == "http://v:4"
        assert settings_for(with_stores("s3://other/train/a.tar", by_prefix)) == StoreSettings()  # not its prefix
        assert settings_for(with_stores("s3://bucket/train/a.tar", None)) == process
    finally:
        cloud_settings.set_store_settings("s3://bucket/train/", None)


PREFIXES = st.lists(st.sampled_from(["s3://", "s3://b", "s3://b/", "s3://b/t", "s3://b/t/x", "s3://bb", "gs://",
                                      "gs://b/"]), unique=True, max_size=4)


@settings(max_examples=60, deadline=None)
@given(process=PREFIXES, own=PREFIXES, whole=st.booleans(),
       key=st.sampled_from(["s3://b/t/x.tar", "s3://bb/t.tar", "gs://b/a.tar", "az://b/a.tar", "s3://b/u.tar"]))
def test_which_settings_a_url_gets_follows_the_documented_rule(process, own, whole, key):
    """Oracle: a model of docs/storage.md's rule: the pipeline's longest prefix of the URL
    (a bare StoreSettings: every URL), else the process's longest, else the defaults."""
    named = {p: StoreSettings(region=f"process {p}") for p in process}
    given_ = StoreSettings(region="own") if whole else {p: StoreSettings(region=f"own {p}") for p in own}
    saved = (os.environ.pop(cloud_settings.SETTINGS_ENV, None), dict(cloud_settings._settings), cloud_settings._loaded_env)
    try:
        cloud_settings._settings.clear()
        for prefix, value in named.items():
            cloud_settings.set_store_settings(prefix, value)
        got = settings_for(with_stores(key, PipelineStores.of(given_ or None)))
    finally:
        for prefix in named:
            cloud_settings.set_store_settings(prefix, None)
        if saved[0] is not None:
            os.environ[cloud_settings.SETTINGS_ENV] = saved[0]
        cloud_settings._settings.clear()
        cloud_settings._settings.update(saved[1])
        cloud_settings._loaded_env = saved[2]
    own_matches = [p for p in (given_ if isinstance(given_, dict) else [""]) if key.startswith(p)]
    process_matches = [p for p in named if key.startswith(p)]
    if own_matches and given_:
        expected = given_ if whole else given_[max(own_matches, key=len)]
    elif process_matches:
        expected = named[max(process_matches, key=len)]
    else:
        expected = StoreSettings()
    assert got == expected


def test_a_url_carries_its_pipeline_s_settings_through_pickles_and_paths_stay_paths():
    stores = PipelineStores.of(StoreSettings(endpoint="http://own:2", credentials_env={"secret_access_key": "ENV"}))
    url = with_stores("s3://b/k.tar", stores)
    back = pickle.loads(pickle.dumps(url))
    assert isinstance(back, StoreUrl) and back == "s3://b/k.tar" and back.stores == stores
    assert repr(back) == repr("s3://b/k.tar") and f"{back}" == "s3://b/k.tar"  # messages show the URL only
    found = LocalPath("s3://b/k.tar")  # a file on disk whose name reads as a URL stays a file
    assert with_stores(found, stores) is found
    assert with_stores("/data/a.tar", stores) == "/data/a.tar" and with_stores("http://h/a.tar", stores) == "http://h/a.tar"
    with pytest.raises(ValueError, match="settings prefix"):
        PipelineStores.of({"b/": StoreSettings()})
    with pytest.raises(TypeError, match="StoreSettings"):
        PipelineStores.of({"s3://b": {"endpoint": "http://x"}})


def test_the_cache_key_tells_one_bucket_on_two_endpoints_apart(monkeypatch):
    for variable in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT",
                     "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT"):
        monkeypatch.delenv(variable, raising=False)
    plain = "s3://b/k.tar"
    one = with_stores(plain, PipelineStores.of(StoreSettings(endpoint="http://one:1")))
    two = with_stores(plain, PipelineStores.of(StoreSettings(endpoint="http://two:2")))
    assert object_identity(plain) == plain and object_identity("/data/a.tar") == "/data/a.tar"
    assert len({cache_store.key_of(plain), cache_store.key_of(one), cache_store.key_of(two)}) == 3
    accounts = [with_stores("az://c/k.tar", PipelineStores.of(StoreSettings(options={"account_name": name})))
                for name in ("alpha", "beta")]
    assert cache_store.key_of(accounts[0]) != cache_store.key_of(accounts[1])  # one path in two Azure accounts


@pytest.mark.parametrize(("scheme", "variables"), [
    ("s3", ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")),
    ("gs", ("GOOGLE_BASE_URL",)),
    ("az", ("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT", "AZURE_STORAGE_ACCOUNT_NAME")),
])
def test_the_cache_key_tells_one_bucket_on_two_endpoints_set_by_the_environment_apart(monkeypatch, scheme, variables):
    """One bucket/key on two servers named only by the cloud's environment variables (the ones
    obstore reads) is two cache keys; the same server, one key; and no user, password or query
    of an endpoint goes into the identity. Oracle: the endpoint each key was made under."""
    from wds_datapipes.storage import cloud_settings

    monkeypatch.setattr(cloud_settings, "_settings", {})
    monkeypatch.setattr(cloud_settings, "_loaded_env", None)
    monkeypatch.delenv(cloud_settings.SETTINGS_ENV, raising=False)
    for names in cloud_settings._ENDPOINT_ENV.values():
        for name in names:
            monkeypatch.delenv(name, raising=False)
    for name in cloud_settings._ACCOUNT_ENV:
        monkeypatch.delenv(name, raising=False)
    url = f"{scheme}://b/shards/k.tar"
    keys = {}
    for variable in variables:
        for server in ("http://one:9000", "http://two:9000"):
            value = f"{server[:7]}user:topsecret@{server[7:]}/?sig=hidden" if "ACCOUNT" not in variable else server[7:]
            monkeypatch.setenv(variable, value)
            keys[variable, server] = cache_store.key_of(url)
            assert cache_store.key_of(url) == keys[variable, server]  # the same endpoint: the same key
            identity = object_identity(url)
            assert "topsecret" not in identity and "hidden" not in identity and "user" not in identity
            monkeypatch.delenv(variable)
        assert keys[variable, "http://one:9000"] != keys[variable, "http://two:9000"]
    assert cache_store.key_of(url) not in keys.values()  # no endpoint set: the URL alone


def test_an_index_given_settings_carries_them_on_its_object_urls_only(tmp_path):
    index = ShardIndex([ShardInfo("s3://b/a.tar", 1), ShardInfo(str(tmp_path / "x.tar"), 1)])
    settings_ = StoreSettings(endpoint="http://own:2")
    carried = index.with_store(settings_)
    assert isinstance(carried.url(0), StoreUrl) and carried.url(0).stores.settings_for("s3://b/a.tar") == settings_
    assert not isinstance(carried.url(1), StoreUrl) and not isinstance(index.url(0), StoreUrl)  # the original unchanged
    assert index.with_store(None) is index


# ------------------------------------------------------------ against the S3 server


@pytest.fixture
def two_ways(s3_server, fault_proxy, monkeypatch):
    """A bucket of shards ``a-0``, ``a-1`` (read by pipeline A), ``b-0``, ``b-1`` (B) and ``c-0`` (C);
    a proxy for each pipeline and one for the process's own settings, each logging its requests."""
    server = configured(s3_server, monkeypatch)
    bucket = server.new_bucket()
    written = {}
    for name in ("a-0", "a-1", "b-0", "b-1", "c-0"):
        written[name] = shard_bytes(name, 4, size=3000)
        server.put(bucket, f"{name}.tar", written[name])
    proxies = {who: fault_proxy(server)[1] for who in ("A", "B", "process")}
    return bucket, written, proxies


def test_two_pipelines_naming_one_bucket_each_reach_their_own_endpoint(two_ways):
    """Interleaved in one process: A's and B's requests reach only A's and B's proxies, the
    process's settings (for ``s3://`` and for the bucket) only the pipeline without its own,
    and a pipeline pointed at a closed port fails alone. Oracle: tarfile over the bytes
    written; the proxies' request logs."""
    bucket, written, proxies = two_ways
    endpoint = {who: proxy.url + "/s3" for who, proxy in proxies.items()}
    cloud_settings.set_store_settings("s3://", _settings(endpoint["process"]))
    cloud_settings.set_store_settings(f"s3://{bucket}", _settings(endpoint["process"]))  # longer: still after A's, B's
    try:
        a = wd.ShardLister(f"s3://{bucket}/a-*.tar", store=_settings(endpoint["A"])).load_tar()
        b = wd.ShardLister([f"s3://{bucket}/b-0.tar", f"s3://{bucket}/b-1.tar"],
                           store={f"s3://{bucket}": _settings(endpoint["B"])}).load_tar()
        got = {"A": [], "B": []}
        for step, (from_a, from_b) in enumerate(zip(a, b)):
            got["A"].append(from_a)
            got["B"].append(from_b)
            if step == 3:  # a third pipeline, same bucket, a server that is not there: it alone fails
                wrong = _settings(f"http://127.0.0.1:{_closed_port()}/s3")
                lost = wd.ShardLister(f"s3://{bucket}/a-0.tar", store=wrong).load_tar(
                    limits=wd.Limits(http_retries=0, http_timeout=5))
                with pytest.raises((ShardOpenError, ShardReadError), match="a-0.tar"):
                    list(lost)
        plain = list(wd.ShardLister(f"s3://{bucket}/c-0.tar").load_tar())
    finally:
        cloud_settings.set_store_settings("s3://", None)
        cloud_settings.set_store_settings(f"s3://{bucket}", None)
    for who, names in (("A", ["a-0", "a-1"]), ("B", ["b-0", "b-1"])):
        assert [(os.path.basename(u), n, d) for u, n, d in got[who]] == [
            (f"{name}.tar", member, data) for name in names for member, data in _members(written[name])]
        assert _gets(proxies[who]) == [f"/s3/{bucket}/{name}.tar" for name in names]
    assert [(n, d) for _, n, d in plain] == _members(written["c-0"])
    assert {e.path for e in proxies["process"].log} == {f"/s3/{bucket}/c-0.tar"}


def test_the_cache_keeps_one_bucket_of_two_endpoints_apart(two_ways, tmp_path):
    """The same URL read by two pipelines of two endpoints: each endpoint is asked for its
    own copy (the second is not served the first's). Oracle: the proxies' request logs."""
    bucket, written, proxies = two_ways
    url = f"s3://{bucket}/a-0.tar"
    wd.set_cache(str(tmp_path / "cache"), "1GB")
    try:
        for who in ("A", "B", "A", "B"):
            pipe = wd.ShardLister(url, store=_settings(proxies[who].url + "/s3")).load_tar()
            assert [(n, d) for _, n, d in pipe] == _members(written["a-0"])
    finally:
        wd.set_cache(None)
    assert _gets(proxies["A"]) == _gets(proxies["B"]) == [f"/s3/{bucket}/a-0.tar"]  # once each: then its copy


def test_exact_and_mixed_epochs_and_build_index_read_through_their_own_settings(two_ways, tmp_path):
    bucket, written, proxies = two_ways
    own = _settings(proxies["A"].url + "/s3")
    cloud_settings.set_store_settings("s3://", _settings(proxies["process"].url + "/s3"))
    try:
        urls = [f"s3://{bucket}/a-0.tar", f"s3://{bucket}/a-1.tar"]
        scans = build_index(urls, store=own, places=True)
        ShardIndex.from_scans(scans, relative_to=str(tmp_path / "index.json")).save(str(tmp_path / "index.json"))
        exact = wd.ExactEpochs(str(tmp_path / "index.json"), batch_size=1, shuffle=False, store=own)
        mixed = wd.MixedEpochs({"a": str(tmp_path / "index.json")}, batch_size=1, shuffle=False, store=own)
        samples = [(s["__key__"], s["bin"]) for s in pickle.loads(pickle.dumps(exact))]
        mixed_keys = sorted(s["__key__"] for s in mixed)
    finally:
        cloud_settings.set_store_settings("s3://", None)
    members = dict(m for name in ("a-0", "a-1") for m in _members(written[name]))
    assert samples == [(f"{name}-{i:04d}", members[f"{name}-{i:04d}.bin"]) for name in ("a-0", "a-1") for i in range(4)]
    assert mixed_keys == [key for key, _ in samples]
    assert proxies["A"].url not in (tmp_path / "index.json").read_text()  # the index holds URLs, no settings
    assert proxies["A"].log and not proxies["process"].log


WORKERS = textwrap.dedent("""
    import json, os, pickle, sys
    import wds_datapipes as wd
    from torch.utils.data import DataLoader
    from wds_datapipes.storage.cloud_settings import StoreSettings

    def named(item):
        url, name, data = item
        return os.path.basename(url), name, data.hex()

    if __name__ == "__main__":
        method, spec, endpoint, out = sys.argv[1:]
        own = StoreSettings(endpoint=endpoint, region="us-east-1", path_style=True,
                            credentials_env={"access_key_id": "TEAM_KEY_ID", "secret_access_key": "TEAM_SECRET"})
        pipe = wd.ShardLister(spec, store=own).load_tar().map(named)
        assert len(list(wd.ShardLister(spec, store=own))) == 2  # obstore used in the parent before a fork
        if method == "dataloader2":
            from torchdata.dataloader2 import DataLoader2
            loader = DataLoader2(pipe, reading_service=wd.MultiProcessingReadingService(num_workers=2))
        else:
            loader = DataLoader(pipe, num_workers=2, batch_size=None, multiprocessing_context=method)
        json.dump([list(item) for item in loader], open(out, "w"))
        open(out + ".pickle", "wb").write(pickle.dumps(pipe))
""")


@pytest.mark.parametrize("method", ["fork", "spawn", pytest.param("dataloader2", marks=needs_dataloader2)])
def test_a_pipeline_s_settings_reach_fork_and_spawn_workers_and_its_pickle_holds_no_secret(two_ways, tmp_path,
                                                                                            method):
    """The process's environment points at another proxy, the keys come from the variables the
    settings name. Oracle: tarfile over the bytes written; the proxies' logs; the pickle's bytes."""
    bucket, written, proxies = two_ways
    secret, key_id = "team-s3cr3t-in-env-only", "TEAMKEYID-in-env-only"
    env = {**os.environ, "AWS_ENDPOINT_URL": proxies["process"].url + "/s3", "TEAM_KEY_ID": key_id,
           "TEAM_SECRET": secret}
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", cloud_settings.SETTINGS_ENV):
        env.pop(name, None)
    script, out = tmp_path / "workers.py", tmp_path / "out.json"
    script.write_text(WORKERS)
    subprocess.run([sys.executable, str(script), method, f"s3://{bucket}/a-*.tar", proxies["A"].url + "/s3", str(out)],
                   check=True, timeout=240, env=env)
    got = sorted(tuple(item) for item in json.loads(out.read_text()))
    expected = sorted((f"{name}.tar", member, data.hex()) for name in ("a-0", "a-1")
                      for member, data in _members(written[name]))
    assert got == expected
    assert _gets(proxies["A"]) == [f"/s3/{bucket}/a-0.tar", f"/s3/{bucket}/a-1.tar"] and not proxies["process"].log
    pickled = (tmp_path / "out.json.pickle").read_bytes()
    assert b"TEAM_SECRET" in pickled and secret.encode() not in pickled and key_id.encode() not in pickled
