"""The shard writer straight into s3://, gs:// and az:// (each test server), through their back ends' put.

The servers and back ends come from the object-store work (tests/server_fixtures.py,
tests/storage/conftest.py, wds_datapipes/storage/object_store.py); on a tree without
them these tests skip, saying so.
"""

from __future__ import annotations

import random

import pytest
from fault_proxy import random_faults
from store_helpers import configured, read_object

from tests.writing.conftest import make_samples
from wds_datapipes.epochs.exact_epochs import ExactEpochs
from wds_datapipes.epochs.index import ShardIndex
from wds_datapipes.writing import write_shards


@pytest.fixture(params=["s3", "gs", "az"])
def store(request, monkeypatch):
    """Each object-store test server, its standard variables set (tests/storage/store_helpers.py's ``configured``)."""
    server = request.getfixturevalue({"s3": "s3_server", "gs": "gcs_server", "az": "azure_server"}[request.param])
    return configured(server, monkeypatch)


@pytest.mark.timeout(300)
def test_shards_written_to_an_object_store_equal_a_local_run_and_resume_from_its_records(store, tmp_path):
    """Oracle: the same run written to a local folder (byte for byte)."""
    samples = make_samples(40, seed=11)
    write_shards(samples, str(tmp_path / "local/s-%04d.tar"), maxcount=8, fsync=False)
    bucket = store.new_bucket("write")
    pattern = store.url(bucket, "w/s-%04d.tar")
    report = write_shards(samples, pattern, maxcount=8, workers=2, spool=str(tmp_path / "spool"))
    assert (report.read, report.written, report.shards) == (40, 40, 5)
    for n in range(5):
        assert read_object(pattern % n) == (tmp_path / f"local/s-{n:04d}.tar").read_bytes()
    index = ShardIndex.load(store.url(bucket, "w/index.json"))
    assert index.has_offsets and index.url(2) == pattern % 2
    keys = [s["__key__"] for s in ExactEpochs(index, batch_size=1, shuffle=False, rank=0, world_size=1)]
    assert keys == [s["__key__"] for s in samples]
    again = write_shards(samples, pattern, maxcount=8, spool=str(tmp_path / "spool2"))  # a new machine
    assert again.resumed == 5 and again.written == 40


@pytest.mark.timeout(300)
def test_uploads_through_resets_and_5xx_answers_end_whole_and_equal_a_local_run(object_server, fault_proxy,
                                                                                 monkeypatch, tmp_path):
    """Faults in the middle of the uploads (a third of the PUT and POST requests reset or answered
    503) cost retries, never a shard. One shard holds a 20 MB sample: past the 8 MiB part size,
    a multipart upload whose parts meet the faults too (on s3 and az; fake-gcs-server has no XML
    multipart upload, docs/testing.md: one PUT there). Oracle: the same run written to a local
    folder (byte for byte), read back from the store itself, not through the proxy."""
    samples = make_samples(48, seed=12)
    if object_server.scheme != "gs":
        samples[20]["bin"] = random.Random(5).randbytes(20 << 20)
    write_shards(samples, str(tmp_path / "local/s-%04d.tar"), maxcount=8, fsync=False)
    bucket = object_server.new_bucket("faulty-write")
    seen, proxy = fault_proxy(object_server, random_faults(seed=3, rate=0.34, kinds=("reset", "503"),
                                                           methods=("PUT", "POST")))
    configured(seen, monkeypatch)
    pattern = seen.url(bucket, "w/s-%04d.tar")
    report = write_shards(samples, pattern, maxcount=8, workers=2, tries=8, spool=str(tmp_path / "spool"))
    assert (report.read, report.written, report.shards) == (48, 48, 6)
    assert proxy.faults >= 2, proxy.injected  # the faults did happen, in the uploads
    if object_server.scheme != "gs":  # and the big shard went up in parts (S3 partNumber, Azure blocks)
        assert sum("partNumber=" in q or "comp=block" in q for q in proxy.queries) >= 3, proxy.queries
    configured(object_server, monkeypatch)  # read back from the store itself
    for n in range(6):
        assert read_object(object_server.url(bucket, f"w/s-{n:04d}.tar")) == (tmp_path / f"local/s-{n:04d}.tar").read_bytes()
    index = ShardIndex.load(object_server.url(bucket, "w/index.json"))
    assert index.has_offsets and len(index.shards) == 6
