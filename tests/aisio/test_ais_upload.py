"""Uploading shards from webdataset's ShardWriter into a bucket."""

from __future__ import annotations

import os

import pytest
from ais_helpers import make_samples, reference_samples, strip_url, write_shards

from aisio import AISSourceLister, ShardUploader, UploadError, upload_file


def test_shard_writer_post_uploads_each_shard_then_removes_the_local_file(ais_endpoint, bucket, tmp_path):
    samples = make_samples(30, seed=2)
    seen_on_disk = []
    uploader = ShardUploader(f"ais://{bucket}/sub/")

    def post(path):
        seen_on_disk.append(os.path.exists(path))
        uploader(path)
        assert not os.path.exists(path)  # removed once uploaded

    paths = write_shards(tmp_path / "out", samples, per_shard=8, post=post)
    assert seen_on_disk == [True] * 4 and not list((tmp_path / "out").iterdir())
    assert uploader.uploaded == [f"ais://{bucket}/sub/{os.path.basename(p)}" for p in paths]
    got = list(AISSourceLister(f"ais://{bucket}/sub/").load_tar().group_by_key())
    assert strip_url(got) == [{k: v for k, v in s.items()} for s in samples]


def test_uploaded_shards_equal_the_local_files(ais_endpoint, bucket, tmp_path):
    paths = write_shards(tmp_path, make_samples(10, seed=3), per_shard=5)
    for p in paths:
        upload_file(p, f"ais://{bucket}/{os.path.basename(p)}")
    assert all(os.path.exists(p) for p in paths)  # remove=False keeps them
    got = AISSourceLister(f"ais://{bucket}/").load_tar().group_by_key()
    assert strip_url(got) == reference_samples(paths)


def test_a_failed_upload_raises_and_keeps_the_local_file(ais_endpoint, tmp_path):
    paths = write_shards(tmp_path, make_samples(3, seed=4), per_shard=3)
    uploader = ShardUploader("ais://no-such-bucket-up/", create_bucket=False)
    with pytest.raises(UploadError, match=r"no-such-bucket-up.*does not exist.*local file is kept"):
        uploader(paths[0])
    assert os.path.exists(paths[0]) and uploader.uploaded == []
