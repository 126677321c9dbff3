"""The local shard cache: remote shards read once per machine, within a size limit at every
moment, one download shared by every reader, and the source behind every fault."""

from __future__ import annotations

import glob
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from shard_server import ShardServer

import wds_datapipes as wd
from wds_datapipes.cache import layer as cache
from wds_datapipes.cache import store as cache_store
from wds_datapipes.cache import streams as cache_streams
from wds_datapipes.cache.layer import parse_size
from wds_datapipes.cache.store import LEDGER_ROOM, key_of

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("no_cache_left_on")


@pytest.fixture
def served(sized_shards, tmp_path):
    """(server, urls, paths): ``n`` shards of ``samples`` samples behind a counting HTTP server."""
    servers = []

    def make(n: int = 4, samples: int = 40, rate: float = 0, prefix: str = "u") -> tuple[ShardServer, list, list]:
        paths = sized_shards([samples] * n, prefix=prefix, folder=tmp_path / "remote")
        server = ShardServer(str(tmp_path / "remote"), rate).__enter__()
        servers.append(server)
        return server, [server.url(os.path.basename(p)) for p in paths], paths

    yield make
    for server in servers:
        server.__exit__()


def _read(urls) -> list[tuple[str, bytes]]:
    return [(s["__key__"], s["txt"]) for s in wd.ShardLister(list(urls)).load_tar().group_by_key()]


def _entry_bytes(folder, ledger: bool = False) -> int:
    """What the cache's copies and downloads take (and its ledger's files, with ``ledger``)."""
    total = 0
    paths = glob.glob(os.path.join(folder, "*.data")) + glob.glob(os.path.join(folder, "*.part"))
    for path in paths + (glob.glob(os.path.join(folder, "ledger.sqlite*")) if ledger else []):
        try:
            total += os.stat(path).st_size
        except FileNotFoundError:
            pass
    return total


def _leftovers(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.endswith((".part", ".lock")))


def test_sizes_read_as_people_write_them():
    assert parse_size("200GB") == 200 * 10**9
    assert parse_size("1.5 GiB") == int(1.5 * 2**30)
    assert parse_size("500M") == 500 * 10**6 and parse_size(4096) == 4096 and parse_size("10") == 10
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")


def test_the_cache_is_off_by_default_and_a_second_epoch_reads_nothing_from_the_source(served, tmp_path):
    server, urls, _ = served()
    assert wd.get_cache() is None
    expected = _read(urls)
    assert sum(server.gets.values()) == len(urls)
    server.gets.clear()
    wd.set_cache(tmp_path / "cache", "1GB")
    before = wd.cache_stats()
    assert _read(urls) == expected  # epoch 1: downloaded while read
    assert server.gets == dict.fromkeys((u.rpartition("/")[2] for u in urls), 1)
    assert _read(urls) == expected  # epoch 2: from disk (HEAD requests only)
    assert sum(server.gets.values()) == len(urls)
    stats = wd.cache_stats()
    assert (stats.hits - before.hits, stats.misses - before.misses) == (len(urls), len(urls))
    assert stats.disk_bytes - before.disk_bytes == stats.source_bytes - before.source_bytes > 0
    assert wd.cache_stats(shared=True).hits >= len(urls)
    assert _leftovers(tmp_path / "cache") == []


def test_settings_reach_spawned_processes_through_the_environment(tmp_path):
    wd.set_cache(tmp_path / "c", "2GB")
    assert os.environ["WDS_CACHE_DIR"] == str(tmp_path / "c") and os.environ["WDS_CACHE_LIMIT"] == "2000000000"
    code = "import wds_datapipes as wd; s = wd.get_cache(); print(s.directory, s.limit)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(tmp_path / "c"), "2000000000"]
    env = {**os.environ, "WDS_CACHE_DIR": str(tmp_path / "d"), "WDS_CACHE_LIMIT": "200GB"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.split() == [str(tmp_path / "d"), str(200 * 10**9)]
    wd.set_cache(None)
    assert "WDS_CACHE_DIR" not in os.environ and wd.get_cache() is None


def test_the_limit_is_never_exceeded_while_reading_and_the_part_that_fits_stays(served, tmp_path):
    _server, urls, paths = served(n=8, samples=60)
    size = os.path.getsize(paths[0])
    limit = LEDGER_ROOM + (64 << 10) + 4 * size + 4096 * 4 + size // 2  # the ledger, four shards and a half
    wd.set_cache(tmp_path / "cache", limit)
    expected = _read(urls)
    peak, stop = [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _entry_bytes(tmp_path / "cache", ledger=True))
            time.sleep(0.0005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        hits = []
        for _ in range(3):
            before = wd.cache_stats().hits
            assert _read(urls) == expected
            hits.append(wd.cache_stats().hits - before)
    finally:
        stop.set()
        sampler.join()
    assert 0 < peak[0] <= limit
    assert hits[1:] == [4, 4]  # the four that fit are read from disk every epoch, no churn
    assert _leftovers(tmp_path / "cache") == []


def test_a_shard_larger_than_the_limit_is_streamed_uncached(served, tmp_path):
    server, urls, paths = served(n=2)
    wd.set_cache(tmp_path / "cache", os.path.getsize(paths[0]) // 2)
    expected = _read(urls)
    assert _read(urls) == expected
    assert sum(server.gets.values()) == 4 and wd.cache_stats().uncached >= 4
    assert _entry_bytes(tmp_path / "cache") == 0


def test_a_second_reader_reads_along_instead_of_downloading_again(served, tmp_path):
    server, urls, _paths = served(n=2, samples=200, rate=4 << 20)
    wd.set_cache(tmp_path / "cache", "1GB")
    results = [None, None]

    def reader(i):
        results[i] = _read(urls)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[0] == results[1] and len(results[0]) == 400
    assert all(n == 1 for n in server.gets.values()), (server.gets, wd.cache_stats())
    assert wd.cache_stats().read_along >= 1


RANK = textwrap.dedent("""
    import json, sys
    import wds_datapipes as wd
    from torch.utils.data import DataLoader

    def key(sample):
        return sample["__key__"]

    if __name__ == "__main__":
        cache, method, out, *urls = sys.argv[1:]
        wd.set_cache(cache, "1GB")
        pipe = wd.ShardLister(urls).load_tar().group_by_key().map(key)
        # The workers split the shards; both ranks read them all (no process group): the cache
        # alone keeps the second rank from downloading them again.
        loader = DataLoader(pipe, num_workers=2, batch_size=None, multiprocessing_context=method)
        json.dump(list(loader), open(out, "w"))
""")


def test_two_ranks_of_two_workers_fetch_each_shard_once(served, tmp_path):
    server, urls, _ = served(n=4, samples=150, rate=8 << 20)
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    ranks = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "cache"), method,
                               str(tmp_path / f"out{r}.json"), *urls], cwd=ROOT)
             for r, method in enumerate(("fork", "spawn"))]
    assert [rank.wait(timeout=240) for rank in ranks] == [0, 0]
    assert server.gets == dict.fromkeys((u.rpartition("/")[2] for u in urls), 1)
    for r in range(2):
        keys = (tmp_path / f"out{r}.json").read_text()
        assert keys.count('"u0-0000"') == 1 and keys.count('"u3-0149"') == 1 and keys.count('"') == 2 * 600
    assert _leftovers(tmp_path / "cache") == []


KILLED = textwrap.dedent("""
    import sys
    import wds_datapipes as wd
    wd.set_cache(sys.argv[1], "1GB")
    for sample in wd.ShardLister([sys.argv[2]]).load_tar().group_by_key():
        print(sample["__key__"], flush=True)
""")


def test_a_reader_killed_mid_download_leaves_nothing_usable_and_the_next_run_cleans_up(served, tmp_path):
    server, urls, _ = served(n=1, samples=400, rate=1 << 20)
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "cache"), urls[0]], stdout=subprocess.PIPE,
                            cwd=ROOT)
    proc.stdout.readline()  # it has started reading
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    key = key_of(urls[0])
    assert os.path.exists(tmp_path / "cache" / f"{key}.part")  # half written ...
    assert not os.path.exists(tmp_path / "cache" / f"{key}.data")  # ... and never complete
    server.rate = 0
    wd.set_cache(tmp_path / "cache", "1GB")
    samples = _read(urls)
    assert len(samples) == 400 and samples[-1][0] == "u0-0399"
    assert os.path.exists(tmp_path / "cache" / f"{key}.data") and _leftovers(tmp_path / "cache") == []
    assert _read(urls) == samples and server.gets[urls[0].rpartition("/")[2]] == 2


@pytest.mark.parametrize("damage", ["truncated", "changed"])
def test_a_corrupted_entry_is_read_from_the_source_with_one_warning(served, tmp_path, caplog, damage):
    _server, urls, _ = served(n=1)
    wd.set_cache(tmp_path / "cache", "1GB")
    expected = _read(urls)
    data = tmp_path / "cache" / f"{key_of(urls[0])}.data"
    if damage == "truncated":
        os.truncate(data, data.stat().st_size // 2)
    else:
        raw = bytearray(data.read_bytes())
        raw[600:610] = b"XXXXXXXXXX"
        data.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, "wds_datapipes"):
        assert _read(urls) == expected
    assert len([r for r in caplog.records if "changed on disk" in r.message]) == 1
    assert _read(urls) == expected and wd.cache_stats().hits >= 1  # fetched again, then cached again


def test_verify_finds_an_entry_changed_behind_the_cache_s_back(served, tmp_path):
    _server, urls, _ = served(n=2)
    wd.set_cache(tmp_path / "cache", "1GB")
    expected = _read(urls)
    assert wd.verify_cache() == []
    data = tmp_path / "cache" / f"{key_of(urls[1])}.data"
    info = data.stat()
    raw = bytearray(data.read_bytes())
    raw[700] ^= 1
    data.write_bytes(bytes(raw))
    os.utime(data, ns=(info.st_atime_ns, info.st_mtime_ns))  # same size, same mtime: only the CRC tells
    problems = wd.verify_cache()
    assert len(problems) == 1 and urls[1] in problems[0] and "CRC-32" in problems[0]
    assert not data.exists()  # removed: the next read fetches it again
    assert _read(urls) == expected


def test_a_changed_remote_object_is_fetched_again_never_mixed(served, tmp_path, sized_shards):
    server, urls, _paths = served(n=1, samples=30)
    wd.set_cache(tmp_path / "cache", "1GB")
    old = _read(urls)
    time.sleep(0.01)
    sized_shards([31], prefix="u", folder=tmp_path / "remote")  # rewrites u-000.tar: another size and ETag
    new = _read(urls)
    assert len(new) == 31 and new != old
    assert server.gets[urls[0].rpartition("/")[2]] == 2 and _read(urls) == new


@pytest.mark.parametrize(("revalidate", "asked"), [(True, [1, 1, 1]), (3600, [0, 0, 0]), (False, [0, 0, 0]),
                                                   (0.2, [1, 0, 1])])
def test_revalidation_asks_the_source_as_often_as_told(served, tmp_path, revalidate, asked):
    server, urls, _ = served(n=2)
    wd.set_cache(tmp_path / "cache", "1GB", revalidate=revalidate)
    expected = _read(urls)  # downloaded: checked now
    heads = []
    for pause in (0.25, 0, 0.25):  # 0.2 s between checks: the second read comes too soon
        time.sleep(pause)
        server.heads.clear()
        assert _read(urls) == expected
        heads.append(sum(server.heads.values()) // len(urls))
    assert heads == asked
    cache._settings_read = False  # as a spawned worker reads the settings: from the environment
    assert wd.get_cache().revalidate == revalidate
    with pytest.raises(ValueError, match="revalidate"):
        wd.set_cache(tmp_path / "cache", "1GB", revalidate=-1)


def _synced() -> None:
    for thread in threading.enumerate():
        if thread.name == "wds-cache-sync":
            thread.join()


def test_a_copy_s_bytes_are_synced_to_the_disk_and_the_ledger_says_so(served, tmp_path, monkeypatch):
    _server, urls, _ = served(n=1)
    wd.set_cache(tmp_path / "cache", "1GB")
    data = tmp_path / "cache" / f"{key_of(urls[0])}.data"
    ledger = tmp_path / "cache" / "ledger.sqlite"
    synced, real_sync = [], os.fdatasync

    def fdatasync(fd):
        row = sqlite3.connect(ledger).execute("SELECT state, unsynced FROM entries").fetchone()
        synced.append((os.fstat(fd).st_ino == data.stat().st_ino, row))
        real_sync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    _read(urls)
    _synced()
    assert synced == [(True, ("done", cache_store.BOOT))]  # the complete copy, while the ledger says "unsynced"
    assert sqlite3.connect(ledger).execute("SELECT unsynced FROM entries").fetchall() == [(None,)]


def test_a_copy_not_synced_before_the_machine_went_down_is_fetched_again(served, tmp_path):
    server, urls, _ = served(n=2)
    wd.set_cache(tmp_path / "cache", "1GB")
    expected = _read(urls)
    _synced()
    with sqlite3.connect(tmp_path / "cache" / "ledger.sqlite") as db:  # as if written in an earlier boot, unsynced
        db.execute("UPDATE entries SET unsynced='an earlier boot' WHERE url=?", (urls[0],))
    wd.set_cache(tmp_path / "cache", "1GB")  # the cache opened again: it drops that entry
    server.gets.clear()
    assert _read(urls) == expected
    assert server.gets == {urls[0].rpartition("/")[2]: 1}


def test_a_full_disk_goes_on_from_the_source_with_one_warning(served, tmp_path, monkeypatch, caplog):
    _server, urls, _ = served(n=2, samples=100)
    wd.set_cache(tmp_path / "cache", "1GB")
    expected = _read(urls)
    shutil.rmtree(tmp_path / "cache")
    wd.set_cache(tmp_path / "cache", "1GB")
    real_write, written = os.write, [0]

    def filling(fd, data):  # the disk fills up after 20 KB
        if written[0] > 20_000:
            raise OSError(28, "No space left on device")
        written[0] += len(data)
        return real_write(fd, data)

    monkeypatch.setattr(cache_streams.os, "write", filling)
    with caplog.at_level(logging.WARNING, "wds_datapipes"):
        assert _read(urls) == expected
    warned = [r for r in caplog.records if "No space left" in r.message]
    assert 1 <= len(warned) <= 2  # one per shard whose write failed
    assert _entry_bytes(tmp_path / "cache") == 0 and _leftovers(tmp_path / "cache") == []


def test_an_unusable_or_vanished_cache_directory_reads_from_the_source(served, tmp_path, caplog):
    _server, urls, _ = served(n=2)
    (tmp_path / "a-file").write_text("not a directory")
    wd.set_cache(tmp_path / "a-file" / "cache", "1GB")
    with caplog.at_level(logging.WARNING, "wds_datapipes"):
        expected = _read(urls)
        assert _read(urls) == expected
    assert len([r for r in caplog.records if "cannot be used" in r.message]) == 1
    wd.set_cache(tmp_path / "cache", "1GB")
    assert _read(urls) == expected
    shutil.rmtree(tmp_path / "cache")  # vanished under a running job
    assert _read(urls) == expected and _read(urls) == expected


def test_pipe_urls_that_differ_only_in_their_command_are_kept_apart(tmp_path, sized_shards):
    a = sized_shards([5], prefix="a", folder=tmp_path / "x")[0]
    b = sized_shards([7], prefix="b", folder=tmp_path / "y")[0]
    urls = [f"pipe:cat {a}", f"pipe:cat {b}", f"pipe:cat {a} | cat"]
    wd.set_cache(tmp_path / "cache", "1GB")
    first = [_read([u]) for u in urls]
    assert [len(s) for s in first] == [5, 7, 5]
    assert len(glob.glob(str(tmp_path / "cache" / "*.data"))) == 3
    os.remove(a)  # from now on only the cache has it
    assert [_read([u]) for u in urls] == first


def test_local_files_are_cached_only_on_network_filesystems_unless_asked(tmp_path, sized_shards):
    paths = sized_shards([5, 5])
    wd.set_cache(tmp_path / "cache", "1GB")
    _read(paths)
    assert glob.glob(str(tmp_path / "cache" / "*.data")) == []
    wd.set_cache(tmp_path / "cache", "1GB", local="all")
    expected = _read(paths)
    assert len(glob.glob(str(tmp_path / "cache" / "*.data"))) == 2
    time.sleep(0.01)
    Path(paths[0]).touch()  # another mtime: the entry is stale
    assert _read(paths) == expected and wd.cache_stats().misses >= 3


def test_exact_epochs_read_cached_shards_by_offsets(served, tmp_path):
    server, urls, _ = served(n=4, samples=30)
    index = str(tmp_path / "remote.json")
    wd.ShardIndex.from_scans(wd.build_index(urls)).save(index)
    assert wd.ShardIndex.load(index).has_offsets

    def epoch(e):
        pipe = wd.ExactEpochs(index, batch_size=8, shuffle=True, seed=3, lanes=2)
        pipe.set_epoch(e)
        return [s["__key__"] for s in pipe]

    expected = [epoch(e) for e in range(2)]
    wd.set_cache(tmp_path / "cache", "1GB")
    first = epoch(0)
    deadline = time.monotonic() + 10  # a span that stopped early leaves the rest of its shard to a thread
    while len(glob.glob(str(tmp_path / "cache" / "*.data"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    server.gets.clear()
    assert [first, epoch(1)] == expected
    assert sum(server.gets.values()) == 0  # every span read from the cached copies, by offsets


def test_a_shard_index_read_over_http_with_the_cache_on_is_read_from_the_source_without_a_warning(
        served, tmp_path, caplog):
    server, urls, _ = served(n=2)
    wd.ShardIndex.from_scans(wd.build_index(urls)).save(str(tmp_path / "remote" / "train.json"))
    wd.set_cache(tmp_path / "cache", "1GB")
    index_url = server.url("train.json")
    with caplog.at_level(logging.WARNING, logger="wds_datapipes"):
        for _ in range(2):
            assert len(list(wd.ExactEpochs(index_url, batch_size=4))) > 0
    assert [r for r in caplog.records if "shard cache" in r.getMessage()] == []
    assert len(glob.glob(str(tmp_path / "cache" / "*.data"))) == 2  # the shards' copies, not the index's


def test_load_tar_logs_the_cache_s_counters_at_an_epoch_s_end_only_while_it_is_on(served, tmp_path, caplog):
    """load_tar (in shards/, below the cache) reaches the counters through openers' report_stream_layer.
    Oracle: the logged counters are wd.cache_stats() after the epoch, and nothing is logged with the cache off."""
    _server, urls, _ = served(n=2)
    with caplog.at_level(logging.INFO, "wds_datapipes"):
        _read(urls)
    assert not [r for r in caplog.records if r.message.startswith("shard cache")]
    wd.set_cache(tmp_path / "cache", "1GB")
    with caplog.at_level(logging.INFO, "wds_datapipes"):
        _read(urls)
    logged = [r.message for r in caplog.records if r.message.startswith("shard cache, this epoch's process")]
    assert logged == [f"shard cache, this epoch's process so far: {wd.cache_stats()}"]
