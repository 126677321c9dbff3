"""A store agent that dies (killed, crashed) or stops answering, in a worker forked after
obstore started: the call in flight fails with a transient error naming the object (never a
wait without end), a fresh agent takes the later calls, and a read resumes at its byte
through it.

Each case runs in a subprocess that starts obstore's runtime (a HEAD), forks, and in the
child reads an object through the agent (PRESIGNED_READS off: the agent relays every
chunk), killing (SIGKILL) or stopping (SIGSTOP) the agent after the first 100 kB; the
subprocess has a timeout, so a hang fails the test. Oracle: the bytes the server's own
writer (plain urllib) put, and the agents' process ids.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap

import pytest
from store_helpers import configured

pytest.importorskip("obstore")
pytestmark = pytest.mark.timeout(300)

DATA = random.Random(7).randbytes(2_000_000)

CHILD = textwrap.dedent("""
    import hashlib, json, os, signal, sys
    from wds_datapipes.limits import Limits
    from wds_datapipes.shards.openers import open_shard, source_stamp
    from wds_datapipes.storage import object_store, store_calls

    url, other, how, retries, out = sys.argv[1:6]
    object_store.PRESIGNED_READS = False  # the agent relays the bytes: it is in the read's path
    limits = Limits(http_timeout=5, http_retries=int(retries))
    source_stamp(url, limits)  # obstore's runtime starts here, before the fork
    pid = os.fork()
    if pid == 0:
        result = {}
        try:
            with open_shard(url, 0, limits) as stream:
                got = bytearray(stream.read(100_000))
                if how == "stop":  # from here on (the agent started), 10 s without an answer is a lost agent
                    store_calls._wait_bound = lambda limits, upload_bytes=0: 10.0
                first = store_calls._the_agent._proc.pid
                os.kill(first, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
                result["agents"] = [first]
                while chunk := stream.read(65536):
                    got += chunk
            result["sha"] = hashlib.sha256(got).hexdigest()
        except Exception as exn:
            result["error"] = f"{type(exn).__name__}: {exn}"
        try:
            result["later"] = source_stamp(other, limits)[0]  # a later call: a fresh agent answers
            result["agents"].append(store_calls._the_agent._proc.pid)
        except Exception as exn:
            result["later_error"] = f"{type(exn).__name__}: {exn}"
        with open(out, "w") as f:
            json.dump(result, f)
        os._exit(0)
    os.waitpid(pid, 0)
""")


def _run(server, bucket, how: str, retries: int, tmp_path) -> dict:
    out = tmp_path / f"{how}-{retries}.json"
    subprocess.run([sys.executable, "-c", CHILD, server.url(bucket, "big.tar"), server.url(bucket, "small.tar"), how,
                    str(retries), str(out)], check=True, timeout=180)
    return json.loads(out.read_text())


@pytest.fixture
def objects(azure_server, monkeypatch):
    configured(azure_server, monkeypatch)
    bucket = azure_server.new_bucket()
    azure_server.put(bucket, "big.tar", DATA)
    azure_server.put(bucket, "small.tar", b"x" * 1234)
    return azure_server, bucket


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_read_resumes_at_its_byte_through_a_new_agent_when_its_agent_is_lost(objects, tmp_path, how):
    import hashlib

    server, bucket = objects
    result = _run(server, bucket, how, 4, tmp_path)
    assert "error" not in result, result
    assert result["sha"] == hashlib.sha256(DATA).hexdigest()
    assert result["later"] == 1234 and len(set(result["agents"])) == 2  # a fresh agent, not the lost one


def test_a_lost_agent_fails_the_read_in_flight_with_an_error_naming_the_object(objects, tmp_path):
    """No retries left: the read fails at once, saying the agent ended and which object it was reading."""
    server, bucket = objects
    result = _run(server, bucket, "kill", 0, tmp_path)
    assert "ShardReadError" in result["error"] and "agent" in result["error"]
    assert f"{bucket}/big.tar" in result["error"] and "ended" in result["error"]
    assert result["later"] == 1234 and len(set(result["agents"])) == 2
