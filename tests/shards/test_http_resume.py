"""HttpStream (a ResumingStream) over a real socket against a server that cuts bodies at random
bytes, answers 503, stalls, ignores Range and replaces the object mid-read.

Oracle: the plain bytes of the object as its first answer served it (its ETag names the
version): a read returns exactly them, or ends in our ShardReadError/ShardOpenError naming
the URL after a prefix of them; a body cut with no size said anywhere (HTTP/1.0, no
Content-Length) may end early, and only then.
"""

from __future__ import annotations

import hashlib
import random

import pytest
from shard_server import FAULTS, FaultyShardServer

from wds_datapipes import Limits
from wds_datapipes.errors import ShardOpenError, ShardReadError
from wds_datapipes.shards import http_stream
from wds_datapipes.shards.http_stream import HttpStream

LIMITS = Limits(http_timeout=0.3, http_retries=6)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", range(10))
def test_http_stream_gives_the_objects_bytes_once_or_a_clear_error(seed, no_cache_left_on, monkeypatch):
    monkeypatch.setattr(http_stream, "_BACKOFF_S", 0.01)
    monkeypatch.setattr(http_stream, "_MAX_BACKOFF_S", 0.02)
    rng = random.Random(seed)
    versions = [rng.randbytes(rng.randrange(1, 300_000)) for _ in range(2)]
    faults = [rng.choice((*FAULTS, "ignore-range")) for _ in range(8)]
    if seed % 3 == 0:  # a resume that finds the object replaced
        k = rng.randrange(1, len(faults))
        faults[k - 1 : k + 1] = ["cut", "change"]
    start = rng.randrange(len(versions[0])) if seed % 2 else 0
    with FaultyShardServer({"o.tar": versions}, lambda name, n: faults[n] if n < len(faults) else "ok",
                           stall=0.6, seed=seed) as server:
        url = server.url("o.tar")
        got = bytearray()
        try:
            stream = HttpStream(url, start, LIMITS)
        except ShardOpenError as exn:
            assert exn.url == url
            return
        by_etag = {f'"{hashlib.sha1(v).hexdigest()[:16]}"': v for v in versions}
        expected = by_etag[stream.version][start:]
        try:
            while chunk := stream.read(1 << 16):
                got += chunk
        except ShardReadError as exn:
            assert exn.url == url and exn.offset == start + len(got)
            assert expected.startswith(bytes(got)), "a byte was lost, repeated or wrong before the error"
            return
        finally:
            stream.close()
    assert bytes(got) == expected or (stream.size is None and expected.startswith(bytes(got))), server.answers
