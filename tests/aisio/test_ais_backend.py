"""The ``ais`` back-end record on a real cluster: listing through it in ShardLister and the CLI,
put then stamp, and AISObjectStream (a ResumingStream) through a relay that cuts bodies at
random bytes and ignores Range, against the object's bytes."""

from __future__ import annotations

import os
import random

import pytest
from faulty_proxy import FaultyRelay

from aisio import AISSourceLister
from aisio.backend import BACKEND
from aisio.client import ENDPOINT_ENV, get_client
from wds_datapipes import ShardLister
from wds_datapipes.cli import expand_urls
from wds_datapipes.shards.openers import backend_for, open_shard, source_stamp

pytestmark = pytest.mark.ais


def test_shard_lister_and_the_cli_list_ais_globs_and_prefixes_through_the_record(dataset):
    """Oracle: AISSourceLister's listing of the same bucket."""
    bucket, _, _ = dataset
    listed = list(AISSourceLister(f"ais://{bucket}/train-"))
    assert backend_for(f"ais://{bucket}/x") == BACKEND
    assert list(ShardLister(f"ais://{bucket}/train-*.tar")) == listed
    assert list(ShardLister(f"ais://{bucket}/")) == listed
    assert expand_urls([f"ais://{bucket}/train-00000[24].tar"]) == [listed[2], listed[4]]
    assert list(ShardLister(f"ais://{bucket}/train-000001.tar")) == [listed[1]]  # one object: no request


def test_put_stores_a_whole_object_whose_stamp_it_returns(bucket, tmp_path):
    local = tmp_path / "s.tar"
    local.write_bytes(os.urandom(200_000))
    url = f"ais://{bucket}/put/s.tar"
    version = BACKEND.put(str(local), url)
    with open_shard(url) as stream:
        assert stream.read() == local.read_bytes() and stream.version == version
    assert source_stamp(url, None) == (200_000, version)


@pytest.mark.parametrize("seed", range(4))
def test_ais_stream_through_random_cuts_gives_the_objects_bytes_once(bucket, monkeypatch, seed):
    """Oracle: the object's bytes from ``start``, as uploaded."""
    rng = random.Random(seed)
    data = rng.randbytes(rng.randrange(50_000, 400_000))
    get_client().bucket(bucket).object("o.tar").get_writer().put_content(data)
    start = rng.randrange(len(data)) if seed % 2 else 0
    cut = rng.randrange(1, len(data) - start)
    with FaultyRelay(os.environ[ENDPOINT_ENV], cut_after=cut, cuts=rng.randrange(1, 4),
                     drop_range=seed >= 2) as relay:
        monkeypatch.setenv(ENDPOINT_ENV, relay.url)
        with open_shard(f"ais://{bucket}/o.tar", start=start) as stream:
            assert stream.read() == data[start:]
            assert stream.size == len(data) and stream.position == len(data)
