"""The shard cache behind a server that fails, cuts, stalls and changes its answers, and in a
directory someone else may reach into: a copy is kept only when the source said the read
succeeded and its bytes are a whole tar; planted links are never followed; a directory
another user owns or may write is refused."""

from __future__ import annotations

import io
import logging
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import webdataset as wds
from shard_server import FAULTS, FaultyShardServer, ShardServer, tarfile_samples

import wds_datapipes as wd
from wds_datapipes import CacheDirectoryError, Limits, WdsError
from wds_datapipes.cache import layer as cache
from wds_datapipes.cache.store import key_of
from wds_datapipes.shards import http_stream

pytestmark = [pytest.mark.usefixtures("no_cache_left_on"), pytest.mark.timeout(300)]
CURL = shutil.which("curl")
FAST = Limits(http_timeout=0.5, http_retries=3, pipe_timeout=0.5, pipe_grace=2)
WEIGHTS = {"ok": 30, "503": 15, "cut": 10, "cut-unsized": 20, "stall": 5, "late-tail": 10, "change": 10}
assert set(WEIGHTS) == set(FAULTS)


def _tar(shard: int, version: int, rng: random.Random) -> bytes:
    """A shard's bytes: a few samples of random sizes, each version with other contents."""
    out = io.BytesIO()
    with wds.TarWriter(out) as writer:
        for i in range(rng.randrange(3, 9)):
            writer.write({"__key__": f"s{shard}-{i:03d}", "cls": f"{version}".encode(),
                          "bin": rng.randbytes(rng.randrange(10, 30_000))})
    return out.getvalue()


def _samples(url: str, limits: Limits | None = None) -> list[tuple[str, dict[str, bytes]]]:
    pipe = wd.ShardLister([url]).load_tar(limits=limits).group_by_key()
    return [(s["__key__"], {k: v for k, v in s.items() if not k.startswith("__")}) for s in pipe]


@pytest.fixture
def quick_retries(monkeypatch):
    monkeypatch.setattr(http_stream, "_BACKOFF_S", 0.01)
    monkeypatch.setattr(http_stream, "_MAX_BACKOFF_S", 0.02)


@pytest.mark.parametrize(("scheme", "revalidate"), [
    ("http", True), ("http", False),  # without revalidation nothing but the check at the commit catches a cut
    pytest.param("pipe", False, marks=pytest.mark.skipif(CURL is None, reason="needs curl"))])
@pytest.mark.parametrize("seed", range(6))
def test_the_cache_behind_a_server_that_fails_cuts_and_changes_answers_never_keeps_a_bad_copy(
        scheme, revalidate, seed, tmp_path, quick_retries):
    """Over a seeded schedule of faults (503 pages, bodies cut with and without a
    Content-Length, stalls, late record padding, objects replaced between requests), every
    read of a shard yields the samples of one of its versions or raises our error after a
    prefix of one; then, with the server healthy again, every shard reads whole, from a
    copy that ``verify_cache`` passes: no failed read was kept. Oracle: tarfile reading
    each version's bytes as written."""
    rng = random.Random(seed)
    versions = {f"s{i}.tar": [_tar(i, v, rng) for v in range(2)] for i in range(3)}
    expected = {name: [tarfile_samples(data) for data in datas] for name, datas in versions.items()}
    faulty = {"on": True}

    def schedule(name: str, number: int) -> str:
        pick = random.Random(f"{seed}/{name}/{number}")
        return pick.choices(list(WEIGHTS), list(WEIGHTS.values()))[0] if faulty["on"] else "ok"

    wd.set_cache(tmp_path / "cache", "1GB", revalidate=revalidate)
    with FaultyShardServer(versions, schedule, stall=1.0, seed=seed) as server:
        urls = {name: server.url(name) if scheme == "http" else f"pipe:curl -s {server.url(name)}"
                for name in versions}
        for _epoch in range(3):
            for name, url in urls.items():
                got = []
                try:
                    for sample in wd.ShardLister([url]).load_tar(limits=FAST).group_by_key():
                        got.append((sample["__key__"], {k: v for k, v in sample.items() if not k.startswith("__")}))
                except WdsError:
                    assert any(got == whole[: len(got)] for whole in expected[name]), (name, server.answers)
                else:
                    assert got in expected[name], (name, server.answers)
        faulty["on"] = False
        for name, url in urls.items():
            got = _samples(url)  # no error: a failed read never became the copy
            now = expected[name][server.current[name]]
            assert got == now if revalidate else got in expected[name], (name, server.answers)
        assert wd.verify_cache() == []
        assert {name for name, _ in server.answers} == set(versions)


@pytest.mark.skipif(CURL is None, reason="needs curl")
@pytest.mark.parametrize("fault", ["503", "cut-unsized"])
def test_a_failed_read_through_pipe_curl_is_not_kept(fault, tmp_path):
    """``curl -s`` exits 0 on a 503 page and on an HTTP/1.0 body cut short: only the bytes
    tell. Oracle: tarfile reading the shard's bytes as written."""
    versions = {"s.tar": [_tar(0, 0, random.Random(1))]}
    with FaultyShardServer(versions, lambda name, n: fault if n == 0 else "ok") as server:
        url = f"pipe:curl -s {server.url('s.tar')}"
        wd.set_cache(tmp_path / "cache", "1GB")
        with pytest.raises(WdsError):
            _samples(url)
        assert _samples(url) == tarfile_samples(versions["s.tar"][0])  # fetched again: the failed read was not kept
        hits = wd.cache_stats().hits
        assert _samples(url) == tarfile_samples(versions["s.tar"][0]) and wd.cache_stats().hits == hits + 1


def test_verify_finds_a_copy_that_is_not_a_whole_tar(tmp_path, sized_shards):
    """A copy an older version kept of a cut read (its size, mtime and CRC-32 as recorded)."""
    (path,) = sized_shards([20], folder=tmp_path / "remote")
    with ShardServer(str(tmp_path / "remote")) as server:
        url = server.url(os.path.basename(path))
        wd.set_cache(tmp_path / "cache", "1GB")
        _samples(url)
        data = tmp_path / "cache" / f"{key_of(url)}.data"
        cut = data.read_bytes()[:5000]
        data.write_bytes(cut)
        info = data.stat()
        with sqlite3.connect(tmp_path / "cache" / "ledger.sqlite") as db:
            db.execute("UPDATE entries SET size=?, mtime_ns=?, crc=? WHERE key=?",
                       (len(cut), info.st_mtime_ns, zlib.crc32(cut), key_of(url)))
        problems = wd.verify_cache()
        assert len(problems) == 1 and url in problems[0] and "not a whole tar" in problems[0]
        assert not data.exists()
        assert wd.verify_cache() == []


def test_links_planted_at_the_cache_s_file_names_are_never_followed(tmp_path, sized_shards):
    """Oracle: the victim file's bytes and mode before; the samples as read without the cache."""
    paths = sized_shards([20, 20], folder=tmp_path / "remote")
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"the victim's own bytes\n")
    before = victim.stat()
    with ShardServer(str(tmp_path / "remote")) as server:
        urls = [server.url(os.path.basename(p)) for p in paths]
        expected = [_samples(url) for url in urls]

        def plant(url: str) -> None:
            for kind in ("part", "data", "lock"):
                os.symlink(victim, folder / f"{key_of(url)}.{kind}")

        plant(urls[0])  # before the cache opens the directory
        wd.set_cache(folder, "1GB")
        assert _samples(urls[0]) == expected[0]
        plant(urls[1])  # while it is open
        assert _samples(urls[1]) == expected[1]
        hits = wd.cache_stats().hits
        assert [_samples(url) for url in urls] == expected and wd.cache_stats().hits == hits + 2
    assert victim.read_bytes() == b"the victim's own bytes\n"
    after = victim.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_mode) == (before.st_size, before.st_mtime_ns, before.st_mode)
    assert not any(os.path.islink(folder / name) for name in os.listdir(folder))


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_cache_directory_another_user_owns_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(CacheDirectoryError, match="owned by user 65534"):
        wd.set_cache(theirs, "1GB")
    assert wd.get_cache() is None


def test_a_cache_directory_others_may_write_is_refused_and_reads_go_to_the_source(tmp_path, sized_shards,
                                                                                   monkeypatch, caplog):
    (path,) = sized_shards([10], folder=tmp_path / "remote")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(CacheDirectoryError, match="writable by others"):
        wd.set_cache(shared, "1GB")
    # A worker that finds it in the environment: one warning, reads from the source, writes nothing there.
    monkeypatch.setenv(cache.DIR_ENV, str(shared))
    monkeypatch.setattr(cache, "_settings_read", False)
    with ShardServer(str(tmp_path / "remote")) as server, caplog.at_level(logging.WARNING, "wds_datapipes"):
        url = server.url(os.path.basename(path))
        assert _samples(url) == _samples(url) == tarfile_samples(Path(path).read_bytes())
    assert len([r for r in caplog.records if "writable by others" in r.message]) == 1
    assert os.listdir(shared) == []


def test_verify_of_a_mistyped_cache_directory_fails_and_makes_nothing(tmp_path):
    missing = tmp_path / "no-such-cache"
    run = subprocess.run([sys.executable, "-m", "wds_datapipes", "verify", "--cache-dir", str(missing)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode != 0 and "does not exist" in run.stderr
    assert not missing.exists()
