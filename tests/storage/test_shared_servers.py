"""The processes of one test run share each emulator (tests/shared_servers.py): the first to
need it starts it, the others use the same one, and the end of the run stops it whole.

The run's "workers" here are threads, each opening the run's lock file on its own (a
``flock`` lock belongs to an open file, so two opens contend as two processes would).
Oracles: the process table (``/proc``: one server process, none left after the stop) and
the server itself (an object written through one worker's view is read through another's
with plain ``urllib``).
"""

from __future__ import annotations

import threading
import urllib.request
from types import SimpleNamespace

import pytest
import shared_servers
from object_servers import ServerUnavailable, group_members
from server_fixtures import cannot_have
from shared_servers import WORKER_KEY, emulator, stop_recorded

pytestmark = pytest.mark.timeout(300)


def _worker_config(folder) -> SimpleNamespace:
    """What a pytest-xdist worker's config holds of the run: the run's folder."""
    return SimpleNamespace(workerinput={WORKER_KEY: str(folder)})


def test_two_workers_that_start_at_once_share_one_server_which_the_run_stops_whole(tmp_path):
    config = _worker_config(tmp_path)
    start = threading.Barrier(2)
    both_in = threading.Barrier(2)
    seen, failed = [], []

    def worker(key: str) -> None:
        try:
            start.wait()
            with emulator(config, "fake-gcs-server") as server:
                bucket = server.new_bucket()
                server.put(bucket, key, key.encode())
                seen.append((server.pid, server.endpoint, bucket, key))
                both_in.wait()  # neither leaves before the other has used the server
        except BaseException as exn:  # noqa: BLE001 (reported by the test's thread)
            failed.append(exn)
            both_in.abort()

    threads = [threading.Thread(target=worker, args=(key,)) for key in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(240)
    if any(isinstance(exn, ServerUnavailable) for exn in failed):
        cannot_have(str(failed[0]))
    assert not failed, failed
    pids = {pid for pid, *_ in seen}
    assert len(pids) == 1 and len(seen) == 2  # one server for both
    (pid,) = pids
    assert group_members(pid) == [pid]  # still running after both workers are done with it
    with emulator(config, "fake-gcs-server") as later:  # a third process of the run: the same server
        assert later.pid == pid
        for _, _, bucket, key in seen:
            url = f"{later.endpoint}/storage/v1/b/{bucket}/o/{key}?alt=media"
            assert urllib.request.urlopen(url, timeout=30).read() == key.encode()
    assert stop_recorded(tmp_path) == []
    assert group_members(pid) == [] and not tmp_path.exists()


def test_a_server_that_cannot_start_is_tried_once_per_run_and_each_worker_meets_the_same_error(
        tmp_path, monkeypatch):
    tries = []

    def launch(workdir, timeout):
        tries.append(workdir)
        raise ServerUnavailable("no Node here (on purpose)")

    monkeypatch.setitem(shared_servers.EMULATORS, "azurite", (launch, None))
    config = _worker_config(tmp_path)
    for _ in range(2):
        with pytest.raises(ServerUnavailable, match="no Node here"), emulator(config, "azurite"):
            pass
    assert len(tries) == 1
    assert stop_recorded(tmp_path) == []
