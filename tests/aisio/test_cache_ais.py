"""The local shard cache over a real AIStore cluster: one download per object, a hit checked
against the object's version, a changed object fetched again."""

from __future__ import annotations

import glob

from ais_helpers import make_samples, reference_samples, strip_url, write_shards

import wds_datapipes as wd
from aisio import ShardUploader
from aisio.opener import ais_source_stamp


def test_ais_shards_are_read_from_the_cache_from_the_second_epoch_and_refetched_when_changed(bucket, tmp_path):
    uploader = ShardUploader(f"ais://{bucket}/", remove=False)
    paths = write_shards(tmp_path / "v1", make_samples(24, seed=3), per_shard=12, post=uploader)
    urls = sorted(uploader.uploaded)
    size, version = ais_source_stamp(urls[0])
    assert size is not None and version
    wd.set_cache(tmp_path / "cache", "1GB")
    try:
        def epoch():
            return strip_url(wd.ShardLister(urls).load_tar().group_by_key())

        before = wd.cache_stats()
        assert epoch() == reference_samples(paths)
        assert epoch() == reference_samples(paths)
        stats = wd.cache_stats()
        assert (stats.misses - before.misses, stats.hits - before.hits) == (2, 2)
        assert len(glob.glob(str(tmp_path / "cache" / "*.data"))) == 2
        # The same object names, other bytes: the cache sees the new version and reads it again.
        changed = write_shards(tmp_path / "v2", make_samples(24, seed=4), per_shard=12, post=uploader)
        assert ais_source_stamp(urls[0])[1] != version
        assert epoch() == reference_samples(changed)
        assert wd.cache_stats().misses - stats.misses == 2
        assert epoch() == reference_samples(changed) and wd.cache_stats().hits - stats.hits == 2
    finally:
        wd.set_cache(None)


def test_plain_webdataset_reads_ais_shards_through_the_cache(bucket, tmp_path):
    import webdataset as wds

    import aisio  # noqa: F401 - puts its ais:// opener in webdataset's table

    uploader = ShardUploader(f"ais://{bucket}/", remove=False)
    paths = write_shards(tmp_path / "src", make_samples(20, seed=5), per_shard=10, post=uploader)
    urls = sorted(uploader.uploaded)
    wd.set_cache(tmp_path / "cache", "1GB")
    try:
        before = wd.cache_stats()
        for _ in range(2):
            read = [{k: v for k, v in s.items() if k == "__key__" or not k.startswith("__")}
                    for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)]
            assert read == reference_samples(paths)
        stats = wd.cache_stats()
        assert (stats.misses - before.misses, stats.hits - before.hits) == (2, 2)
    finally:
        wd.set_cache(None)


def test_exact_epochs_read_cached_ais_shards_by_their_member_places(bucket, tmp_path, monkeypatch):
    from wds_datapipes.epochs import reading

    uploader = ShardUploader(f"ais://{bucket}/", remove=False)
    paths = write_shards(tmp_path / "src", make_samples(30, seed=6), per_shard=10, post=uploader)
    urls = sorted(uploader.uploaded)
    index = str(tmp_path / "index.json")
    wd.ShardIndex.from_scans(wd.build_index(urls, places=True)).save(index)
    places = wd.ShardIndex.load(index).places
    assert [places.stamp(i)[1] for i in range(len(urls))] == [ais_source_stamp(u)[1] for u in urls]  # versions
    through_headers = []
    real = reading._scanned_span_samples
    monkeypatch.setattr(reading, "_scanned_span_samples", lambda *a, **k: through_headers.append(a[1]) or real(*a, **k))

    def epoch():
        pipe = wd.ExactEpochs(index, batch_size=5, shuffle=False)
        return strip_url({k: v for k, v in s.items() if k != "__pad__"} for s in pipe)

    wd.set_cache(tmp_path / "cache", "1GB")
    try:
        assert epoch() == reference_samples(paths)
        assert len(through_headers) == len(urls)  # no copies yet: through the headers, downloading
        through_headers.clear()
        before = wd.cache_stats()
        assert epoch() == reference_samples(paths)
        assert through_headers == []  # every sample read at its place in a cached copy
        stats = wd.cache_stats()
        assert stats.hits - before.hits == len(urls) and stats.source_bytes == before.source_bytes
    finally:
        wd.set_cache(None)
