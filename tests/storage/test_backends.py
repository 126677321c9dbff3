"""The one registry of back-end records: no silent replacement, records found through entry
points in a fresh process (a DataLoader worker's situation), listing through the record in
ShardLister and the CLI (lazily), and the file back end's put."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from wds_datapipes import ShardLister
from wds_datapipes.cli import expand_urls
from wds_datapipes.shards import openers
from wds_datapipes.shards.openers import backend_for, file_version, register_backend, register_opener
from wds_datapipes.storage.backend import Backend

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def registry(monkeypatch):
    """The registry as it is, restored after the test."""
    monkeypatch.setattr(openers, "_BACKENDS", dict(openers._BACKENDS))
    monkeypatch.setattr(openers, "_NO_ENTRY_POINT", set())


def _open_nothing(url: str):
    raise OSError("not here")


def test_a_taken_scheme_is_not_replaced_silently(registry):
    first = Backend("memo", _open_nothing)
    register_backend(first)
    register_backend(first)  # the same record again: no change, no error
    second = Backend("memo", _open_nothing, stamp=lambda url, limits: (1, "v"))
    with pytest.raises(ValueError, match="'memo' has a back end already"):
        register_backend(second)
    assert backend_for("memo://x") is first
    register_backend(second, replace=True)
    assert backend_for("memo://x") is second


def test_register_opener_replaces_the_open_and_keeps_the_schemes_list_and_put(registry):
    before = backend_for("file:///x")
    register_opener("file", _open_nothing)
    after = backend_for("file:///x")
    assert after.open is _open_nothing and after.list is before.list and after.put is before.put


def test_shard_lister_and_the_cli_list_through_the_record_and_the_first_url_comes_before_the_listing_ends(registry):
    """A record's list is asked for every URL after braces; oracle: the names it yields, in order."""
    release = threading.Event()
    ended = []

    def listing(spec: str, limits):
        if "*" not in spec:
            yield spec
            return
        base = spec.rsplit("/", 1)[0]
        yield f"{base}/a.tar"
        release.wait(timeout=10)  # the next page
        yield f"{base}/b.tar"
        ended.append(spec)

    register_backend(Backend("memo", _open_nothing, list=listing))
    urls = iter(ShardLister("memo://bucket/*.tar"))
    assert next(urls) == "memo://bucket/a.tar" and not ended  # before the listing's end
    release.set()
    assert list(urls) == ["memo://bucket/b.tar"] and ended
    assert expand_urls(["memo://bucket/*.tar", "memo://bucket/c-{0..1}.tar"]) == [
        "memo://bucket/a.tar", "memo://bucket/b.tar", "memo://bucket/c-0.tar", "memo://bucket/c-1.tar"]
    assert sorted(ShardLister("memo://bucket/*.tar", shuffle=True, seed=1)) == ["memo://bucket/a.tar",
                                                                               "memo://bucket/b.tar"]


def test_an_unknown_scheme_is_listed_as_it_is_and_looked_up_once(registry, monkeypatch):
    lookups = []
    real = openers.entry_points
    monkeypatch.setattr(openers, "entry_points", lambda **kw: lookups.append(kw) or real(**kw))
    urls = [f"nosuch://b/{i}.tar" for i in range(50)]
    assert list(ShardLister(urls)) == urls
    assert len(lookups) == 2  # the two groups, once for the scheme


def test_the_file_back_end_puts_a_whole_file_under_its_name(tmp_path):
    source = tmp_path / "local.tar"
    source.write_bytes(os.urandom(100_000))
    dest = tmp_path / "out" / "shard-000.tar"
    version = backend_for(str(dest)).put(str(source), str(dest), None)
    assert dest.read_bytes() == source.read_bytes() and not Path(f"{dest}.part").exists()
    assert version == file_version(dest.stat().st_mtime_ns)
    assert backend_for(str(dest)).stamp(str(dest), None) == (100_000, version)


def test_entry_point_records_load_in_a_fresh_process_without_an_import(tmp_path):
    """A worker started by spawn has imported nothing of the back end: the entry point finds it."""
    (tmp_path / "memo_backend.py").write_text(textwrap.dedent("""
        import io
        from wds_datapipes.storage.backend import Backend

        def _open(url, start=0):
            return io.BytesIO(url.encode()[start:])

        def _list(spec, limits):
            yield from (spec.replace("*", str(i)) for i in range(3))

        BACKEND = Backend("memo", _open, list=_list)
    """))
    info = tmp_path / "memo_backend-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: memo-backend\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[wds_datapipes.backends]\nmemo = memo_backend:BACKEND\n")
    script = textwrap.dedent("""
        import sys
        from wds_datapipes import ShardLister
        from wds_datapipes.shards.openers import backend_for, open_shard
        assert "memo_backend" not in sys.modules and "aisio" not in sys.modules
        print(list(ShardLister("memo://b/*.tar")), open_shard("memo://b/x.tar", start=2).read().decode())
        ais = backend_for("ais://bucket/object.tar")
        print(ais.scheme, ais.list is not None, ais.stamp is not None, ais.put is not None)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    done = subprocess.run([sys.executable, "-c", script], check=False, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["['memo://b/0.tar', 'memo://b/1.tar', 'memo://b/2.tar'] mo://b/x.tar",
                                        "ais True True True"]
