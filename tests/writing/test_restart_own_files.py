"""A restart removes only what an earlier run of the writer left: never a user's file, a link
or a folder that happens to be named like a shard (any spelling of ``%d``), nor a recorded
shard changed since; it refuses instead, naming them, and removes nothing. A restart killed
half-way through its removals, run again (or resumed with the earlier settings), still
leaves exactly one run's shards."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.writing.conftest import make_samples, shard_keys
from wds_datapipes.cli import main
from wds_datapipes.errors import ShardWriteError
from wds_datapipes.writing import earlier, write_shards
from wds_datapipes.writing.earlier import listed_shards

SAMPLES = make_samples(40)
KEYS = [s["__key__"] for s in SAMPLES]


def _state(folder: Path, mtimes: bool = True) -> dict[str, object]:
    """Every entry under ``folder``: a file's bytes and mtime (a shard's only, unless ``mtimes``), a link's target, a folder's mark."""
    found: dict[str, object] = {}
    for path in sorted(folder.rglob("*")):
        name = str(path.relative_to(folder))
        if path.is_symlink():
            found[name] = ("link", os.readlink(path))
        elif path.is_dir():
            found[name] = "folder"
        else:
            found[name] = (path.read_bytes(), path.stat().st_mtime_ns if mtimes or path.suffix == ".tar" else None)
    return found


@pytest.mark.parametrize("pattern", ["s-%04d.tar", "%d", "s%%-%02d.tar", "s-%5d.tar", "s-%-3d.tar", "a/b/s-%03d.tar"])
def test_a_restart_never_removes_a_users_file_named_like_a_shard(tmp_path, pattern):
    """A user's file named exactly ``pattern % n`` (past the earlier run's shards), a link and a
    folder named like shards: the restart refuses, naming each, and the folder is as it was
    (oracle: every entry's bytes, mtime or target, before and after). Moved away, the restart
    removes the earlier run's shards only; files of other spellings stay. oracle: ``pattern % n``
    by hand, and tarfile over the shards left."""
    out = tmp_path / "out"
    full = str(out / pattern)
    write_shards(SAMPLES, full, maxcount=10, fsync=False)
    folder = Path(full % 0).parent
    Path(full % 99).write_bytes(b"my notes")
    (folder / "precious.bin").write_bytes(b"link target")
    os.symlink("precious.bin", full % 5)
    os.mkdir(full % 7)
    others = [folder / (Path(full % 1).name + ".bak"), folder / Path(full % 1).name.replace("1", "01", 1)]
    for path in others:
        path.write_bytes(b"other spelling")
    before = _state(tmp_path)
    with pytest.raises(ShardWriteError, match=r"3 files named like this run's shards are not shards") as caught:
        write_shards(SAMPLES, full, maxcount=20, restart=True, fsync=False)
    text = str(caught.value)
    assert Path(full % 99).name in text and "modification time" in text and "not a regular file" in text
    assert _state(tmp_path) == before
    os.remove(full % 99)
    os.remove(full % 5)
    os.rmdir(full % 7)
    report = write_shards(SAMPLES, full, maxcount=20, restart=True, fsync=False)
    assert sorted(report.removed) == sorted(full % n for n in range(4))
    shards = [Path(full % n) for n in range(2)]
    left = {p for p in folder.iterdir() if not p.name.startswith("index.")}
    assert left == {*shards, *others, folder / "precious.bin"}
    assert (folder / "precious.bin").read_bytes() == b"link target"
    assert all(p.read_bytes() == b"other spelling" for p in others)
    assert shard_keys(shards) == KEYS


def test_a_fresh_run_refuses_a_users_file_and_says_a_restart_would_not_remove_it(tmp_path, capsys):
    """The command, with no earlier run: a user's ``out/3.tar`` for the pattern ``out/%d.tar``
    is named in the error (exit 1) and left as it was. oracle: the file's bytes, the message."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"k{i}.txt").write_text(f"text {i}")
    out = tmp_path / "out"
    out.mkdir()
    (out / "3.tar").write_bytes(b"user data")
    for extra in ([], ["--restart"]):
        code = main(["create", str(src), "-o", str(out / "%d.tar"), "--maxcount", "2", "--quiet", "--no-fsync", *extra])
        err = capsys.readouterr().err
        assert code == 1 and "3.tar: its modification time is not one the writer gives" in err, err
        assert "restart removes only the writer's own shards" in err
    assert (out / "3.tar").read_bytes() == b"user data" and sorted(p.name for p in out.iterdir()) == ["3.tar"]


def test_a_restart_removes_a_recorded_shard_touched_since_but_refuses_one_that_changed_size(tmp_path):
    """A recorded shard whose mtime changed (``touch``, a plain ``cp``) but not its size is the
    earlier run's; one that grew is not known to be: refused, naming it and both sizes.
    oracle: the record's sizes and os.stat."""
    full = str(tmp_path / "s-%02d.tar")
    write_shards(SAMPLES, full, maxcount=10, fsync=False)
    os.utime(full % 1)  # now
    with open(full % 2, "ab") as grown:
        grown.write(b"\0" * 512)
    size = os.path.getsize(full % 2)
    with pytest.raises(ShardWriteError, match=rf"s-02\.tar: changed since the earlier run recorded it \({size} bytes"):
        write_shards(SAMPLES, full, maxcount=40, restart=True, fsync=False)
    assert all(os.path.exists(full % n) for n in range(4))
    os.remove(full % 2)
    report = write_shards(SAMPLES, full, maxcount=40, restart=True, fsync=False)
    assert sorted(report.removed) == [full % 0, full % 1, full % 3]
    assert sorted(tmp_path.glob("*.tar")) == [Path(full % 0)] and shard_keys([Path(full % 0)]) == KEYS


def _killed_while_removing(full: str, nth: int, **settings) -> None:
    """A restart in a forked process, SIGKILLed right after its nth removal of an earlier shard."""
    pid = os.fork()
    if pid == 0:
        try:
            remove, count = os.remove, [0]

            def removing(path, *args, **kwargs):
                remove(path, *args, **kwargs)
                count[0] += str(path).endswith(".tar")
                if count[0] == nth:
                    os.kill(os.getpid(), signal.SIGKILL)

            earlier.os.remove = removing  # (the module's os is os: patched in this child only)
            write_shards(SAMPLES, full, restart=True, fsync=False, **settings)
        finally:
            os._exit(0)
    deadline = time.monotonic() + 60
    while not (done := os.waitpid(pid, os.WNOHANG))[0]:
        assert time.monotonic() < deadline, "the killed restart did not end"
        time.sleep(0.01)
    assert os.WIFSIGNALED(done[1]), "the restart was not killed where planned"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("then", ["restart again", "resume the earlier run"])
def test_a_restart_killed_while_removing_leaves_one_run_when_run_again(tmp_path, then):
    """Killed after 2 of the earlier run's 4 shards were removed: a restart run again, or a
    resume with the earlier settings (its record is still the folder's), ends with exactly one
    run's shards. oracle: an uninterrupted run of those settings in another folder, every file
    byte for byte (the progress record's paths aside), and tarfile."""
    full = str(tmp_path / "out" / "s-%03d.tar")
    write_shards(SAMPLES, full, maxcount=10, fsync=False)
    _killed_while_removing(full, 2, maxcount=25)
    assert len(list((tmp_path / "out").glob("*.tar"))) == 2
    settings = {"maxcount": 25, "restart": True} if then == "restart again" else {"maxcount": 10}
    write_shards(SAMPLES, full, fsync=False, **settings)
    write_shards(SAMPLES, str(tmp_path / "oracle" / "s-%03d.tar"), fsync=False, maxcount=settings["maxcount"])
    got, want = _state(tmp_path / "out", mtimes=False), _state(tmp_path / "oracle", mtimes=False)
    assert {k: v for k, v in got.items() if "progress" not in k} == {k: v for k, v in want.items() if "progress" not in k}
    assert shard_keys(sorted((tmp_path / "out").glob("*.tar"))) == KEYS


def test_only_the_exact_spelling_of_each_number_counts_for_any_d_field(tmp_path):
    """oracle: Python's own ``pattern % n`` for the flags and widths of ``%d``."""
    names = ["7", "07", "+7", "s-   12.tar", "s-12.tar", "s-12   .tar", "t+12.tar", "t12.tar", "u7.tar", "u 7.tar",
             "s-x.tar", "s-½.tar", "s-١٢.tar"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    for pattern in ["%d", "s-%5d.tar", "s-%-5d.tar", "t%+d.tar", "u% d.tar", "s-%i.tar", "s-%u.tar"]:
        full = str(tmp_path / pattern)
        want = {n: full % n for n in range(100) if (tmp_path / Path(full % n).name).exists()}
        assert listed_shards(full) == want, pattern
    assert listed_shards(str(tmp_path / "s-%x.tar")) is None and listed_shards(str(tmp_path / "%s-%d.tar")) is None


def test_a_resume_refuses_a_users_file_named_like_a_shard_before_writing_over_it(tmp_path):
    """A killed run's record holds shards 0-1; a user's file is then named like shard 3. The
    resume refuses at once, naming it, and writes nothing; moved away, the resume ends as an
    uninterrupted run does. oracles: the user's bytes; an uninterrupted run elsewhere, file for file."""
    full = str(tmp_path / "out" / "s-%02d.tar")
    write_shards(SAMPLES, full, maxcount=10, fsync=False)
    record = tmp_path / "out" / "index.json.rank0-of-1.progress"
    record.write_text("".join(record.read_text().splitlines(keepends=True)[:3]))  # killed after shard 1's line
    for n in (2, 3):
        os.remove(full % n)
    Path(full % 3).write_bytes(b"a user's file")
    before = _state(tmp_path / "out")
    with pytest.raises(ShardWriteError, match=r"s-03\.tar: its modification time is not one the writer gives"):
        write_shards(SAMPLES, full, maxcount=10, fsync=False)
    assert _state(tmp_path / "out") == before
    os.rename(full % 3, tmp_path / "moved")
    assert write_shards(SAMPLES, full, maxcount=10, fsync=False).resumed == 2
    write_shards(SAMPLES, str(tmp_path / "oracle" / "s-%02d.tar"), maxcount=10, fsync=False)
    got, want = _state(tmp_path / "out", mtimes=False), _state(tmp_path / "oracle", mtimes=False)
    assert {k: v for k, v in got.items() if "progress" not in k} == {k: v for k, v in want.items() if "progress" not in k}
