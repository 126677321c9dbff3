"""The loaders over ``s3://`` URLs: DataLoader with 8 workers started by fork (the parent
having used obstore before, so that each worker calls through an agent, and not) and by
spawn, ``torchdata.nodes`` (newest stack) and DataLoader2 with the reading service (torchdata
<= 0.9): every sample exactly once per epoch, and no hang (each run has a timeout).

Oracle: the tar files as written, read back by the standard library's ``tarfile`` (the
multiset of (shard, key, extension, bytes' hash)).
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import random
import subprocess
import sys
import tarfile
import textwrap

import pytest
from stack import DataLoader2, needs_dataloader2
from store_helpers import configured, tar_of

pytest.importorskip("obstore")
pytestmark = pytest.mark.timeout(300)

SHARDS, SAMPLES = 16, 4  # small: 8 workers share 2 cores here

JOB = textwrap.dedent("""
    import hashlib, json, sys
    import wds_datapipes as wd
    from wds_datapipes.shards.openers import backend_for

    def hashed(sample):
        shard = sample["__url__"].rsplit("/", 1)[1]
        return [[shard, sample["__key__"], ext, hashlib.sha256(data).hexdigest()]
                for ext, data in sorted(sample.items()) if not ext.startswith("__")]

    def pipe(spec):
        return wd.ShardLister(spec).load_tar().group_by_key()

    def epochs(loader, n=2):
        return [[row for rows in loader for row in rows] for _ in range(n)]

    if __name__ == "__main__":
        how, spec, parent_used, out = sys.argv[1:]
        if parent_used == "yes":  # obstore's runtime started here, before any worker starts
            assert list(backend_for(spec).list(spec))
        if how in ("fork", "spawn"):
            from torch.utils.data import DataLoader
            loader = DataLoader(pipe(spec).map(hashed), num_workers=8, batch_size=None,
                                multiprocessing_context=how, timeout=120, persistent_workers=True)
            got = epochs(loader)
        elif how == "nodes":
            import torchdata.nodes as tn
            node = tn.ParallelMapper(tn.IterableWrapper(pipe(spec)), map_fn=hashed, num_workers=2,
                                     method="process", in_order=True)
            loader = tn.Loader(tn.Prefetcher(node, prefetch_factor=4))
            got = epochs(loader)
        else:
            from torchdata.dataloader2 import DataLoader2
            loader = DataLoader2(pipe(spec).map(hashed),
                                 reading_service=wd.MultiProcessingReadingService(num_workers=4))
            try:
                got = epochs(loader)
            finally:
                loader.shutdown()
        json.dump(got, open(out, "w"))
""")


@pytest.fixture
def s3_shards(s3_server, monkeypatch, tmp_path):
    """SHARDS tar files of SAMPLES samples, written with ``tarfile`` into a folder and put in a
    fresh bucket; (the glob URL naming them, the oracle's multiset)."""
    configured(s3_server, monkeypatch)
    bucket = s3_server.new_bucket()
    draws = random.Random(3)
    expected = collections.Counter()
    for shard in range(SHARDS):
        members = [(f"s{shard:02d}-{i}.{ext}", data) for i in range(SAMPLES)
                   for ext, data in (("cls", str(i).encode()), ("bin", draws.randbytes(draws.randint(1, 3000))))]
        name = f"shard-{shard:02d}.tar"
        (tmp_path / name).write_bytes(tar_of(members))
        s3_server.put(bucket, f"l/{name}", (tmp_path / name).read_bytes())
        with tarfile.open(tmp_path / name) as tar:  # the oracle: the file as written, read by tarfile
            for member in tar.getmembers():
                key, _, ext = member.name.partition(".")
                expected[name, key, ext, hashlib.sha256(tar.extractfile(member).read()).hexdigest()] += 1
    return s3_server.url(bucket, "l/shard-*.tar"), expected


def _run(tmp_path, how: str, spec: str, parent_used: bool) -> list[collections.Counter]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, str(script), how, spec, "yes" if parent_used else "no", str(out)],
                   check=True, timeout=240)
    return [collections.Counter(tuple(row) for row in epoch) for epoch in json.loads(out.read_text())]


@pytest.mark.parametrize(("method", "parent_used"), [("fork", True), ("fork", False), ("spawn", True)],
                         ids=["fork-after-obstore", "fork", "spawn"])
def test_eight_dataloader_workers_read_every_s3_sample_once_per_epoch(s3_shards, tmp_path, method, parent_used):
    """8 workers, 2 epochs (persistent workers); forked after the parent listed the bucket,
    each worker makes its calls through an agent process of its own (store_calls)."""
    spec, expected = s3_shards
    for epoch in _run(tmp_path, method, spec, parent_used):
        assert epoch == expected


def test_torchdata_nodes_read_every_s3_sample_once_per_epoch(s3_shards, tmp_path):
    """IterableWrapper over the pipe, a ParallelMapper on processes, a Prefetcher; 2 epochs."""
    pytest.importorskip("torchdata.nodes", reason="torchdata < 0.10 has no torchdata.nodes (the newest stack has)")
    spec, expected = s3_shards
    for epoch in _run(tmp_path, "nodes", spec, parent_used=True):
        assert epoch == expected


@needs_dataloader2
def test_dataloader2_with_the_reading_service_reads_every_s3_sample_once_per_epoch(s3_shards, tmp_path):
    """DataLoader2 with wd.MultiProcessingReadingService(num_workers=4), the parent having used obstore; 2 epochs."""
    assert DataLoader2 is not None
    spec, expected = s3_shards
    for epoch in _run(tmp_path, "dataloader2", spec, parent_used=True):
        assert epoch == expected


def test_the_agent_of_a_forked_worker_starts_without_importing_the_package(tmp_path, monkeypatch):
    """Each worker forked after obstore started runs an agent process: it imports the storage
    calls only, not the whole package (torch, the decoders: seconds of CPU per worker). A
    ``torch`` that cannot be imported, first on the agent's path, shows it: the agent still
    answers (obstore's failure to reach a closed port), where importing the package ended it."""
    from wds_datapipes.limits import Limits
    from wds_datapipes.storage import store_calls
    from wds_datapipes.storage.cloud_settings import StoreSettings

    (tmp_path / "torch.py").write_text("raise ImportError('the object-store agent imported torch')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    agent = store_calls._Agent()
    try:
        target = store_calls.Target("s3", "bucket", StoreSettings(endpoint="http://127.0.0.1:9", region="us-east-1",
                                                                   path_style=True, anonymous=True),
                                    Limits(http_timeout=2, http_retries=0))
        with pytest.raises(store_calls.StoreFailure) as caught:
            agent.head(target, "key.tar")
        assert "agent process ended" not in str(caught.value) and "127.0.0.1:9" in str(caught.value)
    finally:
        agent._proc.stdin.close()
        agent._proc.wait(timeout=30)
