"""Restarts, fresh runs and shrunk resumes at a destination that lists but cannot delete:
an in-memory store registered as ``memlist://`` (put, stamp, a glob list; no delete: the
``store`` fixture of conftest.py)."""

from __future__ import annotations

import pytest

from tests.writing.conftest import make_samples
from wds_datapipes.errors import ShardWriteError
from wds_datapipes.writing import write_shards


@pytest.mark.parametrize("local_index", [False, True])
def test_a_restart_at_a_destination_that_cannot_delete_is_refused_naming_the_shards(store, tmp_path, local_index):
    """oracle: the store's objects before and after (nothing written by the refused run)."""
    index = {"index": str(tmp_path / "state/index.json")} if local_index else {}
    samples = make_samples(40)
    write_shards(samples, "memlist://b/s-%04d.tar", maxcount=10, spool=str(tmp_path), **index)
    assert store.shards() == [f"s-{n:04d}.tar" for n in range(4)]
    before = dict(store.objects)
    with pytest.raises(ShardWriteError, match=r"cannot remove the 4 shards.*memlist://b/s-0000\.tar.*Remove them"):
        write_shards(samples, "memlist://b/s-%04d.tar", maxcount=40, restart=True, spool=str(tmp_path), **index)
    assert store.objects == before
    for n in range(4):
        del store.objects[f"memlist://b/s-{n:04d}.tar"]
    report = write_shards(samples, "memlist://b/s-%04d.tar", maxcount=40, restart=True, spool=str(tmp_path), **index)
    assert store.shards() == ["s-0000.tar"] and report.index.total == 40


def test_a_fresh_run_beside_unrecorded_objects_is_refused(store, tmp_path):
    """oracle: the planted object (no progress record at the destination names it)."""
    store.objects["memlist://b/s-0007.tar"] = b"x" * 1024
    with pytest.raises(ShardWriteError, match=r"1 shards named like this run's.*s-0007\.tar"):
        write_shards(make_samples(10), "memlist://b/s-%04d.tar", maxcount=5, spool=str(tmp_path))
    assert store.shards() == ["s-0007.tar"]


def test_a_remote_resume_whose_input_shrank_is_refused(store, tmp_path):
    """oracle: the shard past the shrunk plan, found by listing the destination and named."""
    samples = make_samples(40)
    write_shards(samples, "memlist://b/s-%04d.tar", maxcount=10, spool=str(tmp_path))
    with pytest.raises(ShardWriteError, match=r"shrank or changed.*3 shards.*s-0003\.tar"):
        write_shards(samples[:30], "memlist://b/s-%04d.tar", maxcount=10, spool=str(tmp_path))
    changed = [dict(s) for s in samples]
    changed[12]["bin"] = b"other"
    with pytest.raises(ShardWriteError, match=r"shard 1: its sample 2, 's00012'.*bin 5 bytes") as caught:
        write_shards(changed, "memlist://b/s-%04d.tar", maxcount=10, spool=str(tmp_path))
    assert caught.value.shard == "memlist://b/s-0001.tar"
