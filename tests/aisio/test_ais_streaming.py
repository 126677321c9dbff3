"""Listing and streaming shards from a real AIStore cluster."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ais_helpers import reference_samples, strip_url
from faulty_proxy import FaultyRelay
from stack import two_worker_loader

from aisio import AISObjectStream, AISReadError, AISSourceLister, RetryPolicy, open_ais_url
from aisio.client import ENDPOINT_ENV, get_client
from aisio.etl import ETLError, init_etl, list_etls, stop_etl
from wds_datapipes import ShardLister, ShardOpenError, ShardReadError


def _ais_urls(bucket, paths):
    return [f"ais://{bucket}/{os.path.basename(p)}" for p in paths]


def test_ais_shards_give_the_samples_webdataset_reads_from_the_local_files(dataset):
    bucket, paths, _ = dataset
    samples = list(AISSourceLister(f"ais://{bucket}/train-").load_tar().group_by_key())
    assert strip_url(samples) == reference_samples(paths)
    urls = _ais_urls(bucket, paths)
    assert sorted({s["__url__"] for s in samples}) == urls
    assert [s["__url__"] for s in samples] == sorted(s["__url__"] for s in samples)


def test_lister_forms_prefix_bucket_template_and_glob_name_the_same_sorted_shards(dataset):
    bucket, paths, _ = dataset
    urls = _ais_urls(bucket, paths)
    assert list(AISSourceLister(f"ais://{bucket}/train-")) == urls
    assert list(AISSourceLister(bucket=bucket)) == urls
    assert list(AISSourceLister(f"ais://{bucket}/train-{{000000..000005}}.tar")) == urls
    assert list(AISSourceLister(f"ais://{bucket}/train-00000[24].tar")) == [urls[2], urls[4]]
    assert list(AISSourceLister(f"ais://{bucket}/train-000001.tar::ais://{bucket}/train-000000.tar")) == [
        urls[1], urls[0]
    ]


def test_listing_reads_every_page(ais_endpoint, bucket):
    client = get_client()
    names = [f"part-{i:03d}.tar" for i in range(23)]
    for name in names:
        client.bucket(bucket).object(name).get_writer().put_content(b"x")
    assert list(AISSourceLister(f"ais://{bucket}/part-", page_size=5)) == [f"ais://{bucket}/{n}" for n in names]


def test_template_naming_a_missing_shard_is_an_error_naming_it(dataset):
    bucket, _, _ = dataset
    with pytest.raises(ShardOpenError, match=r"1 of 7 shards .* 'train-000006.tar'"):
        list(AISSourceLister(f"ais://{bucket}/train-{{000000..000006}}.tar"))


def test_shard_lister_streams_an_ais_brace_template(dataset):
    bucket, paths, _ = dataset
    dp = ShardLister(f"ais://{bucket}/train-{{000000..000005}}.tar").load_tar().group_by_key()
    assert strip_url(dp) == reference_samples(paths)


def test_ais_opener_is_found_through_the_entry_point_without_importing_aisio(dataset):
    bucket = dataset[0]
    code = (
        "import sys\n"
        "from wds_datapipes import ShardLister\n"
        f"n = sum(1 for _ in ShardLister('ais://{bucket}/train-{{000000..000001}}.tar').load_tar().group_by_key())\n"
        "assert 'aisio' in sys.modules\n"
        "print(n)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "24"


def _tag_worker(sample: dict) -> dict:
    return {**sample, "__pid__": os.getpid()}


def test_shuffled_listing_reshuffles_each_epoch_and_splits_whole_shards_between_workers(dataset):
    bucket, paths, samples = dataset
    dp = AISSourceLister(f"ais://{bucket}/train-", shuffle=True).load_tar().group_by_key().map(_tag_worker)
    with two_worker_loader(dp) as loader:
        epochs = [list(loader) for _ in range(2)]
    all_urls = _ais_urls(bucket, paths)
    for got in epochs:
        assert sorted(s["__key__"] for s in got) == sorted(s["__key__"] for s in samples)  # each once
        shards_of: dict[int, set[str]] = {}
        for s in got:
            shards_of.setdefault(s["__pid__"], set()).add(s["__url__"])
        # Two workers, each reading whole shards that the other does not read.
        assert len(shards_of) == 2
        first, second = shards_of.values()
        assert not first & second and sorted(first | second) == all_urls
    orders = [list(dict.fromkeys(s["__url__"] for s in got)) for got in epochs]
    assert orders[0] != orders[1]  # reshuffled per epoch


def test_dropped_connections_resume_from_the_last_byte_without_losing_or_repeating_samples(dataset, monkeypatch):
    bucket, paths, _ = dataset
    cut = 100_000
    with FaultyRelay(os.environ[ENDPOINT_ENV], cut_after=cut, cuts=2) as relay:
        monkeypatch.setenv(ENDPOINT_ENV, relay.url)
        samples = list(AISSourceLister(f"ais://{bucket}/train-").load_tar().group_by_key())
    assert strip_url(samples) == reference_samples(paths)
    sizes = {url: os.path.getsize(p) for url, p in zip(_ais_urls(bucket, paths), paths)}
    for url in _ais_urls(bucket, paths):
        path = f"/v1/objects/{bucket}/{url.rsplit('/', 1)[1]}"
        target_legs = [(rng, status, sent) for m, p, rng, status, sent in relay.log
                       if p == path and status in (200, 206)]
        # The whole-object GET and the first resume were cut; the second resume went through.
        assert [(rng, status) for rng, status, _ in target_legs] == [
            (None, 200), (f"bytes={cut}-", 206), (f"bytes={2 * cut}-", 206)
        ]
        assert target_legs[0][2] == target_legs[1][2] == cut
        assert target_legs[2][2] == sizes[url] - 2 * cut


def test_a_resume_answered_with_the_whole_object_skips_the_part_already_read(dataset, monkeypatch):
    bucket, paths, _ = dataset
    with FaultyRelay(os.environ[ENDPOINT_ENV], cut_after=123_457, cuts=1, drop_range=True) as relay:
        monkeypatch.setenv(ENDPOINT_ENV, relay.url)
        samples = list(AISSourceLister(f"ais://{bucket}/train-00000[01].tar").load_tar().group_by_key())
    assert strip_url(samples) == reference_samples(paths[:2])
    statuses = [status for m, p, rng, status, sent in relay.log if p.endswith("train-000000.tar") and status < 300]
    assert statuses == [200, 200]  # cut, then the whole object again


def test_an_object_replaced_while_it_is_read_is_an_error_not_a_mix(dataset, bucket, monkeypatch):
    _, paths, _ = dataset
    url = f"ais://{bucket}/shard.tar"
    obj = get_client().bucket(bucket).object("shard.tar")
    obj.get_writer().put_file(paths[0])

    def replace(_path):
        obj.get_writer().put_file(paths[1])

    with FaultyRelay(os.environ[ENDPOINT_ENV], cut_after=100_000, cuts=1, on_cut=replace) as relay:
        monkeypatch.setenv(ENDPOINT_ENV, relay.url)
        # A ShardReadError (as HTTP's): the tar reader names the member being read and its offset.
        with pytest.raises(ShardReadError, match=r"member '.*', at byte \d+: the object changed while it was read"):
            list(ShardLister(url).load_tar())


def test_a_stream_that_keeps_breaking_fails_naming_the_shard_and_offset(dataset, monkeypatch):
    bucket, paths, _ = dataset
    url = f"ais://{bucket}/{os.path.basename(paths[0])}"
    with FaultyRelay(os.environ[ENDPOINT_ENV], cut_after=50_000, cuts=10) as relay:
        monkeypatch.setenv(ENDPOINT_ENV, relay.url)
        stream = AISObjectStream(url, max_resume=2)
        with pytest.raises(AISReadError) as info:
            while stream.read(1 << 20):
                pass
        stream.close()
    assert info.value.url == url and info.value.offset == 150_000
    assert "2 resume(s) failed" in str(info.value)


def test_missing_bucket_and_object_fail_fast_naming_them_and_the_target_that_answered(dataset):
    bucket, _, _ = dataset
    started = time.monotonic()
    with pytest.raises(ShardOpenError, match=rf"object 'nope.tar' does not exist in bucket ais://{bucket}.*404") as info:
        list(ShardLister(f"ais://{bucket}/nope.tar").load_tar())
    proxy_port = os.environ[ENDPOINT_ENV].rsplit(":", 1)[1]
    assert "HTTP 404 from target t[" in str(info.value)  # the target that answered, by id and URL
    assert "at http://127.0.0.1:" in str(info.value) and f"at http://127.0.0.1:{proxy_port}" not in str(info.value)
    with pytest.raises(ShardOpenError, match=r"bucket ais://no-such-bucket-x does not exist"):
        list(ShardLister("ais://no-such-bucket-x/a.tar").load_tar())
    with pytest.raises(ShardOpenError, match=r"bucket ais://no-such-bucket-x does not exist"):
        list(AISSourceLister("ais://no-such-bucket-x/"))
    assert time.monotonic() - started < 5


def test_etl_the_cluster_cannot_run_is_one_clear_error_without_retries(dataset, monkeypatch):
    bucket, paths, _ = dataset
    name = os.path.basename(paths[0])
    with FaultyRelay(os.environ[ENDPOINT_ENV], cut_after=0, cuts=0) as relay:
        monkeypatch.setenv(ENDPOINT_ENV, relay.url)
        lister = AISSourceLister(f"ais://{bucket}/{name}", etl_name="resize", etl_args={"size": 64})
        assert list(lister) == [f"ais://{bucket}/{name}?etl_name=resize&etl_args=%7B%22size%22%3A64%7D"]
        started = time.monotonic()
        with pytest.raises(ShardOpenError) as info:
            list(lister.load_tar())
        elapsed = time.monotonic() - started
    message = str(info.value)
    assert "ETL 'resize'" in message and '{"size":64}' in message
    assert f"object {name!r} in bucket ais://{bucket}" in message
    assert "HTTP 501" in message or "HTTP 404" in message
    object_gets = [(entry, query) for entry, query in zip(relay.log, relay.queries)
                   if entry[0] == "GET" and entry[1].startswith("/v1/objects/")]
    assert object_gets and all("etl_name=resize" in q and "etl_args=" in q for _, q in object_gets)
    errors = [entry for entry, _ in object_gets if entry[3] >= 400]
    assert len(errors) == 1, relay.log  # asked once, not retried
    assert elapsed < 3


def test_etl_management_on_a_cluster_without_etl_support_names_the_etl_and_the_answer(ais_endpoint):
    try:
        list_etls()
    except ETLError as exn:
        assert "cannot list ETLs on" in str(exn) and "HTTP 501" in str(exn)
    else:
        pytest.skip("this cluster runs ETLs: init would deploy containers on it")
    with pytest.raises(ETLError, match=r"cannot stop ETL 'resize' on .*HTTP 501"):
        stop_etl("resize")
    with pytest.raises(ETLError, match=r"cannot init ETL 'resize' on .*HTTP 501"):
        init_etl("resize", image="aistorage/transformer_md5:latest")


def _target_legs(relay, path):
    return [(rng, status, sent) for m, p, rng, status, sent in relay.log if p == path and status in (200, 206)]


def test_a_stream_starts_at_a_byte_offset_and_resumes_counting_from_it(dataset, monkeypatch):
    bucket, paths, _ = dataset
    data = Path(paths[0]).read_bytes()
    name = os.path.basename(paths[0])
    url, start, cut = f"ais://{bucket}/{name}", 512 * 37 + 11, 100_000
    cluster = os.environ[ENDPOINT_ENV]
    with FaultyRelay(cluster, cut_after=cut, cuts=1) as relay:
        monkeypatch.setenv(ENDPOINT_ENV, relay.url)
        with open_ais_url(url, start=start) as stream:
            assert stream.position == start
            assert stream.read() == data[start:]
            assert stream.position == len(data)
    monkeypatch.setenv(ENDPOINT_ENV, cluster)
    legs = _target_legs(relay, f"/v1/objects/{bucket}/{name}")
    assert [(rng, status) for rng, status, _ in legs] == [(f"bytes={start}-", 206), (f"bytes={start + cut}-", 206)]
    with open_ais_url(url) as stream:  # the one-argument form still reads from the start
        assert stream.read() == data
    with open_ais_url(url, start=len(data)) as stream:
        assert stream.read() == b""  # the object's end: an empty stream
    with pytest.raises(ShardOpenError, match=rf"byte {len(data) + 1} is beyond the object's end \({len(data)} bytes\)"):
        open_ais_url(url, start=len(data) + 1)
    with pytest.raises(ShardOpenError, match="start must be a byte offset >= 0"):
        open_ais_url(url, start=-1)


def test_busy_answers_are_retried_for_objects_and_for_each_listing_page(dataset, monkeypatch):
    bucket, paths, _ = dataset
    busy = {f"/v1/objects/{bucket}/train-000001.tar": 3, f"/v1/buckets/{bucket}": 2}
    with FaultyRelay(os.environ[ENDPOINT_ENV], cut_after=0, cuts=0, busy=busy) as relay:
        monkeypatch.setenv(ENDPOINT_ENV, relay.url)
        samples = list(AISSourceLister(f"ais://{bucket}/train-", page_size=2).load_tar().group_by_key())
    assert strip_url(samples) == reference_samples(paths)
    listing = [status for m, p, rng, status, sent in relay.log if p == f"/v1/buckets/{bucket}"]
    assert listing[:2] == [503, 503] and set(listing[2:]) == {200} and len(listing) >= 5  # 2 busy, then pages of 2
    gets = [status for m, p, rng, status, sent in relay.log if p == f"/v1/objects/{bucket}/train-000001.tar"]
    assert gets == [503, 503, 503, 301, 200]


class _Silent:
    """A TCP listener that accepts connections and never answers: a cluster whose nodes all hang."""

    def __enter__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def __exit__(self, *exc):
        self.sock.close()


def test_a_cluster_that_never_answers_fails_within_the_budget_naming_it_and_what_was_tried(monkeypatch):
    monkeypatch.setenv("AISIO_RETRY_BUDGET", "2")
    with _Silent() as silent:
        monkeypatch.setenv(ENDPOINT_ENV, silent)
        for attempt in (lambda: open_ais_url("ais://bkt/shard.tar"), lambda: list(AISSourceLister("ais://bkt/"))):
            started = time.monotonic()
            with pytest.raises(ShardOpenError) as info:
                attempt()
            elapsed = time.monotonic() - started
            message = str(info.value)
            assert 1.9 < elapsed < 3.5, message
            assert f"no usable answer from the cluster at {silent}" in message
            assert re.search(r"\d+ tr(y|ies) in \d", message) and "retry budget 2 s" in message
            assert f"no answer from proxy at {silent}" in message and "timed out" in message


def test_a_body_that_stops_flowing_is_resumed_after_the_read_timeout(dataset, monkeypatch):
    bucket, paths, _ = dataset
    name = os.path.basename(paths[0])
    data = Path(paths[0]).read_bytes()
    policy = RetryPolicy(budget_s=10, read_timeout_s=1.5)
    with FaultyRelay(os.environ[ENDPOINT_ENV], cut_after=100_000, cuts=1, stall_s=30) as relay:
        monkeypatch.setenv(ENDPOINT_ENV, relay.url)
        started = time.monotonic()
        with AISObjectStream(f"ais://{bucket}/{name}", policy=policy) as stream:
            assert stream.read() == data
        elapsed = time.monotonic() - started
    assert 1.4 < elapsed < 5, f"the stalled body was given up after {elapsed:.1f} s"
    legs = _target_legs(relay, f"/v1/objects/{bucket}/{name}")  # logged as they end: the stalled one last
    assert sorted((str(rng), status) for rng, status, _ in legs) == [("None", 200), ("bytes=100000-", 206)]
