"""A writer killed at random points resumes to the uninterrupted result; bad inputs per handler."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests.writing.conftest import make_samples
from wds_datapipes.errors import ShardWriteError
from wds_datapipes.handlers import ignore_and_continue
from wds_datapipes.writing import FileBytes, write_shards

ROOT = Path(__file__).resolve().parents[2]


def _run_job(out: Path, workers: int, kill_after: float | None) -> str | None:
    """Runs write_job.py; SIGKILLs its whole process group ``kill_after`` s after it started writing."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    job = subprocess.Popen([sys.executable, str(ROOT / "tests/writing/write_job.py"), str(out), str(workers)],
                           stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT, start_new_session=True)
    try:
        assert job.stdout.readline().strip() == "go"
        if kill_after is None:
            # (not communicate(timeout=...): it reads the pipe's fd and would miss a "done" line
            # that readline above already buffered, when the job ends before this test reads on)
            assert job.wait(timeout=400) == 0
            return job.stdout.read()
        time.sleep(kill_after)
        os.killpg(job.pid, signal.SIGKILL)  # the whole group: the workers die with it, as on a lost node
        job.wait(timeout=30)
        return None
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)


def _tars(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.tar"))}


@pytest.mark.timeout(900)
def test_a_run_killed_five_times_resumes_to_the_uninterrupted_result(tmp_path):
    """oracle: an uninterrupted run of the same input and settings (its shard bytes, offsets and counts)."""
    from tests.writing.write_job import slow

    write_shards(make_samples(300, seed=9), str(tmp_path / "whole/s-%04d.tar"), maxcount=10, map=slow, fsync=False)
    whole = _tars(tmp_path / "whole")
    assert len(whole) == 30
    rng = random.Random(7)
    for _ in range(5):  # two worker processes, the process group killed as a lost node would be
        _run_job(tmp_path / "cut", 2, rng.uniform(0.0, 1.5))
        for name, data in _tars(tmp_path / "cut").items():  # never a half-written shard under its name
            assert data == whole[name], name
    last = _run_job(tmp_path / "cut", 2, None)
    assert _tars(tmp_path / "cut") == whole
    assert not list((tmp_path / "cut").glob("*.part"))
    _, read, written, resumed = last.split()
    assert (read, written) == ("300", "300") and int(resumed) > 0
    assert (tmp_path / "cut/index.offsets").read_bytes() == (tmp_path / "whole/index.offsets").read_bytes()


def _bad_inputs(tmp_path: Path) -> list[dict]:
    good = tmp_path / "good.bin"
    good.write_bytes(b"fine")
    samples = make_samples(8)
    samples[1] = {"__key__": "s00001", "bin": FileBytes(str(tmp_path / "gone.bin"), 10), "__source__": "gone.bin"}
    samples[2] = {"__key__": "s00002", "txt": "no bin field"}
    samples[3] = {**samples[0]}  # s00000 again
    samples[4] = {"__key__": "photo.v2", "bin": b"x"}
    samples[5] = {"__key__": "s00005", "bin": b"x", "blob": 3.5}
    samples[6] = {"__key__": "s00006", "bin": FileBytes(str(good))}
    return samples


WHY = {"gone.bin": "No such file", "s00002": "required field", "s00000": "seen before",
       "photo.v2": "dot in its last part", "s00005": "no encoder"}


@pytest.mark.parametrize("workers", [1, 2])
def test_bad_inputs_are_skipped_and_listed_with_counts_that_add_up(tmp_path, workers):
    """oracle: the list of planted bad inputs, each with its reason; read = written + skipped."""
    report = write_shards(_bad_inputs(tmp_path), str(tmp_path / "out/s-%02d.tar"), maxcount=3, workers=workers,
                          handler=ignore_and_continue, require=("bin",), fsync=False)
    assert report.read == 8 == report.written + len(report.skipped)
    assert report.written == 3
    skipped = dict(report.skipped)
    assert set(skipped) == set(WHY)
    for source, words in WHY.items():
        assert words in skipped[source], skipped[source]
    assert "skipped photo.v2" in report.summary()
    from wds_datapipes import ShardLister

    keys = [s["__key__"] for s in ShardLister(str(tmp_path / "out")).load_tar().group_by_key()]
    assert keys == ["s00000", "s00006", "s00007"]


@pytest.mark.parametrize(("bad", "words"), [(1, "gone.bin"), (2, "required field"), (3, "seen before"),
                                            (4, "dot in its last part"), (5, "no encoder")])
def test_each_bad_input_stops_the_run_with_an_error_naming_it(tmp_path, bad, words):
    """oracle: the planted input's name and reason in the error; no .part file or half shard left."""
    samples = _bad_inputs(tmp_path)
    samples = samples[: bad + 1] if bad != 3 else samples[:4]
    samples = [s for i, s in enumerate(samples) if i in (0, bad)]
    with pytest.raises(ShardWriteError, match=words) as caught:
        write_shards(samples, str(tmp_path / "out/s-%02d.tar"), require=("bin",), fsync=False)
    assert caught.value.source or caught.value.key
    assert not list((tmp_path / "out").glob("*.part"))
    for shard in (tmp_path / "out").glob("*.tar"):
        with tarfile.open(shard) as tar:
            tar.getmembers()


def test_resuming_with_other_settings_is_refused_unless_restarted(tmp_path):
    """oracle: the rule that a progress record's settings must match."""
    samples = make_samples(20)
    write_shards(samples, str(tmp_path / "s-%02d.tar"), maxcount=5, fsync=False)
    with pytest.raises(ShardWriteError, match="maxcount"):
        write_shards(samples, str(tmp_path / "s-%02d.tar"), maxcount=6, fsync=False)
    report = write_shards(samples, str(tmp_path / "s-%02d.tar"), maxcount=6, fsync=False, restart=True)
    assert report.resumed == 0 and report.shards == 4


def test_resuming_over_changed_input_is_refused(tmp_path):
    """oracle: the record's planned keys of each complete shard."""
    write_shards(make_samples(20), str(tmp_path / "s-%02d.tar"), maxcount=5, fsync=False)
    changed = make_samples(21)[1:]
    for s in changed:
        s["__key__"] = "t" + s["__key__"]
    with pytest.raises(ShardWriteError, match="input changed"):
        write_shards(changed, str(tmp_path / "s-%02d.tar"), maxcount=5, fsync=False)


def test_a_shard_changed_on_disk_since_it_was_recorded_is_written_again(tmp_path):
    """oracle: the first run's bytes (the record's size and mtime no longer match the file)."""
    samples = make_samples(20)
    write_shards(samples, str(tmp_path / "s-%02d.tar"), maxcount=5, fsync=False)
    first = (tmp_path / "s-01.tar").read_bytes()
    (tmp_path / "s-01.tar").write_bytes(first[:1024])
    report = write_shards(samples, str(tmp_path / "s-%02d.tar"), maxcount=5, fsync=False)
    assert report.resumed == 3 and (tmp_path / "s-01.tar").read_bytes() == first


@pytest.mark.timeout(300)
def test_an_error_in_a_worker_process_stops_the_run_naming_the_input_and_a_rerun_completes(tmp_path):
    """oracle: the planted missing file in the error; then the one-process run's bytes after mending it."""
    samples = [{"__key__": f"k{i:03d}", "txt": "x" * i} for i in range(40)]
    late = tmp_path / "late.bin"
    samples[25] = {"__key__": "k025", "bin": FileBytes(str(late), 5)}
    with pytest.raises(ShardWriteError, match="late.bin") as caught:
        write_shards(samples, str(tmp_path / "o/s-%02d.tar"), maxcount=5, workers=2, fsync=False)
    assert caught.value.key == "k025" and not list((tmp_path / "o").glob("*.part"))
    assert not (tmp_path / "o/s-05.tar").exists()
    late.write_bytes(b"later")
    report = write_shards(samples, str(tmp_path / "o/s-%02d.tar"), maxcount=5, workers=2, fsync=False)
    assert report.written == 40 and report.resumed >= 1
    write_shards(samples, str(tmp_path / "ref/s-%02d.tar"), maxcount=5, fsync=False)
    assert _tars(tmp_path / "o") == _tars(tmp_path / "ref")
