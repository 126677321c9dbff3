"""The writer to any back end with a ``put`` (``s3://``, ``gs://``, ``az://`` take this road):
here an in-memory store registered as ``memtest://``, with failures on demand."""

from __future__ import annotations

import io
import os

import pytest

from tests.writing.conftest import make_samples
from tests.writing.memory_store import MemoryStore
from wds_datapipes.epochs.exact_epochs import ExactEpochs
from wds_datapipes.epochs.index import ShardIndex
from wds_datapipes.errors import ShardWriteError
from wds_datapipes.shards import openers
from wds_datapipes.storage.backend import Backend
from wds_datapipes.writing import write_shards
from wds_datapipes.writing.destination import find_put, join_any


@pytest.fixture
def store(monkeypatch) -> MemoryStore:
    memory = MemoryStore()
    monkeypatch.setitem(openers._BACKENDS, "memtest",
                        Backend("memtest", memory.open, stamp=memory.stamp, put=memory.put))
    return memory


def _local(tmp_path, samples, **settings) -> dict[str, bytes]:
    write_shards(samples, str(tmp_path / "local/s-%04d.tar"), fsync=False, **settings)
    return {p.name: p.read_bytes() for p in sorted((tmp_path / "local").glob("s-*.tar"))}


def _shards(store: MemoryStore) -> dict[str, bytes]:
    return {url.rsplit("/", 1)[-1]: data for url, data in store.objects.items() if url.rsplit("/", 1)[-1][:2] == "s-"}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_back_end_with_a_put_gets_every_shard_whole_then_the_index_and_exact_epochs_reads_it(
        store, tmp_path, workers):
    """Oracle: the same run written to a local folder (byte for byte)."""
    samples = make_samples(50, seed=3)
    store.spool, store.slow = str(tmp_path / "spool"), 0.02
    report = write_shards(samples, "memtest://b/d/s-%04d.tar", maxcount=6, workers=workers,
                          spool=str(tmp_path / "spool"), uploads=1)
    assert (report.read, report.written, report.shards) == (50, 50, 9)
    assert _shards(store) == _local(tmp_path, samples, maxcount=6)
    assert store.puts[-1] == "index.json" and {"index.offsets", "index.places.json"} <= set(store.puts)
    assert max(store.spool_seen) <= 2 * workers + 1 + 1 and not os.listdir(tmp_path / "spool")
    index = ShardIndex.load("memtest://b/d/index.json")
    assert index.url(0) == "memtest://b/d/s-0000.tar" and index.has_offsets
    keys = [s["__key__"] for s in ExactEpochs(index, batch_size=1, shuffle=False, rank=0, world_size=1)]
    assert keys == [s["__key__"] for s in samples]


def test_a_failed_put_is_tried_again_and_one_that_keeps_failing_stops_the_run_naming_the_shard(store, tmp_path):
    samples = make_samples(30, seed=4)
    store.fail["s-0001.tar"] = 2
    write_shards(samples, "memtest://b/s-%04d.tar", maxcount=10, tries=3, spool=str(tmp_path / "spool"))
    assert store.puts.count("s-0001.tar") == 1 and _shards(store) == _local(tmp_path, samples, maxcount=10)

    store.objects.clear()
    store.fail["s-0002.tar"] = 99
    with pytest.raises(ShardWriteError, match=r"memtest://b2/s-0002.tar.*failed 3 times.*reset while uploading"):
        write_shards(samples, "memtest://b2/s-%04d.tar", maxcount=10, tries=3, spool=str(tmp_path / "spool"))
    assert "memtest://b2/s-0002.tar" not in store.objects and "memtest://b2/index.json" not in store.objects
    assert not os.listdir(tmp_path / "spool")


def test_a_run_stopped_half_way_resumes_from_the_records_at_the_destination(store, tmp_path):
    """Oracle: an uninterrupted local run. The second run has no local state at all (a new spool)."""
    samples = make_samples(60, seed=5)
    store.fail["s-0004.tar"] = 99
    with pytest.raises(ShardWriteError, match="s-0004"):
        write_shards(samples, "memtest://b/s-%04d.tar", maxcount=6, tries=1, spool=str(tmp_path / "one"))
    recorded = {f"s-{int(url[-14:-5]):04d}.tar" for url in store.objects if url[-14:-5].isdigit()}
    first = list(store.puts)
    del store.fail["s-0004.tar"]
    del store.objects["memtest://b/s-0001.tar"]  # a shard lost since it was recorded: written again
    store.puts.clear()
    report = write_shards(samples, "memtest://b/s-%04d.tar", maxcount=6, spool=str(tmp_path / "two"))
    rewritten = [name for name in store.puts if name.startswith("s-")]
    assert recorded == {name for name in first if name.startswith("s-")}  # every shard stored was recorded
    assert "s-0001.tar" in recorded and "s-0004.tar" not in recorded
    assert "s-0001.tar" in rewritten and not (recorded - {"s-0001.tar"}) & set(rewritten)  # only what is missing
    assert report.resumed == len(recorded) - 1 and (report.read, report.written) == (60, 60)
    assert _shards(store) == _local(tmp_path, samples, maxcount=6)
    keys = [s["__key__"] for s in ExactEpochs("memtest://b/index.json", batch_size=1, shuffle=False,
                                              rank=0, world_size=1)]
    assert keys == [s["__key__"] for s in samples]  # no duplicate, no gap

    with pytest.raises(ShardWriteError, match="other settings"):
        write_shards(samples, "memtest://b/s-%04d.tar", maxcount=7)
    store.puts.clear()
    again = write_shards(samples, "memtest://b/s-%04d.tar", maxcount=6, restart=True)
    assert again.resumed == 0 and sum(n.startswith("s-") for n in store.puts) == 10


def test_a_scheme_without_a_put_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(openers._BACKENDS, "readonly", Backend("readonly", lambda url, start=0: io.BytesIO()))
    with pytest.raises(ShardWriteError, match="'readonly' back end has no put"):
        find_put("readonly://b/s-0000.tar")
    with pytest.raises(ShardWriteError, match="no back end can store it"):
        write_shards(make_samples(3), "nosuchscheme://b/s-%04d.tar", spool=str(tmp_path))


def test_two_ranks_write_to_the_store_and_one_join_makes_the_index_of_a_one_rank_run(store, tmp_path):
    """Oracle: the index of the same input written by one rank (its shard list and offsets)."""
    samples = make_samples(40, seed=8)
    for rank in (0, 1):
        report = write_shards(samples, "memtest://two/s-%04d.tar", maxcount=6, rank=rank, world=2)
        assert report.index is None and report.shards == (4 if rank == 0 else 3)
    with pytest.raises(ShardWriteError, match="rank 0 of 3 has not started"):
        join_any("memtest://two/index.json", 3, str(tmp_path))
    joined = join_any("memtest://two/index.json", 2, str(tmp_path))
    write_shards(samples, "memtest://one/s-%04d.tar", maxcount=6)
    one = ShardIndex.load("memtest://one/index.json")
    again = ShardIndex.load("memtest://two/index.json")
    assert [s.nsamples for s in joined.shards] == [s.nsamples for s in one.shards] == [s.nsamples for s in again.shards]
    assert (again.offsets_array() == one.offsets_array()).all()
    assert [again.url(n).replace("two", "one") for n in range(len(again))] == [one.url(n) for n in range(len(one))]


def test_shards_in_a_store_with_the_index_and_progress_kept_locally_resume_and_read_back(store, tmp_path):
    """Oracle: the local run's shard bytes; the second run finds every shard in the store as recorded."""
    samples = make_samples(30, seed=12)
    index = str(tmp_path / "state/index.json")
    write_shards(samples, "memtest://m/s-%04d.tar", maxcount=7, index=index, spool=str(tmp_path / "spool"))
    assert _shards(store) == _local(tmp_path, samples, maxcount=7)
    del store.objects["memtest://m/s-0002.tar"]
    store.puts.clear()
    again = write_shards(samples, "memtest://m/s-%04d.tar", maxcount=7, index=index)
    assert again.resumed == 4 and store.puts == ["s-0002.tar"]
    keys = [s["__key__"] for s in ExactEpochs(index, batch_size=1, shuffle=False, rank=0, world_size=1)]
    assert keys == [s["__key__"] for s in samples]


def test_a_failure_is_a_missing_object_by_its_words_or_status_never_by_digits_in_a_name():
    """A transient failure naming a bucket whose name holds 404 is tried again, not taken for a missing one."""
    from wds_datapipes.writing.destination import is_missing

    assert not is_missing(ConnectionResetError("reset while uploading to s3://test-5d404ba1840d/s-0404.tar"))
    assert not is_missing(OSError("503 from bucket runs-404.b"))
    assert is_missing(OSError("HTTP Error 404: Not Found"))
    assert is_missing(OSError("Server returned non-2xx status code: 404"))
    assert is_missing(FileNotFoundError("s3://b/k"))


def test_a_failure_is_a_missing_object_by_its_status_never_by_a_404_segment_in_a_key_or_bucket():
    """A transient failure (a reset, a 503, an object store's transient kind) on
    ``s3://runs-404/shards/404/x.tar`` is not a missing object; a 404 status is, however the
    error carries it. Oracle: the status each error was built with (obstore's kind through
    store_calls.classify, an HTTP status attribute, a status in words)."""
    from wds_datapipes.errors import ShardOpenError, ShardWriteError
    from wds_datapipes.storage.store_calls import MISSING_BUCKET, TRANSIENT, StoreFailure, classify
    from wds_datapipes.writing.destination import is_missing

    url = "s3://runs-404/shards/404/x.tar"

    def raised(error: Exception, cause: Exception) -> Exception:
        error.__context__ = cause  # what object_store's `raise ... from None` inside `except` leaves
        error.__suppress_context__ = True
        return error

    transient = StoreFailure(TRANSIENT, f"Generic S3 error: error sending request for url (http://h/{url[5:]})")
    assert not is_missing(ConnectionResetError(f"reset while uploading {url}"))
    assert not is_missing(OSError(f"timed out: /404/ in {url}"))
    assert not is_missing(ShardWriteError(f"transient failure ({transient.message})", shard=url))
    assert not is_missing(raised(ShardWriteError(f"uploading {url}: /404/", shard=url), transient))
    assert not is_missing(raised(ShardOpenError(url, "503 Slow Down on /runs-404/shards/404/"), transient))
    missing = classify(FileNotFoundError(f"Object at location shards/404/x.tar not found: {url}"))
    assert is_missing(raised(ShardOpenError(url, "the object does not exist"), missing))
    assert is_missing(raised(ShardWriteError("the bucket does not exist", shard=url), StoreFailure(MISSING_BUCKET, "")))
    assert is_missing(OSError("HTTP Error 404: Not Found")) and is_missing(OSError("status code: 404, body: x"))
