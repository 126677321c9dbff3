"""Exact epochs over shards the cache keeps: read by their member places from the cached
copies once they are whole, through their headers until then (which downloads them), and
through their headers again where the source changed since the index was made."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
from builders import write_index
from shard_server import ShardServer

import wds_datapipes as wd
from wds_datapipes.cache.layer import cached_copy
from wds_datapipes.cache.store import key_of
from wds_datapipes.epochs import placed_reads, reading

pytestmark = pytest.mark.usefixtures("no_cache_left_on")


@pytest.fixture
def remote(sized_shards, tmp_path):
    """(server, urls, paths, index path): 4 shards of 30 samples behind an HTTP server, indexed
    with member places."""
    paths = sized_shards([30, 23, 30, 17], prefix="r", folder=tmp_path / "remote")
    with ShardServer(str(tmp_path / "remote")) as server:
        urls = [server.url(os.path.basename(p)) for p in paths]
        yield server, urls, paths, write_index(urls, tmp_path / "index.json", places=True)


class _HeaderReads:
    """Counts the spans read through tar headers (not by places)."""

    def __init__(self, monkeypatch):
        self.count = 0
        real = reading._scanned_span_samples

        def counted(*args, **kwargs):
            self.count += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(reading, "_scanned_span_samples", counted)


def _epoch(index: str, epoch: int = 0, **options) -> list[tuple[str, bytes, bytes]]:
    """One epoch's samples (in order unless ``options`` say otherwise)."""
    pipe = wd.ExactEpochs(index, batch_size=4, **{"shuffle": False, **options})
    pipe.set_epoch(epoch)
    return [(s["__key__"], bytes(s["cls"]), bytes(s["txt"])) for s in pipe]


def _wait_for_copies(folder: Path, urls: list[str]) -> None:
    """Until the cache holds a complete copy of each of ``urls``."""
    copies = [folder / f"{key_of(url)}.data" for url in urls]
    deadline = time.monotonic() + 10  # a span that stopped early leaves the rest of its shard to a thread
    while not all(c.exists() for c in copies) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert all(c.exists() for c in copies)


def test_an_index_of_remote_shards_records_their_places_and_versions(remote):
    _server, urls, paths, index_path = remote
    index = wd.ShardIndex.load(index_path)
    assert index.places is not None and all(index.places.has(i) for i in range(len(urls)))
    for i, path in enumerate(paths):
        info = os.stat(path)
        assert index.places.stamp(i) == (info.st_size, f'"{info.st_size}-{info.st_mtime_ns}"')  # the ETag


@pytest.mark.parametrize("options", [{}, {"shuffle": True, "seed": 5, "lanes": 2, "block": 8}],
                         ids=["in order", "shuffled"])
def test_exact_epochs_read_cached_remote_shards_by_their_places(remote, tmp_path, monkeypatch, options):
    server, urls, _paths, index_path = remote
    expected = [_epoch(index_path, e, **options) for e in range(2)]  # no cache: through the headers
    wd.set_cache(tmp_path / "cache", "1GB")
    headers = _HeaderReads(monkeypatch)
    faults = wd.cache_stats().faults
    assert _epoch(index_path, 0, **options) == expected[0]
    assert headers.count > 0  # nothing cached yet: read through the headers, which downloads
    assert wd.cache_stats().faults == faults  # two lanes in one shard: neither waited for the other's download
    _wait_for_copies(tmp_path / "cache", urls)
    server.gets.clear()
    headers.count = 0
    before = wd.cache_stats()
    assert _epoch(index_path, 1, **options) == expected[1]
    assert headers.count == 0  # every sample read at its place in a cached copy
    assert sum(server.gets.values()) == 0
    assert wd.cache_stats().disk_bytes - before.disk_bytes > 0
    assert wd.cache_stats().hits - before.hits >= len(urls)


def test_a_shuffled_share_reads_each_cached_shard_s_source_version_once(remote, tmp_path):
    server, urls, _paths, index_path = remote
    options = {"shuffle": True, "seed": 1, "lanes": 2, "block": 4}
    wd.set_cache(tmp_path / "cache", "1GB")
    _epoch(index_path, 0, **options)
    _wait_for_copies(tmp_path / "cache", urls)
    server.heads.clear()
    monkeypatch = pytest.MonkeyPatch()
    with monkeypatch.context() as patch:
        patch.setattr("wds_datapipes.epochs.placed_shuffle.OPEN_PER_LANE", 1)  # shards closed and opened again
        _epoch(index_path, 1, **options)
    assert sorted(server.heads.values()) == [1] * len(urls)  # asked once each, however often reopened


def test_a_remote_shard_changed_since_indexing_is_read_through_its_headers(remote, tmp_path, monkeypatch, caplog):
    _server, urls, paths, index_path = remote
    expected = _epoch(index_path)
    wd.set_cache(tmp_path / "cache", "1GB")
    _epoch(index_path)
    _wait_for_copies(tmp_path / "cache", urls)
    time.sleep(0.01)
    Path(paths[1]).touch()  # the same bytes, another ETag: the copy is fetched again, its places not trusted
    placed_reads._warned.clear()
    headers = _HeaderReads(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="wds_datapipes"):
        assert _epoch(index_path) == expected
        assert _epoch(index_path) == expected
    assert headers.count == 2  # that shard's one span, in each epoch; the others by places
    warned = [r for r in caplog.records if "modified since its member places were taken" in r.getMessage()]
    assert len(warned) == 1 and urls[1] in warned[0].getMessage()


def test_a_remote_shard_of_another_size_than_indexed_is_an_index_mismatch(remote, tmp_path, sized_shards):
    _server, urls, paths, index_path = remote
    wd.set_cache(tmp_path / "cache", "1GB")
    _epoch(index_path)
    _wait_for_copies(tmp_path / "cache", urls)
    sized_shards([90], prefix="r", folder=tmp_path / "grown")
    os.replace(tmp_path / "grown" / "r-000.tar", paths[0])
    assert os.path.getsize(paths[0]) != wd.ShardIndex.load(index_path).shards[0].filesize
    for options in ({"shuffle": True}, {}):
        with pytest.raises(wd.IndexMismatchError, match="bytes, the index says"):
            _epoch(index_path, **options)


def test_local_shards_the_cache_keeps_are_read_by_places_from_their_copies(tmp_path, sized_shards, monkeypatch):
    paths = sized_shards([20, 20, 20], prefix="n", folder=tmp_path / "nfs")
    index_path = write_index(paths, tmp_path / "index.json", places=True)
    expected = _epoch(index_path)
    wd.set_cache(tmp_path / "cache", "1GB", local="all")  # as a shard on a network filesystem is
    assert _epoch(index_path) == expected  # through the headers: that read keeps a copy
    _wait_for_copies(tmp_path / "cache", paths)
    headers = _HeaderReads(monkeypatch)
    before = wd.cache_stats()
    assert _epoch(index_path) == expected
    assert headers.count == 0
    assert wd.cache_stats().disk_bytes - before.disk_bytes >= sum(os.path.getsize(p) for p in paths) // 2
    os.utime(paths[0], ns=(time.time_ns(), time.time_ns() + 10**9))  # touched: its copy is stale, not read
    assert _epoch(index_path) == expected
    assert headers.count == 1


def test_a_cached_copy_that_fails_under_a_placed_read_goes_on_from_the_source(remote, tmp_path, caplog):
    server, urls, paths, _index = remote
    wd.set_cache(tmp_path / "cache", "1GB")
    list(wd.ShardLister([urls[0]]).load_tar())
    copy = cached_copy(urls[0])
    assert copy is not None and copy.size == os.path.getsize(paths[0])
    source = Path(paths[0]).read_bytes()
    try:
        assert copy.pread(1000, 512) == source[512:1512]
        os.truncate(tmp_path / "cache" / f"{key_of(urls[0])}.data", 2048)  # cut behind the cache's back
        server.gets.clear()
        with caplog.at_level(logging.WARNING, logger="wds_datapipes"):
            assert copy.pread(4096, 1024) == source[1024:5120]
            assert copy.pread(300, 5120) == source[5120:5420]  # on from the same source stream
            assert copy.pread(100, 0) == source[:100]  # elsewhere: the source opened there
        assert sum(server.gets.values()) == 2
        assert len([r for r in caplog.records if "ends at byte 2048" in r.getMessage()]) == 1
    finally:
        copy.close()
    assert cached_copy(urls[0]) is None  # the bad copy was dropped: the next read fetches it again


def test_no_copy_is_handed_out_where_the_cache_is_off_or_holds_none(remote, tmp_path):
    _server, urls, _paths, _index = remote
    assert cached_copy(urls[0]) is None
    wd.set_cache(tmp_path / "cache", "1GB")
    assert cached_copy(urls[0]) is None
    assert not list((tmp_path / "cache").glob("*.data"))  # asking downloads nothing


def test_places_are_stamped_with_the_version_of_the_bytes_read_and_not_taken_where_none_is_known(
        tmp_path, sized_shards, remote):
    index_path = remote[3]
    spec = (Path(index_path).parent / "index.places.json").read_text()
    assert '"format": 3' in spec  # remote versions: a format 2 reader would not know them
    local = sized_shards([12], prefix="l", folder=tmp_path / "nfs")
    wd.set_cache(tmp_path / "cache", "1GB", local="all", revalidate=False)
    list(wd.ShardLister(local).load_tar())  # cached, as it was
    _wait_for_copies(tmp_path / "cache", local)
    cached_mtime = os.stat(local[0]).st_mtime_ns
    os.utime(local[0], ns=(cached_mtime + 10**9, cached_mtime + 10**9))  # changed since: the copy is not asked
    scans = wd.build_index([local[0], f"pipe:cat {local[0]}"], places=True)
    assert scans[0].places.version == cached_mtime  # the bytes the places were taken from: the copy's
    assert scans[1].places.names is None  # a pipe: command's output has no version: no places
    pipe_copy = cached_copy(f"pipe:cat {local[0]}")
    assert pipe_copy is not None  # it was cached all the same, as it was read
    pipe_copy.close()


def test_a_failing_copy_never_splices_in_a_changed_source(remote, tmp_path, sized_shards):
    _server, urls, paths, _index = remote
    wd.set_cache(tmp_path / "cache", "1GB")
    list(wd.ShardLister([urls[0]]).load_tar())
    copy = cached_copy(urls[0])
    try:
        time.sleep(0.01)
        Path(paths[0]).touch()  # the source changed (another ETag) while this copy is held
        os.truncate(tmp_path / "cache" / f"{key_of(urls[0])}.data", 1024)
        with pytest.raises(wd.ShardReadError, match="has changed since it was cached"):
            copy.pread(4096, 512)
    finally:
        copy.close()
