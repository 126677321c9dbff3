"""s3://, gs:// and az:// in what takes a URL: listings, uploads, pipelines in DataLoader workers
(fork and spawn), the shard cache and indexes with member places; and no secret anywhere.

Oracles: the local filesystem's glob and directory listing (``shards.listing.resolve_local``)
over a folder holding the same names as the bucket; the samples written by webdataset's
TarWriter; the bytes uploaded.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
from builders import write_index
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_helpers import configured, shard_bytes

import wds_datapipes as wd
from wds_datapipes.errors import IndexMismatchError, ShardOpenError, ShardWriteError
from wds_datapipes.limits import Limits
from wds_datapipes.shards.listing import resolve_local
from wds_datapipes.shards.openers import backend_for, open_shard, source_stamp
from wds_datapipes.storage import cloud_settings, object_store, store_calls
from wds_datapipes.storage.cloud_settings import StoreSettings

pytest.importorskip("obstore")
pytestmark = pytest.mark.timeout(300)

KEYS = [*(f"train/shard-{i:03d}.tar" for i in range(12)), "train/sub/deep.tar", "train/readme.txt",
        "train/shard-x.tar.gz", "train-extra/shard-000.tar", "val/shard-000.tar", "top.tar"]


@pytest.fixture
def listed_bucket(store, tmp_path):
    """A bucket holding KEYS (one byte each) and a local folder holding the same names."""
    bucket = store.new_bucket()
    for key in KEYS:
        store.put(bucket, key, b"x")
        (tmp_path / "mirror" / key).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "mirror" / key).write_bytes(b"x")
    return store, bucket, tmp_path / "mirror"


def _listed(store, bucket: str, spec: str) -> list[str]:
    try:
        return [u.removeprefix(store.url(bucket)) for u in backend_for(store.url(bucket)).list(store.url(bucket, spec))]
    except ShardOpenError:
        return []


def _local(mirror, spec: str) -> list[str]:
    return [os.path.relpath(p, mirror) + ("/" if p.endswith("/") else "") for p in resolve_local(f"{mirror}/{spec}")]


GLOB_PARTS = st.lists(st.sampled_from(["train/", "val/", "shard-", "0", "00", "1", "*", "?", "[01]", "[!1]", ".tar",
                                       ".tar.gz", "*.tar", "sub/", "x"]), min_size=1, max_size=5)


@pytest.mark.parametrize("spec", ["*[!1]*", "train[!0]shard-000.tar"])
def test_a_negated_bracket_never_matches_a_slash(listed_bucket, spec):
    """Found by the test below (hypothesis, on az): ``[!1]`` matched the ``/`` of ``train-extra/...``.
    Oracle: ``glob.glob`` over a folder of the same names."""
    store, bucket, mirror = listed_bucket
    assert _listed(store, bucket, spec) == [p for p in _local(mirror, spec) if os.path.isfile(mirror / p)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=GLOB_PARTS)
def test_globs_and_prefixes_list_what_the_local_filesystem_lists(listed_bucket, parts):
    """Oracle: ``glob.glob`` / ``os.listdir`` (through ``resolve_local``) over a folder of the same names."""
    store, bucket, mirror = listed_bucket
    spec = "".join(parts)
    if not set("*?[").intersection(spec) and not spec.endswith("/"):
        return  # one URL: itself, not a listing
    assert _listed(store, bucket, spec) == [p for p in _local(mirror, spec) if os.path.isfile(mirror / p)], spec


def test_a_listing_is_paged_and_its_first_url_comes_before_it_ends(listed_bucket, monkeypatch):
    store, bucket, _ = listed_bucket
    monkeypatch.setattr(object_store, "LIST_PAGE_SIZE", 2)
    pages = []
    real = store_calls.list_pages

    def counted(target, prefix, page_size, after=None):
        for page in real(target, prefix, page_size, after):
            pages.append(len(page))
            yield page

    monkeypatch.setattr(store_calls, "list_pages", counted)
    urls = backend_for(store.url(bucket)).list(store.url(bucket, "train/*.tar"), Limits())
    assert next(urls) == store.url(bucket, "train/shard-000.tar") and pages == [2]
    assert [next(urls) for _ in range(11)][-1] == store.url(bucket, "train/shard-011.tar")
    assert len(pages) >= 6 and max(pages) == 2
    with pytest.raises(ShardOpenError, match="no object matches"):
        list(backend_for(store.url(bucket)).list(store.url(bucket, "nothing-*.tar"), Limits()))


def test_put_uploads_a_file_whole_and_returns_its_version(store, tmp_path):
    bucket = store.new_bucket()
    # Past the 8 MiB part size: a multipart upload; not on fake-gcs-server, which has no XML
    # multipart upload (docs/testing.md): one PUT there.
    data = os.urandom((3 if store.scheme == "gs" else 20) << 20)
    (tmp_path / "big.tar").write_bytes(data)
    url = store.url(bucket, "up/big.tar")
    version = backend_for(url).put(str(tmp_path / "big.tar"), url, Limits())
    assert source_stamp(url, Limits()) == (len(data), version)
    with open_shard(url) as stream:
        assert stream.read() == data
    with pytest.raises(ShardWriteError, match="missing.tar"):
        backend_for(url).put(str(tmp_path / "missing.tar"), url, Limits())


def test_settings_name_their_secrets_and_never_hold_them(store, monkeypatch):
    secret = "s3cr3t-value-never-shown"
    monkeypatch.setenv("MY_TEAM_SECRET", secret)
    monkeypatch.setenv("MY_TEAM_KEY_ID", "AKIDTEAM")
    settings_ = StoreSettings(endpoint=store.endpoint, region="us-east-1", path_style=True,
                              credentials_env={"access_key_id": "MY_TEAM_KEY_ID",
                                               "secret_access_key": "MY_TEAM_SECRET"})
    cloud_settings.set_store_settings(f"{store.scheme}://", settings_)
    try:
        bucket = store.new_bucket()
        store.put(bucket, "a.tar", shard_bytes("a", 3))
        pipe = wd.ShardLister([store.url(bucket, "a.tar"), store.url(bucket, "missing.tar")]).load_tar()
        with pytest.raises(ShardOpenError) as caught:
            list(pipe)
        shown = [repr(settings_), str(pickle.dumps(settings_)), os.environ[cloud_settings.SETTINGS_ENV],
                 str(pickle.dumps(pipe)), str(caught.value), repr(caught.value)]
        assert not [text for text in shown if secret in text]
        with pytest.raises(ValueError, match="must not hold secrets"):
            StoreSettings(options={"secret_access_key": secret})
        with pytest.raises(ValueError, match="must not carry credentials"):
            StoreSettings(endpoint=f"http://user:{secret}@host/s3")
    finally:
        cloud_settings.set_store_settings(f"{store.scheme}://", None)


WORKERS = textwrap.dedent("""
    import json, sys
    import wds_datapipes as wd
    from torch.utils.data import DataLoader
    from wds_datapipes.shards.openers import backend_for

    def key(sample):
        return sample["__key__"]

    if __name__ == "__main__":
        method, spec, out = sys.argv[1:]
        assert list(backend_for(spec).list(spec))  # obstore used in the parent, before the workers start
        pipe = wd.ShardLister(spec).load_tar().group_by_key().map(key)  # the workers list (and read) too
        loader = DataLoader(pipe, num_workers=3, batch_size=None, multiprocessing_context=method)
        json.dump(list(loader), open(out, "w"))
""")


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_started_by_fork_and_spawn_read_every_sample_once(store, tmp_path, method):
    bucket = store.new_bucket()
    expected = []
    for shard in range(5):
        store.put(bucket, f"w/shard-{shard}.tar", shard_bytes(f"s{shard}", 20))
        expected += [f"s{shard}-{i:04d}" for i in range(20)]
    script = tmp_path / "workers.py"
    script.write_text(WORKERS)
    subprocess.run([sys.executable, str(script), method, store.url(bucket, "w/*.tar"), str(tmp_path / "out.json")],
                   check=True, timeout=240)
    assert sorted(json.loads((tmp_path / "out.json").read_text())) == expected


def test_the_cache_serves_the_second_epoch_from_local_copies(store, fault_proxy, monkeypatch, tmp_path):
    bucket = store.new_bucket()
    for shard in range(3):
        store.put(bucket, f"c/shard-{shard}.tar", shard_bytes(f"c{shard}", 10))
    through, proxy = fault_proxy(store)
    configured(through, monkeypatch)
    urls = [through.url(bucket, f"c/shard-{shard}.tar") for shard in range(3)]
    wd.set_cache(str(tmp_path / "cache"), "1GB")
    try:
        pipe = wd.ShardLister(urls).load_tar().group_by_key()
        first = [s["__key__"] for s in pipe]
        gets = sum(e.method == "GET" for e in proxy.log)
        second = [s["__key__"] for s in pipe]
    finally:
        wd.set_cache(None)
    assert first == second and len(first) == 30
    assert gets == 3 and sum(e.method == "GET" for e in proxy.log) == 3


def test_an_index_with_places_stamps_objects_and_a_changed_object_is_a_mismatch(store, tmp_path):
    bucket = store.new_bucket()
    urls = []
    for shard in range(3):
        store.put(bucket, f"i/shard-{shard}.tar", shard_bytes(f"i{shard}", 12))
        urls.append(store.url(bucket, f"i/shard-{shard}.tar"))
    path = write_index(urls, tmp_path / "index.json", places=True)
    recorded = json.loads((tmp_path / "index.places.json").read_text())
    stamps = [source_stamp(url, Limits())[1] for url in urls]
    assert stamps[0] and all(stamp in json.dumps(recorded, ensure_ascii=False).replace('\\"', '"') for stamp in stamps)
    keys = sorted(s["__key__"] for s in wd.ExactEpochs(path, batch_size=1, shuffle=False))
    assert keys == sorted(f"i{shard}-{i:04d}" for shard in range(3) for i in range(12))
    store.put(bucket, "i/shard-1.tar", shard_bytes("i1", 13))  # another size
    with pytest.raises(IndexMismatchError, match="shard-1.tar"):
        list(wd.ExactEpochs(path, batch_size=1, shuffle=False))


def test_plain_webdataset_reads_and_writes_object_urls_through_the_back_end(store, tmp_path):
    """Oracle: the samples webdataset's own TarWriter wrote, read back by webdataset's own reader."""
    import webdataset as wds

    bucket = store.new_bucket()
    assert wd.register_with_webdataset()
    pattern = store.url(bucket, "wds/shard-%02d.tar")
    with wds.ShardWriter(pattern, maxcount=7) as sink:
        for i in range(20):
            sink.write({"__key__": f"k{i:03d}", "cls": str(i).encode()})
    urls = [store.url(bucket, f"wds/shard-{n:02d}.tar") for n in range(3)]
    got = [(s["__key__"], s["cls"]) for s in wds.WebDataset(urls, shardshuffle=False)]
    assert got == [(f"k{i:03d}", str(i).encode()) for i in range(20)]


def test_the_index_and_verify_commands_take_an_object_glob(store, tmp_path):
    """``index --places`` over ``s3://bucket/v/*.tar`` and ``verify`` of it: exit 0; after an
    object is written again with another size, ``verify`` exits 1 naming it."""
    bucket = store.new_bucket()
    for shard in range(3):
        store.put(bucket, f"v/shard-{shard}.tar", shard_bytes(f"v{shard}", 8))
    index = str(tmp_path / "index.json")
    command = [sys.executable, "-m", "wds_datapipes"]
    subprocess.run([*command, "index", "--places", "--quiet", "-o", index, store.url(bucket, "v/*.tar")],
                   check=True, timeout=120)
    assert len(json.loads((tmp_path / "index.json").read_text())["shardlist"]) == 3
    assert subprocess.run([*command, "verify", index], check=False, timeout=120).returncode == 0
    store.put(bucket, "v/shard-2.tar", shard_bytes("v2", 9))
    failed = subprocess.run([*command, "verify", index], check=False, timeout=120, capture_output=True, text=True)
    assert failed.returncode == 1 and "shard-2.tar" in failed.stdout + failed.stderr


def test_a_credential_provider_named_in_settings_gives_the_keys(s3_server, monkeypatch):
    """No key in the environment: the settings name a ``module:function`` whose provider gives them."""
    configured(s3_server, monkeypatch)
    bucket = s3_server.new_bucket()
    s3_server.put(bucket, "p.tar", b"provided")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    settings_ = StoreSettings(endpoint=s3_server.endpoint, region="us-east-1", path_style=True,
                              credential_provider="store_helpers:provided_credentials")
    cloud_settings.set_store_settings(f"s3://{bucket}", settings_)
    try:
        with open_shard(f"s3://{bucket}/p.tar") as stream:
            assert stream.read() == b"provided"
        assert "provider-secret" not in os.environ[cloud_settings.SETTINGS_ENV] + repr(settings_)
    finally:
        cloud_settings.set_store_settings(f"s3://{bucket}", None)
