"""A whole epoch of s3://, gs:// and az:// shards read through a proxy failing requests at
random (resets, 500/503 with Retry-After, stalls, bodies cut with and without a length):
every sample arrives exactly once, nothing hangs, and a read that stalls for good ends
within its timeout in an error naming the object.

Oracle: the tar files as written, read back by the standard library's ``tarfile`` (the
multiset of (shard, member, bytes' hash)), sharing no code with the reader under test.
"""

from __future__ import annotations

import collections
import hashlib
import io
import random
import tarfile
import time

import pytest
from fault_proxy import random_faults
from store_helpers import configured

import wds_datapipes as wd
from wds_datapipes.errors import ShardReadError
from wds_datapipes.shards.openers import open_shard
from wds_datapipes.storage import retry

pytest.importorskip("obstore")
pytestmark = pytest.mark.timeout(420)

# Each fault as often as listed: cuts (a resume at the exact byte) most, stalls (each waits
# out the read timeout) least.
KINDS = ("reset", "reset", "500", "503", "503", "cut", "cut", "cut", "cut-unsized", "cut-unsized", "stall",
         "stall-head")
# (shards, faults that must fire over the epoch) per store: the full 1,000 on AIStore's /s3,
# fewer on the emulators (slower per request on a loaded machine; the same code reads all three).
PLAN = {"s3": (220, 1000), "gs": (60, 250), "az": (60, 250)}
RATE = 0.8  # each GET (reads and listing pages) fails with this probability


def _write_shards(folder, count: int, seed: int) -> dict[str, bytes]:
    """``count`` tar files of 3 to 6 samples (a ``cls`` and a ``bin`` of random size), written
    with ``tarfile``; their bytes by name."""
    draws = random.Random(seed)
    shards = {}
    for shard in range(count):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(draws.randint(3, 6)):
                for ext, data in (("cls", str(i).encode()), ("bin", draws.randbytes(draws.randint(0, 6000)))):
                    info = tarfile.TarInfo(f"s{shard:04d}-{i:02d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        name = f"shard-{shard:04d}.tar"
        (folder / name).write_bytes(out.getvalue())
        shards[name] = (folder / name).read_bytes()
    return shards


def _oracle(folder, names) -> collections.Counter:
    """(shard, key, extension, sha256) of every member of the tar files in ``folder``, by ``tarfile``."""
    found = collections.Counter()
    for name in names:
        with tarfile.open(folder / name) as tar:
            for member in tar.getmembers():
                key, _, ext = member.name.partition(".")
                found[name, key, ext, hashlib.sha256(tar.extractfile(member).read()).hexdigest()] += 1
    return found


def _read(samples) -> collections.Counter:
    got = collections.Counter()
    for sample in samples:
        shard = sample["__url__"].rsplit("/", 1)[1]
        for ext, data in sample.items():
            if not ext.startswith("__"):
                got[shard, sample["__key__"], ext, hashlib.sha256(data).hexdigest()] += 1
    return got


@pytest.fixture
def quick_backoff(monkeypatch):
    """Waits between tries of 10 to 50 ms instead of 0.5 to 8 s (the policy's settings, not its
    logic: a thousand faults would otherwise be waited out for many minutes)."""
    real = retry.RetryPolicy.for_limits.__func__

    def for_limits(cls, limits=None, *, first_wait_s=0.01, max_wait_s=0.05):
        return real(cls, limits, first_wait_s=first_wait_s, max_wait_s=max_wait_s)

    monkeypatch.setattr(retry.RetryPolicy, "for_limits", classmethod(for_limits))


def test_a_thousand_faults_over_an_epoch_lose_and_repeat_nothing(object_server, fault_proxy, monkeypatch, tmp_path,
                                                                   quick_backoff):
    """Reads (first requests, resumed bodies) and listing pages all meet faults; the epoch
    listed from a glob through the proxy holds every sample of every shard once."""
    count, wanted = PLAN[object_server.scheme]
    bucket = object_server.new_bucket()
    shards = _write_shards(tmp_path, count, seed=7)
    for name, data in shards.items():
        object_server.put(bucket, f"epoch/{name}", data)
    through, proxy = fault_proxy(object_server, random_faults(seed=11, rate=RATE, kinds=KINDS), stall_s=60,
                                 retry_after=1, seed=5)
    configured(through, monkeypatch)
    previous = wd.set_limits(http_timeout=1.5, http_retries=60)
    started = time.monotonic()
    try:
        pipe = wd.ShardLister(through.url(bucket, "epoch/shard-*.tar")).load_tar().group_by_key()
        got = _read(pipe)
    finally:
        wd.set_limits(previous)
    took = time.monotonic() - started
    print(f"{object_server.scheme}: {proxy.faults} faults {dict(proxy.injected)} over {len(proxy.log)} requests "
          f"in {took:.1f} s")
    expected = _oracle(tmp_path, shards)
    assert got == expected, (set(expected) - set(got), set(got) - set(expected))
    assert all(n == 1 for n in got.values())
    assert proxy.faults >= wanted, dict(proxy.injected)
    assert set(proxy.injected) >= {"reset", "500", "503", "cut", "cut-unsized", "stall", "stall-head"}
