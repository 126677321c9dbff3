"""Reads in a process forked after its parent used obstore: the store agent only signs, and the
bytes come straight from the server by a presigned URL (``storage/signed_get.py``); where a
store cannot presign (fake-gcs-server) the agent relays them. Resume, retries and the ETag
pin hold on that path as on obstore's, and the presigned URL's signature shows nowhere.

Oracles: the bytes the servers' own writer put (``ObjectServer.put``: plain urllib); the
samples webdataset's TarWriter wrote; for the secret, the signature values the fault proxy
saw in each request's query string, searched for in the log text, the error text and the
pickle bytes.
"""

from __future__ import annotations

import json
import logging
import pickle
import random
import subprocess
import sys
import textwrap
from urllib.parse import parse_qs, unquote

import pytest
from fault_proxy import first_faults, random_faults
from store_helpers import check_a_change_mid_read_is_a_read_error, configured, shard_bytes

from wds_datapipes.errors import ShardOpenError, ShardReadError
from wds_datapipes.limits import Limits
from wds_datapipes.shards.openers import open_shard, source_stamp
from wds_datapipes.storage import object_store

pytest.importorskip("obstore")
pytestmark = pytest.mark.timeout(300)

FAST = Limits(http_timeout=3, http_retries=8)
SIGNATURE = {"s3": "X-Amz-Signature", "az": "sig"}  # the query parameter holding the signature
SIGNS = ("s3", "az")  # the emulators that accept presigned URLs (fake-gcs-server cannot sign)


def _data(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def _signed(queries: list[str]) -> list[str]:
    """The query strings that carried a signature."""
    return [q for q in queries if any(f"{name}=" in q for name in SIGNATURE.values())]


def _recorded(schedule, queries: list[str]):
    """``schedule``, recording each request's query as it comes (the proxy's own log has an
    exchange only once it ended)."""
    def recording(request):
        queries.append(request.query)
        return schedule(request)
    return recording


def test_a_forked_process_reads_from_any_byte_by_presigned_urls(store, fault_proxy, monkeypatch, forked):
    bucket = store.new_bucket()
    data = _data(1, 300_001)
    store.put(bucket, "dir/obj.tar", data)
    queries = []
    through, _ = fault_proxy(store, _recorded(lambda request: "ok", queries))
    configured(through, monkeypatch)
    url = through.url(bucket, "dir/obj.tar")
    stamp = source_stamp(url, FAST)
    assert stamp[0] == len(data) and stamp[1]
    for start in (0, 1, 4096, 150_000, len(data) - 1, len(data)):
        with open_shard(url, start, FAST) as stream:
            assert stream.read() == data[start:], start
            assert (stream.size, stream.version) == stamp
    assert bool(_signed(queries)) == (store.scheme in SIGNS)  # where the store cannot sign, the agent read


@pytest.mark.parametrize("fault", ["cut", "reset", "503", "cut-unsized", "stall"])
def test_a_presigned_read_resumes_at_the_exact_byte(store, fault_proxy, monkeypatch, caplog, forked, fault):
    bucket = store.new_bucket()
    data = _data(2, 2_000_000)
    store.put(bucket, "obj.tar", data)
    faults, queries = first_faults(fault, times=2 if fault == "stall" else 3), []

    def schedule(request):  # records the queries as they come (the proxy logs a stalled one only once it ends)
        queries.append(request.query)
        return faults(request)

    through, _ = fault_proxy(store, schedule, stall_s=30)
    configured(through, monkeypatch)
    with open_shard(through.url(bucket, "obj.tar"), 1000, FAST) as stream:
        got = bytearray()
        while chunk := stream.read(65536):
            got += chunk
    assert bytes(got) == data[1000:]
    assert [r for r in caplog.records if "resuming at byte" in r.message or "trying again" in r.message]
    assert any(f"{SIGNATURE.get(store.scheme)}=" in q for q in queries) == (store.scheme in SIGNS)


def test_an_object_changed_mid_presigned_read_is_a_read_error_saying_so(store, fault_proxy, monkeypatch, forked):
    check_a_change_mid_read_is_a_read_error(store, fault_proxy, monkeypatch, FAST)


@pytest.fixture(params=SIGNS)
def signing_store(request, monkeypatch):
    """Each test server that accepts presigned URLs (fake-gcs-server cannot sign: no URL to leak)."""
    server = request.getfixturevalue({"s3": "s3_server", "az": "azure_server"}[request.param])
    return configured(server, monkeypatch)


@pytest.mark.parametrize("where", ["forked", "in-process"])
def test_no_presigned_signature_shows_in_errors_logs_or_pickles(signing_store, fault_proxy, monkeypatch, caplog,
                                                                  request, where):
    """A read that fails for good (503 after its first answer), a missing object and an
    object changed mid-read, in a forked process (its agent signs) and in one calling obstore
    itself (it signs): the signature values the proxy saw appear in none of the log text, the
    errors' text and their pickles, nor the stream's refusal to pickle."""
    store = signing_store
    if where == "forked":
        request.getfixturevalue("forked")
    else:
        monkeypatch.setattr(object_store, "_unsigned", set())
    caplog.set_level(logging.DEBUG, logger="wds_datapipes")
    bucket = store.new_bucket()
    store.put(bucket, "obj.tar", _data(6, 500_000))
    store.put(bucket, "changes.tar", _data(7, 500_000))

    def schedule(request):
        path = unquote(request.path)
        if request.method != "GET" or not any(f"{n}=" in request.query for n in SIGNATURE.values()):
            return "ok"
        if "changes.tar" in path and request.number > 0:
            store.put(bucket, "changes.tar", _data(8, 500_000))
        return "cut" if request.number == 0 else ("503" if "obj.tar" in path else "ok")

    queries = []
    through, _ = fault_proxy(store, _recorded(schedule, queries))
    configured(through, monkeypatch)
    errors, shown = [], []
    for key in ("obj.tar", "missing.tar", "changes.tar"):
        try:
            with open_shard(through.url(bucket, key), 0, Limits(http_timeout=3, http_retries=2)) as stream:
                with pytest.raises(TypeError) as refused:
                    pickle.dumps(stream)
                shown.append(str(refused.value))
                stream.read()
        except (ShardOpenError, ShardReadError) as exn:
            errors.append(exn)
    assert [type(e) for e in errors] == [ShardReadError, ShardOpenError, ShardReadError]
    for exn in errors:
        shown += [str(exn), repr(exn), str(exn.__cause__), str(exn.__context__)]
    blobs = [pickle.dumps(exn) for exn in errors]
    text = "\n".join(shown + [caplog.text] + [r.getMessage() for r in caplog.records])
    secrets = {value for query in _signed(queries) for value in parse_qs(query)[SIGNATURE[store.scheme]]}
    assert secrets  # the reads went by presigned URLs
    for secret in secrets:
        for form in {secret, secret.replace("+", "%2B").replace("/", "%2F").replace("=", "%3D")}:
            assert form not in text
            assert not [blob for blob in blobs if form.encode() in blob]


WORKERS = textwrap.dedent("""
    import json, sys
    import wds_datapipes as wd
    from torch.utils.data import DataLoader
    from wds_datapipes.shards.openers import backend_for

    def key(sample):
        return sample["__key__"]

    if __name__ == "__main__":
        spec, out = sys.argv[1:]
        urls = list(backend_for(spec).list(spec))  # obstore used in the parent, before the workers fork
        wd.set_limits(http_timeout=5, http_retries=12)
        pipe = wd.ShardLister(urls).load_tar().group_by_key().map(key)
        loader = DataLoader(pipe, num_workers=3, batch_size=None, multiprocessing_context="fork")
        json.dump(list(loader), open(out, "w"))
""")


def test_workers_forked_after_obstore_read_every_sample_once_through_faults(store, fault_proxy, monkeypatch,
                                                                            tmp_path):
    """DataLoader workers forked after the parent listed the bucket with obstore read every
    sample once, by presigned URLs, though the first GET of each shard and a fifth of the
    later ones reset, answer 503 or are cut (where the store cannot presign, the agent reads
    them, unfaulted)."""
    bucket = store.new_bucket()
    expected = []
    for shard in range(6):
        store.put(bucket, f"w/shard-{shard}.tar", shard_bytes(f"s{shard}", 30, size=20_000))
        expected += [f"s{shard}-{i:04d}" for i in range(30)]
    kinds = ("reset", "503", "cut")
    later = random_faults(seed=11, rate=0.2, kinds=kinds)

    def schedule(request):
        if not any(f"{n}=" in request.query for n in SIGNATURE.values()):
            return "ok"
        return kinds[int(request.path.rsplit("-", 1)[-1][0]) % 3] if request.number == 0 else later(request)

    queries = []
    through, proxy = fault_proxy(store, _recorded(schedule, queries))
    configured(through, monkeypatch)
    script = tmp_path / "workers.py"
    script.write_text(WORKERS)
    subprocess.run([sys.executable, str(script), through.url(bucket, "w/*.tar"), str(tmp_path / "out.json")],
                   check=True, timeout=240)
    assert sorted(json.loads((tmp_path / "out.json").read_text())) == expected
    if store.scheme in SIGNS:
        assert len(_signed(queries)) >= 12 and proxy.faults >= 6
    else:
        assert not _signed(queries)


def test_a_signed_url_never_shows_or_pickles_its_query():
    from wds_datapipes.storage.signed_get import SignedUrl

    signed = SignedUrl("http://host/b/k?X-Amz-Signature=deadbeefcafe&X-Amz-Credential=AKID")
    assert "deadbeef" not in repr(signed) + str(signed) + f"{signed}"
    with pytest.raises(TypeError, match="secret"):
        pickle.dumps(signed)


def test_a_runtime_started_by_any_road_is_noted_before_a_fork():
    """obstore's runtime started without our mark (a store built and used directly, or a test that
    put the mark back): a child forked after it still knows, and never calls into the copied
    runtime (which hangs). Oracle: the tokio threads in /proc/self/task, and the child's answer."""
    code = textwrap.dedent("""
        import os, obstore
        from obstore.store import MemoryStore
        from wds_datapipes.storage import store_calls
        obstore.put(MemoryStore(), "k", b"x")  # the runtime starts, not through store_calls
        assert store_calls._runtime_pid is None
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, b"1" if store_calls.forked_after_runtime() else b"0")
            os._exit(0)
        os.waitpid(pid, 0)
        print(os.read(read, 1).decode(), store_calls.forked_after_runtime())
    """)
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "False"]


def test_a_child_forked_while_a_thread_held_the_connection_pool_lock_does_not_wait_on_it():
    """The kept-connection pool's lock held by another thread at the fork: the child gets a lock
    of its own and no parent connection. Oracle: the child's answer within the timeout."""
    code = textwrap.dedent("""
        import os, threading
        from wds_datapipes.storage import signed_get
        held, release = threading.Event(), threading.Event()
        def hold():
            with signed_get._idle_lock:
                held.set()
                release.wait(30)
        threading.Thread(target=hold, daemon=True).start()
        held.wait(10)
        pid = os.fork()
        if pid == 0:
            got = signed_get._idle_connection((os.getpid(), "http", "h:1"))
            os._exit(0 if got is None else 3)
        _, status = os.waitpid(pid, 0)
        release.set()
        print(os.waitstatus_to_exitcode(status))
    """)
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0"]
