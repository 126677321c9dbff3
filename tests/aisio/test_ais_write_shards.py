"""The shard writer writing straight to ``ais://``: spooled, uploaded, resumable, faults."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from upload_cutter import UploadCutter

from aisio.client import ENDPOINT_ENV, get_client
from tests.writing.conftest import make_samples
from wds_datapipes import ShardLister
from wds_datapipes.cli import main as cli_main
from wds_datapipes.epochs.exact_epochs import ExactEpochs
from wds_datapipes.epochs.index import ShardIndex
from wds_datapipes.errors import ShardWriteError
from wds_datapipes.writing import write_shards

ROOT = Path(__file__).resolve().parents[2]


def objects(bucket: str) -> dict[str, bytes]:
    """Every object of the bucket and its bytes."""
    bck = get_client().bucket(bucket)
    return {o.name: bck.object(o.name).get_reader().read_all() for o in bck.list_all_objects()}


def local_shards(tmp_path, samples: list[dict], **settings) -> dict[str, bytes]:
    out = tmp_path / "local"
    write_shards(samples, f"{out}/s-%04d.tar", **settings)
    return {p.name: p.read_bytes() for p in sorted(out.glob("s-*.tar"))}


def test_shards_written_to_ais_equal_the_local_ones_and_read_back_by_index_exact_epochs_and_verify(
        ais_endpoint, bucket, tmp_path, capsys):
    """Oracle: the same run written to a local folder (the writer is deterministic)."""
    samples = make_samples(70, seed=5)
    spooled = []

    def progress(_samples, _bytes):
        spooled.append(len(list(Path(spool).rglob("*.tar*"))))

    spool = tmp_path / "spool"
    report = write_shards(samples, f"ais://{bucket}/s-%04d.tar", maxcount=8, workers=2, spool=str(spool),
                          uploads=2, progress=progress)
    assert (report.read, report.written, report.shards) == (70, 70, 9)
    stored = objects(bucket)
    expected = local_shards(tmp_path, samples, maxcount=8)
    assert {name: data for name, data in stored.items() if name.startswith("s-")} == expected
    assert {"index.json", "index.offsets"} <= set(stored)
    assert max(spooled) <= 2 * 2 + 2 and not list(spool.iterdir())  # bounded, then removed

    index = ShardIndex.load(f"ais://{bucket}/index.json")
    assert index.has_offsets and index.url(3) == f"ais://{bucket}/s-0003.tar" and index.total == 70
    keys = [s["__key__"] for s in ExactEpochs(f"ais://{bucket}/index.json", batch_size=1, shuffle=False)]
    assert keys == [s["__key__"] for s in samples]
    assert cli_main(["verify", f"ais://{bucket}/index.json"]) in (0, None)
    got = list(ShardLister(f"ais://{bucket}/s-{{0000..0008}}.tar").load_tar().group_by_key())
    assert [g["__key__"] for g in got] == keys


def test_a_conversion_to_ais_killed_with_sigkill_resumes_writing_only_what_is_missing(ais_endpoint, bucket, tmp_path):
    """Oracle: the uninterrupted run written locally (the job's input and settings)."""
    records = "index.json.rank0-of-1.progress/"
    job = subprocess.Popen([sys.executable, str(ROOT / "tests/aisio/ais_write_job.py"), f"ais://{bucket}", "2"],
                           stdout=subprocess.PIPE, text=True, start_new_session=True, cwd=ROOT)
    try:
        assert job.stdout.readline().strip() == "go"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            names = [o.name for o in get_client().bucket(bucket).list_all_objects()]
            if sum(n.startswith(records) and n[-6].isdigit() for n in names) >= 3:
                break
            time.sleep(0.05)
        os.killpg(job.pid, signal.SIGKILL)  # the whole group, workers included: a lost node
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait(10)
    expected = local_shards(tmp_path, make_samples(300, seed=9), maxcount=10)
    left = objects(bucket)
    assert "index.json" not in left  # the run did not finish
    for name, data in left.items():  # no half-written shard under its final name, nothing else
        assert name.startswith(records) or data == expected[name], name
    recorded = sum(n.startswith(records) and n[-6].isdigit() for n in left)
    assert 3 <= recorded < 30

    again = subprocess.run([sys.executable, str(ROOT / "tests/aisio/ais_write_job.py"), f"ais://{bucket}", "2"],
                           check=False, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert again.returncode == 0, again.stderr[-2000:]
    _, read, written, resumed = again.stdout.split()[-4:]
    assert (read, written) == ("300", "300") and int(resumed) >= recorded  # only what was missing is written
    stored = objects(bucket)
    assert {name: data for name, data in stored.items() if name.startswith("s-")} == expected
    keys = [s["__key__"] for s in ExactEpochs(f"ais://{bucket}/index.json", batch_size=1, shuffle=False)]
    assert keys == [f"s{i:05d}" for i in range(300)]  # no duplicate, no gap


def test_uploads_cut_half_way_are_tried_again_and_leave_no_partial_object(ais_endpoint, bucket, tmp_path,
                                                                            monkeypatch):
    """Oracle: the same run written locally."""
    samples = make_samples(40, seed=6)
    with UploadCutter(ais_endpoint, cuts=4, prefix=f"/v1/objects/{bucket}/s-") as relay:
        monkeypatch.setenv(ENDPOINT_ENV, relay.url)
        report = write_shards(samples, f"ais://{bucket}/s-%04d.tar", maxcount=10, tries=3)
    assert relay.cuts == 0 and len(relay.cut) == 4  # four uploads were cut half-way
    assert report.written == 40
    monkeypatch.setenv(ENDPOINT_ENV, ais_endpoint)
    stored = objects(bucket)
    assert {name: data for name, data in stored.items() if name.startswith("s-")} == local_shards(
        tmp_path, samples, maxcount=10)


def test_an_upload_that_keeps_failing_stops_the_run_naming_the_shard_and_leaves_no_object(
        ais_endpoint, bucket, tmp_path, monkeypatch):
    samples = make_samples(20, seed=7)
    spool = tmp_path / "spool"
    with UploadCutter(ais_endpoint, cuts=10_000, prefix=f"/v1/objects/{bucket}/s-0001") as relay:
        monkeypatch.setenv(ENDPOINT_ENV, relay.url)
        with pytest.raises(ShardWriteError, match=rf"ais://{bucket}/s-0001.tar.*failed 2 times"):
            write_shards(samples, f"ais://{bucket}/s-%04d.tar", maxcount=10, tries=2, spool=str(spool))
    monkeypatch.setenv(ENDPOINT_ENV, ais_endpoint)
    names = set(objects(bucket))
    assert "s-0001.tar" not in names and "index.json" not in names
    assert not list(spool.iterdir())  # the spool is cleaned up on failure too


def test_a_missing_bucket_stops_the_run_at_once_naming_it(ais_endpoint, tmp_path):
    started = time.monotonic()
    with pytest.raises(ShardWriteError, match=r"failed: .*bucket ais://no-such-bucket-wr does not exist"):
        write_shards(make_samples(5), "ais://no-such-bucket-wr/s-%04d.tar", maxcount=2, spool=str(tmp_path))
    assert time.monotonic() - started < 20 and not list(tmp_path.iterdir())  # not tried again and again
