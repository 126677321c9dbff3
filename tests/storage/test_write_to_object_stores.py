"""The shard writer straight into s3://, gs:// and az:// (each test server), through their back ends' put.

The servers and back ends come from the object-store work (tests/server_fixtures.py,
tests/storage/conftest.py, wds_datapipes/storage/object_store.py); on a tree without
them these tests skip, saying so.
"""

from __future__ import annotations

import pytest
from store_helpers import configured

from tests.writing.conftest import make_samples
from wds_datapipes.epochs.exact_epochs import ExactEpochs
from wds_datapipes.epochs.index import ShardIndex
from wds_datapipes.shards.openers import open_source
from wds_datapipes.writing import write_shards


@pytest.fixture(params=["s3", "gs", "az"])
def store(request, monkeypatch):
    """Each object-store test server, its standard variables set (tests/storage/store_helpers.py's ``configured``)."""
    server = request.getfixturevalue({"s3": "s3_server", "gs": "gcs_server", "az": "azure_server"}[request.param])
    return configured(server, monkeypatch)


def _read(url: str) -> bytes:
    stream = open_source(url)
    try:
        return stream.read()
    finally:
        stream.close()


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
        assert _read(pattern % n) == (tmp_path / f"local/s-{n:04d}.tar").read_bytes()
    index = ShardIndex.load(store.url(bucket, "w/index.json"))
    assert index.has_offsets and index.url(2) == pattern % 2
    keys = [s["__key__"] for s in ExactEpochs(index, batch_size=1, shuffle=False, rank=0, world_size=1)]
    assert keys == [s["__key__"] for s in samples]
    again = write_shards(samples, pattern, maxcount=8, spool=str(tmp_path / "spool2"))  # a new machine
    assert again.resumed == 5 and again.written == 40
