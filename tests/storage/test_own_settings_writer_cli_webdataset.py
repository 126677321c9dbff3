"""Object-store settings given to one run, beyond the readers: ``write_shards(store=...)``,
the commands' ``--endpoint`` / ``--store-option``, and plain webdataset over
``store_urls`` / ``StoreOpener``. Each reaches its own server (a fault proxy of its own in
front of the S3 server), never the one the process's settings or environment name; a
secret given on the command line is never printed.

Oracles: which server each request reached (each proxy's request log; an empty log for the
proxy that the process's settings or environment point at); the objects' bytes, read back
from the server itself, against the same run written to a local folder, and their members
as Python's ``tarfile`` reads them.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from store_helpers import configured, read_object, shard_bytes

from tests.writing.conftest import make_samples
from wds_datapipes.storage import cloud_settings
from wds_datapipes.storage.cloud_settings import StoreSettings, StoreUrl
from wds_datapipes.storage.store_options import store_of_arguments
from wds_datapipes.writing import write_shards

pytest.importorskip("obstore")
pytestmark = pytest.mark.timeout(300)

SECRET = "cli-s3cr3t-never-shown-7f3a"


def _settings(endpoint: str) -> StoreSettings:
    return StoreSettings(endpoint=endpoint, region="us-east-1", path_style=True)


def _members(data: bytes) -> list[tuple[str, bytes]]:
    """The oracle reader: a tar's files as Python's tarfile reads them."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers() if m.isfile()]


@pytest.fixture
def s3(s3_server, fault_proxy, monkeypatch):
    """The S3 server (the environment pointing at it, no settings in code) and three proxies
    in front of it, each logging its requests: "A", "B" and "process"."""
    server = configured(s3_server, monkeypatch)
    return server, {who: fault_proxy(server)[1] for who in ("A", "B", "process")}


# ------------------------------------------------------------ write_shards(store=...)


def test_two_writes_to_one_bucket_name_each_reach_only_their_own_endpoint(s3, tmp_path):
    """Two runs into one bucket (A with 2 worker processes, its index and records at the
    destination; B with 1, its index and records in a local folder), the process's settings
    for ``s3://`` pointing at a third proxy; then both again: each resumes from its records
    (their reads and the HEADs that check its shards go to its own proxy too). Oracle: the
    same runs written to local folders (byte for byte, and tarfile's members); the proxies' logs."""
    server, proxies = s3
    bucket = server.new_bucket("own-write")
    runs = {"A": (make_samples(23, seed=1), 2, None), "B": (make_samples(17, seed=2), 1, str(tmp_path / "B.json"))}
    cloud_settings.set_store_settings("s3://", _settings(proxies["process"].url + "/s3"))
    try:
        reports, again, resumed = {}, {}, {}
        for who, (samples, workers, index) in runs.items():
            own = _settings(proxies[who].url + "/s3")
            reports[who] = write_shards(samples, f"s3://{bucket}/{who}/s-%04d.tar", maxcount=6, workers=workers,
                                        index=index, spool=str(tmp_path / f"spool-{who}"), store=own)
            assert isinstance(reports[who].index.url(0), StoreUrl)  # the index returned reads through them too
            assert reports[who].index.url(0).stores.settings_for(reports[who].index.url(0)) == own
        for who, (samples, workers, index) in runs.items():
            before = len(proxies[who].log)
            again[who] = write_shards(samples, f"s3://{bucket}/{who}/s-%04d.tar", maxcount=6, index=index,
                                      spool=str(tmp_path / f"again-{who}"), store=_settings(proxies[who].url + "/s3"))
            resumed[who] = {e.method for e in proxies[who].log[before:]}
    finally:
        cloud_settings.set_store_settings("s3://", None)
    assert (again["A"].resumed, again["A"].written, again["B"].resumed, again["B"].written) == (4, 23, 3, 17)
    # records read, shards checked (HEAD), the destination listed once at the end of a resume (GET)
    assert resumed["A"] >= {"GET", "HEAD", "PUT"} and resumed["B"] == {"HEAD", "GET"}
    for who, (samples, _, index) in runs.items():
        local = tmp_path / f"local-{who}"
        write_shards(samples, str(local / "s-%04d.tar"), maxcount=6, fsync=False)
        shards = sorted(local.glob("s-*.tar"))
        assert reports[who].shards == len(shards) and reports[who].written == len(samples)
        for n, path in enumerate(shards):
            data = read_object(f"s3://{bucket}/{who}/s-{n:04d}.tar")
            assert data == path.read_bytes() and _members(data) == _members(path.read_bytes())
        assert b'"shardlist"' in (read_object(f"s3://{bucket}/{who}/index.json") if index is None else Path(index).read_bytes())
        log = proxies[who].log
        # its objects, and listings of the bucket (a record not found: the bucket is there?)
        assert all(e.path.startswith(f"/s3/{bucket}/{who}/") or e.path == f"/s3/{bucket}" for e in log), log
        puts = {e.path for e in log if e.method == "PUT"}
        assert {f"/s3/{bucket}/{who}/s-{n:04d}.tar" for n in range(len(shards))} <= puts
        assert (f"/s3/{bucket}/{who}/index.json" in puts) == (index is None)
        assert any(e.method == "HEAD" for e in log)  # each upload's size checked there
    assert not proxies["process"].log


# ------------------------------------------------------------ the commands


# (option, whether its value is a secret), as docs/storage.md lists them
OPTIONS = {"region": False, "access_key_id": False, "skip_signature": False, "account_name": False,
           "virtual_hosted_style_request": False, "secret_access_key": True, "account_key": True, "token": True,
           "sas_key": True, "aws_session_token": True, "client_secret": True}


@settings(max_examples=40, deadline=None)
@given(given_=st.lists(st.tuples(st.sampled_from(sorted(OPTIONS)), st.text("abcXYZ019-/+=", min_size=8,
                                                                          max_size=20)),
                       unique_by=lambda pair: pair[0], min_size=1, max_size=5))
def test_command_line_options_keep_every_secret_value_out_of_the_settings(given_):
    """Oracle: a table of which options are secrets (docs/storage.md's list): a secret's value
    is only in the variable the settings name, every other option is in the settings as given,
    and neither the settings' repr, JSON nor pickle holds a secret's value."""
    values = {key: f"v-{key}-{text}" for key, text in given_}
    args = argparse.Namespace(endpoint="http://127.0.0.1:9/s3", store_option=[f"{k}={v}" for k, v in values.items()])
    saved = dict(os.environ)
    try:
        made = store_of_arguments(args)
        shown = repr(made) + json.dumps(made.to_json()) + pickle.dumps(made).decode("latin-1")
        for key, value in values.items():
            if OPTIONS[key]:
                assert value not in shown and os.environ[dict(made.credentials_env)[key]] == value
            else:
                assert dict(made.options)[key] == value
        assert dict(made.options).keys() | dict(made.credentials_env).keys() == values.keys()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_a_malformed_option_or_an_endpoint_with_a_password_is_named_never_shown():
    for args, words in (({"store_option": [SECRET]}, "--store-option number 1"),
                        ({"store_option": ["region=x", f"{SECRET}"]}, "--store-option number 2"),
                        ({"endpoint": f"http://u:{SECRET}@h:1/s3"}, "--endpoint"),
                        ({"store_option": [f"endpoint={SECRET}"]}, "--endpoint URL")):
        with pytest.raises(ValueError, match=words) as refused:
            store_of_arguments(argparse.Namespace(**{"endpoint": None, "store_option": [], **args}))
        assert SECRET not in str(refused.value)
    assert store_of_arguments(argparse.Namespace(endpoint=None, store_option=[])) is None


def _command(*args: str, env: dict[str, str], expect: int = 0) -> str:
    done = subprocess.run([sys.executable, "-m", "wds_datapipes", *args], env=env, capture_output=True, text=True,
                          timeout=180, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == expect, output
    assert SECRET not in output
    return output


def test_each_command_reaches_the_server_its_arguments_name_and_never_prints_the_secret(s3, tmp_path):
    """``create``, ``index``, ``verify``, ``inspect`` (an index, a shard) given ``--endpoint``
    and ``--store-option`` (a secret among them), the environment naming another server:
    each command's requests reach the named one. Errors (a missing object, a malformed
    option, an endpoint with a password) name what is wrong, never the secret. Oracle: the
    proxies' request logs; tarfile over the shards read back from the server."""
    server, proxies = s3
    bucket = server.new_bucket("cli")
    (tmp_path / "in").mkdir()
    sources = {}
    for n in range(2):
        sources[n] = shard_bytes(f"in{n}", 6, size=500)
        (tmp_path / "in" / f"in-{n}.tar").write_bytes(sources[n])
    env = {**os.environ, "AWS_ENDPOINT_URL": proxies["process"].url + "/s3"}
    env.pop("AWS_SECRET_ACCESS_KEY", None)
    env.pop(cloud_settings.SETTINGS_ENV, None)
    own = ["--endpoint", proxies["A"].url + "/s3", "--store-option", "region=us-east-1",
           "--store-option", "access_key_id=cli-key-id", "--store-option", f"secret_access_key={SECRET}"]
    seen = 0

    def new_requests() -> list:
        nonlocal seen
        log = proxies["A"].log
        fresh, seen = log[seen:], len(log)
        return fresh

    out = f"s3://{bucket}/c/s-%04d.tar"
    _command("create", "--layout", "shards", str(tmp_path / "in" / "*.tar"), "-o", out, "--maxcount", "5",
             "--quiet", *own, env=env)
    assert {e.path for e in new_requests() if e.method == "PUT"} >= {f"/s3/{bucket}/c/s-{n:04d}.tar" for n in range(3)}
    written = [m for n in range(3) for m in _members(read_object(out % n))]
    assert written == [m for n in range(2) for m in _members(sources[n])]

    index = str(tmp_path / "index.json")
    _command("index", "--places", "--quiet", "-o", index, f"s3://{bucket}/c/s-*.tar", *own, env=env)
    assert {e.method for e in new_requests()} >= {"GET"}  # the listing and the shards
    assert "ok: 3 shards, 12 samples" in _command("verify", index, *own, env=env)
    assert sorted(e.path for e in new_requests() if e.method == "GET" and e.path.endswith(".tar")) == [
        f"/s3/{bucket}/c/s-{n:04d}.tar" for n in range(3)]
    shown = _command("inspect", index, *own, env=env)
    assert "3 shards, 12 samples" in shown and new_requests()
    shown = _command("inspect", out % 1, *own, env=env)
    assert "5 samples" in shown and [e.path for e in new_requests()] == [f"/s3/{bucket}/c/s-0001.tar"]

    missing = _command("inspect", f"s3://{bucket}/c/missing.tar", *own, env=env, expect=1)
    assert "missing.tar" in missing and new_requests()
    malformed = _command("verify", index, "--store-option", SECRET, env=env, expect=1)
    assert "--store-option" in malformed
    with_password = _command("verify", index, "--endpoint", f"http://user:{SECRET}@127.0.0.1:1/s3", env=env, expect=1)
    assert "--endpoint" in with_password
    assert not new_requests() and not proxies["process"].log  # the environment's server: never asked
    plain = subprocess.run([sys.executable, "-m", "wds_datapipes", "verify", index], timeout=180, check=False,
                           env={**env, "AWS_SECRET_ACCESS_KEY": os.environ["AWS_SECRET_ACCESS_KEY"]},
                           capture_output=True)
    assert plain.returncode == 0 and proxies["process"].log  # without the arguments: the environment's


# ------------------------------------------------------------ plain webdataset


def test_plain_webdataset_reads_and_writes_through_one_pipeline_s_settings(s3, tmp_path):
    """webdataset 1.0.2's ShardWriter with ``StoreOpener`` and WebDataset over ``store_urls``
    (and over a pickled copy of it, as DataLoader workers get it) reach proxy A, the
    process's settings naming another; a brace pattern given to webdataset itself is expanded
    by braceexpand into plain strings, which go by the process's settings (what the
    documentation warns of). Oracle: the samples written, read back by tarfile from the
    server itself; the proxies' request logs."""
    import webdataset as wds

    import wds_datapipes as wd
    from wds_datapipes.shards.wds_gopen import StoreOpener, store_urls

    server, proxies = s3
    bucket = server.new_bucket("wds-own")
    own = _settings(proxies["A"].url + "/s3")
    assert wd.register_with_webdataset()
    samples = [{"__key__": f"k{i:03d}", "cls": str(i).encode(), "bin": bytes([i]) * (i * 37)} for i in range(20)]
    cloud_settings.set_store_settings("s3://", _settings(proxies["process"].url + "/s3"))
    try:
        with wds.ShardWriter(f"s3://{bucket}/w/shard-%02d.tar", maxcount=7, opener=StoreOpener(own)) as sink:
            for sample in samples:
                sink.write(sample)
        assert {e.path for e in proxies["A"].log if e.method == "PUT"} == {
            f"/s3/{bucket}/w/shard-{n:02d}.tar" for n in range(3)}
        assert not proxies["process"].log
        urls = store_urls(f"s3://{bucket}/w/shard-{{00..02}}.tar", store=own)
        dataset = wds.WebDataset(urls, shardshuffle=False)
        got = [(s["__key__"], s["cls"], s["bin"]) for s in dataset]
        again = [s["__key__"] for s in pickle.loads(pickle.dumps(dataset))]
        assert not proxies["process"].log
        plain = [s["__key__"] for s in wds.WebDataset(f"s3://{bucket}/w/shard-{{00..02}}.tar", shardshuffle=False)]
    finally:
        cloud_settings.set_store_settings("s3://", None)
    expected = [(s["__key__"], s["cls"], s["bin"]) for s in samples]
    assert got == expected and again == plain == [key for key, _, _ in expected]
    read_back = [m for n in range(3) for m in _members(read_object(f"s3://{bucket}/w/shard-{n:02d}.tar"))]
    assert read_back == [(f"{key}.{field}", value) for key, cls, data in expected
                         for field, value in (("bin", data), ("cls", cls))]
    gets = sorted(e.path for e in proxies["A"].log if e.method == "GET")
    assert gets == sorted(2 * [f"/s3/{bucket}/w/shard-{n:02d}.tar" for n in range(3)])  # the dataset and its copy
    assert sorted(e.path for e in proxies["process"].log if e.method == "GET") == [
        f"/s3/{bucket}/w/shard-{n:02d}.tar" for n in range(3)]
