"""A conversion killed at 20 seeded points (at random times, and in shard finalisation) resumes
to the uninterrupted result: no duplicate, no gap, no half shard under its final name, the
index the same bytes; the same for compressed shards (gzip, zstd), killed at 8 seeded points
each; and a restart with another maxcount, killed at random times, then resumed, leaves only
its own shards."""

from __future__ import annotations

import gzip
import io
import os
import random
import signal
import tarfile
import time
import traceback
from pathlib import Path

import pytest

from tests.writing.conftest import make_samples
from wds_datapipes.writing import compress as compress_module
from wds_datapipes.writing import progress as progress_module
from wds_datapipes.writing import shard_file, write_shards

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the kills fork the conversion (POSIX)")

N, MAXCOUNT = 240, 8  # 30 shards


def slow(sample: dict) -> dict:
    time.sleep(0.004)
    return sample


def _die() -> None:
    os.killpg(os.getpgid(0), signal.SIGKILL)  # the whole group, workers included, as on a lost node


def _arm(kind: str, nth: int) -> None:
    """In the conversion's process (and the workers it forks): SIGKILL at the nth event of ``kind``."""
    count = [0]
    if kind in ("before_rename", "after_rename"):
        replace = os.replace

        def replacing(src, dst, *args, **kwargs):
            count[0] += 1
            if kind == "before_rename" and count[0] == nth:
                _die()  # the .part file is whole, not yet renamed
            replace(src, dst, *args, **kwargs)
            if kind == "after_rename" and count[0] == nth:
                _die()  # renamed, not yet in the progress record

        shard_file.os.replace = replacing
    elif kind == "mid_compress":
        copy = compress_module.shutil.copyfileobj

        def copying(plain, out, *args, **kwargs):
            count[0] += 1
            if count[0] == nth:  # half the shard compressed and on disk, then the node is gone
                data = plain.read()
                out.write(data[: len(data) // 2])
                out.flush()
                _die()
            copy(plain, out, *args, **kwargs)

        compress_module.shutil.copyfileobj = copying
    elif kind == "mid_record":
        def append(self, entry):
            count[0] += 1
            if count[0] == nth + 1:  # the (nth + 1)th line this run appends (a shard's, or the end line)
                line = entry + "\n"  # the line's text
                self._out.write(line[: len(line) // 2])  # half a line on disk, then the node is gone
                self._out.flush()
                _die()
            original(self, entry)

        original = progress_module.ProgressLog._append
        progress_module.ProgressLog._append = append


def _conversion(out: Path, kind: str | None = None, nth: int = 1, kill_after: float | None = None,
                suffix: str = ".tar", maxcount: int = MAXCOUNT, restart: bool = False) -> int:
    """Runs the conversion in a forked process group; returns its wait status (0: it finished)."""
    pid = os.fork()
    if pid == 0:  # the conversion
        code = 1
        try:
            os.setsid()
            if kind is not None and kind != "time":
                _arm(kind, nth)
            report = write_shards(make_samples(N, seed=9), str(out / f"s-%04d{suffix}"), maxcount=maxcount, workers=2,
                                  map=slow, fsync=False, restart=restart)
            code = 0 if (report.read, report.written) == (N, N) else 3
        except BaseException:  # noqa: BLE001 - shown, then the exit code says it failed
            traceback.print_exc()
        finally:
            os._exit(code)
    if kill_after is not None:
        time.sleep(kill_after)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:  # not yet its own group, or already done
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 120
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            raise AssertionError("the conversion did not end in 120 s")
        time.sleep(0.01)


def _members(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar]


@pytest.mark.timeout(300)
def test_a_run_killed_twenty_times_resumes_to_the_uninterrupted_result(tmp_path):
    """oracle: the uninterrupted run's shards read back with tarfile (and their bytes, and its offsets)."""
    started = time.monotonic()
    assert _conversion(tmp_path / "whole") == 0
    seconds = time.monotonic() - started
    whole = {p.name: _members(p) for p in sorted((tmp_path / "whole").glob("*.tar"))}
    whole_bytes = {p.name: p.read_bytes() for p in sorted((tmp_path / "whole").glob("*.tar"))}
    assert len(whole) == N // MAXCOUNT

    rng = random.Random(20)
    kinds = ["time"] * 11 + ["before_rename"] * 3 + ["after_rename"] * 3 + ["mid_record"] * 3
    rng.shuffle(kinds)
    killed = 0
    for kind in kinds:
        status = _conversion(tmp_path / "cut", kind, nth=rng.randint(1, 2),
                             kill_after=rng.uniform(0.0, seconds / 12) if kind == "time" else None)
        killed += os.WIFSIGNALED(status)
        for shard in sorted((tmp_path / "cut").glob("*.tar")):  # never a half shard under its final name
            assert shard.read_bytes() == whole_bytes[shard.name], (kind, shard.name)
    assert killed >= 10, f"only {killed} of 20 runs were cut before their end"
    assert _conversion(tmp_path / "cut") == 0
    assert {p.name: _members(p) for p in sorted((tmp_path / "cut").glob("*.tar"))} == whole
    assert not list((tmp_path / "cut").glob("*.part"))
    for name in INDEX_FILES:
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name


INDEX_FILES = ("index.json", "index.offsets", "index.places.json", "index.places", "index.keys")


@pytest.mark.timeout(300)
def test_a_restart_killed_at_random_times_then_resumed_leaves_only_its_own_shards(tmp_path):
    """A run of 30 shards, then a restart with maxcount 20 (12 shards) killed 3 times (each try a
    restart again: after a rename, at a random time, before a rename), then resumed, killed
    twice more (at a random time, after a rename), and finished. oracle: an uninterrupted
    maxcount-20 run (its shards read with tarfile, its bytes, its index files), and the folder's
    names: none of the first run's shards past the 12th is left."""
    started = time.monotonic()
    assert _conversion(tmp_path / "whole", maxcount=20) == 0
    seconds = time.monotonic() - started
    whole = {p.name: p.read_bytes() for p in sorted((tmp_path / "whole").glob("*.tar"))}
    assert len(whole) == 12
    assert _conversion(tmp_path / "cut") == 0
    assert len(list((tmp_path / "cut").glob("*.tar"))) == N // MAXCOUNT
    rng = random.Random(36)
    killed = 0
    for restart, kind in ((True, "after_rename"), (True, "time"), (True, "before_rename"), (False, "time"),
                          (False, "after_rename")):
        status = _conversion(tmp_path / "cut", kind, nth=rng.randint(1, 3), maxcount=20, restart=restart,
                             kill_after=rng.uniform(0.05, seconds * 0.5) if kind == "time" else None)
        killed += os.WIFSIGNALED(status)
        for shard in sorted((tmp_path / "cut").glob("*.tar")):  # each a whole shard of the restart's plan, or gone
            assert shard.read_bytes() == whole.get(shard.name), (restart, shard.name)
    assert killed >= 3, f"only {killed} of 5 runs were cut before their end"  # the 3 at a rename at least
    assert _conversion(tmp_path / "cut", maxcount=20) == 0
    assert {p.name: p.read_bytes() for p in sorted((tmp_path / "cut").glob("*.tar"))} == whole
    assert {p.name: _members(p) for p in sorted((tmp_path / "cut").glob("*.tar"))} == {
        p.name: _members(p) for p in sorted((tmp_path / "whole").glob("*.tar"))}
    assert not list((tmp_path / "cut").glob("*.part"))
    for name in INDEX_FILES:
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name


def _decompressed(path: Path) -> bytes:
    """The shard's tar bytes, decompressed by Python's gzip or by zstandard (not by our readers)."""
    if path.name.endswith(".tar.gz"):
        return gzip.decompress(path.read_bytes())
    import zstandard

    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(path.read_bytes())) as stream:
        return stream.read()


def _members_of(tar_bytes: bytes) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("suffix", [".tar.gz", ".tar.zst"])
def test_a_compressed_run_killed_eight_times_resumes_to_the_uninterrupted_result(tmp_path, suffix):
    """8 kills (2 at random times, 2 before a rename, 2 after one, 1 half-way through compressing a
    shard, 1 half-way through a progress line; with compression a shard is renamed twice: its
    compressed stream onto ``.part``, then ``.part`` onto its name), then a resume. oracle: the uninterrupted run's shards decompressed by Python's
    gzip / zstandard and read with tarfile; every shard under its final name at any point is whole
    (it decompresses to a complete tar equal to the uninterrupted one's, byte for byte)."""
    if suffix == ".tar.zst":
        pytest.importorskip("zstandard")
    started = time.monotonic()
    assert _conversion(tmp_path / "whole", suffix=suffix) == 0
    seconds = time.monotonic() - started
    shards = sorted((tmp_path / "whole").glob(f"*{suffix}"))
    whole_bytes = {p.name: p.read_bytes() for p in shards}
    whole = {p.name: _members_of(_decompressed(p)) for p in shards}
    assert len(whole) == N // MAXCOUNT
    assert [name for members in whole.values() for name, _ in members] == [
        f"s{i:05d}.{field}" for i in range(N) for field in ("bin", "cls", "txt", "json", "npy")]

    rng = random.Random(8)
    kinds = ["time"] * 2 + ["before_rename"] * 2 + ["after_rename"] * 2 + ["mid_compress", "mid_record"]
    rng.shuffle(kinds)
    killed = 0
    for kind in kinds:
        status = _conversion(tmp_path / "cut", kind, nth=rng.randint(1, 3),
                             kill_after=rng.uniform(0.0, seconds / 3) if kind == "time" else None, suffix=suffix)
        killed += os.WIFSIGNALED(status)
        for shard in sorted((tmp_path / "cut").glob(f"*{suffix}")):  # never a half shard under its final name
            assert shard.read_bytes() == whole_bytes[shard.name], (kind, shard.name)
            assert _members_of(_decompressed(shard)) == whole[shard.name]
    assert killed >= 5, f"only {killed} of 8 runs were cut before their end"
    assert _conversion(tmp_path / "cut", suffix=suffix) == 0
    assert {p.name: _members_of(_decompressed(p)) for p in sorted((tmp_path / "cut").glob(f"*{suffix}"))} == whole
    assert {p.name: p.read_bytes() for p in sorted((tmp_path / "cut").glob(f"*{suffix}"))} == whole_bytes
    assert not [p.name for p in (tmp_path / "cut").iterdir() if p.name.endswith((".part", ".z"))]
    assert ({p.name: p.read_bytes() for p in (tmp_path / "cut").glob("index.*") if "progress" not in p.name} ==
            {p.name: p.read_bytes() for p in (tmp_path / "whole").glob("index.*") if "progress" not in p.name})
