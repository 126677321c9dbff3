"""Where input files may come from: never outside the input's folder unless allowed, never a
link to nothing dropped without a word (the folder, ImageFolder, manifest and Parquet layouts)."""

from __future__ import annotations

import json
import os
import tarfile

import pytest

from wds_datapipes.cli import main
from wds_datapipes.writing import write_shards
from wds_datapipes.writing.sources import manifest_samples

COMMON = ["--quiet", "--no-fsync"]


def _members(folder) -> dict[str, bytes]:
    """oracle: tarfile, every member of every shard in the folder, name -> bytes."""
    found = {}
    for path in sorted(folder.glob("*.tar")):
        with tarfile.open(path) as tar:
            for member in tar:
                found[member.name] = tar.extractfile(member).read()
    return found


@pytest.fixture
def secrets(tmp_path):
    """Files outside every input folder: one file, and a folder holding one."""
    (tmp_path / "private").mkdir()
    (tmp_path / "private/id_rsa.txt").write_bytes(b"PRIVATE KEY")
    (tmp_path / "credentials.txt").write_bytes(b"aws_secret_access_key=x")
    return tmp_path


def _create(source, out, *extra) -> int:
    return main(["create", str(source), "-o", str(out / "s-%02d.tar"), *COMMON, *extra])


# ---------------------------------------------------------------- manifests


def _manifest(folder, rows) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ok.txt").write_bytes(b"fine")
    path = folder / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [{"key": "ok", "txt_path": "ok.txt"}, *rows]))
    return str(path)


@pytest.mark.parametrize("kind", ["absolute", "dotdot", "link to a file", "through a linked folder"])
def test_a_manifest_path_outside_its_folder_is_refused_unless_allowed(secrets, capsys, kind):
    """oracle: the planted file's bytes (tarfile) where allowed; the path named in the error."""
    data = secrets / "data"
    data.mkdir()
    if kind == "absolute":
        value = str(secrets / "credentials.txt")
    elif kind == "dotdot":
        value = "../credentials.txt"
    elif kind == "link to a file":
        os.symlink(secrets / "credentials.txt", data / "innocent.txt")
        value = "innocent.txt"
    else:
        os.symlink(secrets / "private", data / "more")
        value = "more/id_rsa.txt"
    manifest = _manifest(data, [{"key": "leak", "txt_path": value}])
    assert _create(manifest, secrets / "a") == 1
    err = capsys.readouterr().err
    assert value in err and "outside the input's folder" in err and "--allow-outside" in err
    assert not any(b"PRIVATE" in v or b"secret" in v for v in _members(secrets / "a").values())
    assert _create(manifest, secrets / "b", "--skip-bad") == 0
    err = capsys.readouterr().err
    assert "wrote 1, skipped 1" in err and value in err
    assert _members(secrets / "b") == {"ok.txt": b"fine"}
    assert _create(manifest, secrets / "c", "--allow-outside") == 0
    want = b"aws_secret_access_key=x" if kind != "through a linked folder" else b"PRIVATE KEY"
    assert _members(secrets / "c") == {"ok.txt": b"fine", "leak.txt": want}


def test_an_absolute_manifest_path_inside_its_folder_is_taken(tmp_path):
    """oracle: the file's bytes read back by tarfile."""
    manifest = _manifest(tmp_path / "data", [{"key": "abs", "txt_path": str(tmp_path / "data/ok.txt")}])
    report = write_shards(manifest_samples(manifest), str(tmp_path / "out/s-%02d.tar"), fsync=False)
    assert report.written == 2 and _members(tmp_path / "out") == {"ok.txt": b"fine", "abs.txt": b"fine"}


def test_the_api_keyword_allows_what_the_flag_allows(secrets):
    manifest = _manifest(secrets / "data", [{"key": "leak", "txt_path": "../credentials.txt"}])
    assert [s.get("__problems__") for s in manifest_samples(manifest)][1]
    samples = list(manifest_samples(manifest, allow_outside=True))
    assert samples[1]["txt"].path == str(secrets / "credentials.txt") and "__problems__" not in samples[1]


# ---------------------------------------------------------------- Parquet


@pytest.mark.parametrize("column", ["image", "txt_path"])
def test_a_parquet_path_outside_its_folder_is_refused_unless_allowed(secrets, column):
    """Hugging Face's {bytes: null, path} and a <suffix>_path column; oracle: tarfile."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from wds_datapipes.handlers import ignore_and_continue
    from wds_datapipes.writing.parquet import parquet_samples

    (secrets / "data").mkdir()
    os.symlink(secrets / "credentials.txt", secrets / "data/linked.txt")
    paths = ["../credentials.txt", str(secrets / "credentials.txt"), "linked.txt"]
    if column == "image":
        rows = [{"key": f"k{i}", "image": {"bytes": None, "path": p}} for i, p in enumerate(paths)]
    else:
        rows = [{"key": f"k{i}", "txt_path": p} for i, p in enumerate(paths)]
    pq.write_table(pa.Table.from_pylist(rows), secrets / "data/d.parquet")
    spec = [str(secrets / "data/d.parquet")]
    report = write_shards(parquet_samples(spec), str(secrets / "a/s-%02d.tar"), handler=ignore_and_continue,
                          fsync=False)
    assert report.written == 0 and len(report.skipped) == 3
    assert all("outside the input's folder" in why for _, why in report.skipped)
    assert [p in why for (_, why), p in zip(report.skipped, paths)] == [True] * 3
    report = write_shards(parquet_samples(spec, allow_outside=True), str(secrets / "b/s-%02d.tar"), fsync=False)
    assert report.written == 3
    assert set(_members(secrets / "b").values()) == {b"aws_secret_access_key=x"}


# ---------------------------------------------------------------- folders and ImageFolder trees


def _images(folder) -> list[bytes]:
    return sorted(data for name, data in _members(folder).items() if name.endswith(".jpg"))


@pytest.mark.parametrize("layout", ["folder", "imagefolder"])
@pytest.mark.parametrize("target", ["file", "folder"])
def test_a_symbolic_link_out_of_the_input_folder_is_refused_unless_allowed(secrets, capsys, layout, target):
    """oracle: the linked file's bytes (tarfile) where allowed; the link named where refused."""
    root = secrets / "tree"
    (root / "cat").mkdir(parents=True)
    (root / "cat/a.jpg").write_bytes(b"cat a")
    if target == "file":
        link, linked = root / "cat/b.jpg", b"aws_secret_access_key=x"
        os.symlink(secrets / "credentials.txt", link)
    else:
        link, linked = root / "cat/more", b"private c"
        (secrets / "private/c.jpg").write_bytes(linked)
        os.symlink(secrets / "private", link)
    extra = ["--layout", layout]
    assert _create(root, secrets / "a", *extra) == 1
    err = capsys.readouterr().err
    assert str(link) in err and "outside the input folder" in err
    assert _create(root, secrets / "b", *extra, "--skip-bad") == 0
    err = capsys.readouterr().err
    assert "wrote 1, skipped 1" in err and f"skipped {link}" in err
    assert _images(secrets / "b") == [b"cat a"]
    assert _create(root, secrets / "c", *extra, "--allow-outside") == 0
    assert _images(secrets / "c") == sorted([b"cat a", linked])


def test_a_class_folder_that_links_out_of_an_imagefolder_tree_is_refused(secrets, capsys):
    root = secrets / "tree"
    (root / "cat").mkdir(parents=True)
    (root / "cat/a.jpg").write_bytes(b"cat a")
    (secrets / "private/d.jpg").write_bytes(b"private d")
    os.symlink(secrets / "private", root / "dog")
    assert _create(root, secrets / "a", "--layout", "imagefolder", "--skip-bad") == 0
    err = capsys.readouterr().err
    assert f"skipped {root / 'dog'}" in err and "outside the input folder" in err
    assert _members(secrets / "a") == {"cat/a.jpg": b"cat a", "cat/a.cls": b"0"}
    assert _create(root, secrets / "b", "--layout", "imagefolder", "--allow-outside") == 0
    assert _members(secrets / "b")["dog/d.jpg"] == b"private d"


@pytest.mark.parametrize("layout", ["folder", "imagefolder"])
def test_a_dangling_link_stops_the_run_naming_it_or_is_skipped_and_listed(tmp_path, capsys, layout):
    """oracle: the planted link's path in the error and in the report; the other file's bytes (tarfile)."""
    root = tmp_path / "tree"
    (root / "cat").mkdir(parents=True)
    (root / "cat/a.jpg").write_bytes(b"cat a")
    os.symlink(tmp_path / "gone.jpg", root / "cat/b.jpg")
    assert _create(root, tmp_path / "a", "--layout", layout) == 1
    err = capsys.readouterr().err
    assert str(root / "cat/b.jpg") in err and "does not exist" in err
    assert _create(root, tmp_path / "b", "--layout", layout, "--skip-bad") == 0
    err = capsys.readouterr().err
    assert "read 2 samples: wrote 1, skipped 1" in err and f"skipped {root / 'cat/b.jpg'}" in err
    assert set(_members(tmp_path / "b").values()) == {b"cat a"} | ({b"0"} if layout == "imagefolder" else set())


def test_a_link_loop_in_a_folder_is_reported_not_followed_forever(tmp_path, capsys):
    root = tmp_path / "tree"
    (root / "sub").mkdir(parents=True)
    (root / "sub/a.txt").write_bytes(b"a")
    os.symlink("..", root / "sub/up")
    assert _create(root, tmp_path / "out", "--layout", "folder", "--skip-bad") == 0
    err = capsys.readouterr().err
    assert "wrote 1, skipped 1" in err and "(a loop)" in err and str(root / "sub/up") in err


@pytest.mark.parametrize("extra", [[], ["--extensions", "txt"]])
def test_a_dangling_link_that_may_have_been_a_folder_is_reported_whatever_its_name(tmp_path, capsys, extra):
    """An unmounted images folder (``images -> /mnt/gone``, no dot: no suffix to go by) is a bad
    input in the folder layout, not a name left out; oracle: the link's path in the error and
    in the report, the labels' bytes read back by tarfile."""
    root = tmp_path / "tree"
    (root / "labels").mkdir(parents=True)
    (root / "labels/p1.txt").write_bytes(b"label 1")
    os.symlink(tmp_path / "gone", root / "images")
    assert _create(root, tmp_path / "a", "--layout", "folder", *extra) == 1
    err = capsys.readouterr().err
    assert str(root / "images") in err and "does not exist (a dangling link)" in err
    assert _create(root, tmp_path / "b", "--layout", "folder", "--skip-bad", *extra) == 0
    err = capsys.readouterr().err
    assert "wrote 1, skipped 1" in err and f"skipped {root / 'images'}" in err
    assert _members(tmp_path / "b") == {"p1.txt": b"label 1"}


def test_a_dangling_class_folder_link_is_a_bad_input_that_keeps_its_class_number(tmp_path, capsys):
    """ImageFolder: ``dog -> /mnt/gone`` beside ``cat`` and ``eel`` is reported (not listed as
    "not an image"), and skipping it leaves ``eel`` class 2, as with the folder there; a
    folder-like dangling link inside a class is reported too, a dangling ``notes.txt`` is
    left out like any text file. Oracle: tarfile's members and the report's lines."""
    root = tmp_path / "tree"
    for cls in ("cat", "eel"):
        (root / cls).mkdir(parents=True)
        (root / cls / "a.jpg").write_bytes(cls.encode())
    os.symlink(tmp_path / "gone-dog", root / "dog")
    os.symlink(tmp_path / "gone-more", root / "cat/more")
    os.symlink(tmp_path / "gone.txt", root / "cat/notes.txt")
    assert _create(root, tmp_path / "a", "--layout", "imagefolder") == 1
    assert str(root / "cat/more") in capsys.readouterr().err
    assert _create(root, tmp_path / "b", "--layout", "imagefolder", "--skip-bad") == 0
    err = capsys.readouterr().err
    assert "wrote 2, skipped 2" in err
    assert f"skipped {root / 'dog'}" in err and f"skipped {root / 'cat/more'}" in err
    assert f"  left out {root / 'cat/notes.txt'}" in err.splitlines()
    assert _members(tmp_path / "b") == {"cat/a.jpg": b"cat", "cat/a.cls": b"0", "eel/a.jpg": b"eel",
                                        "eel/a.cls": b"2"}


@pytest.mark.parametrize("layout", ["folder", "imagefolder"])
def test_links_that_lead_round_a_loop_are_bad_inputs_not_a_crash(tmp_path, capsys, layout):
    """``a.jpg -> b.jpg -> a.jpg`` (the stat of either fails with ELOOP), in a class folder and
    at the top of the tree; oracle: both links named in the report, the good image read back."""
    root = tmp_path / "tree"
    (root / "cat").mkdir(parents=True)
    (root / "cat/ok.jpg").write_bytes(b"fine")
    for folder in (root / "cat", root):
        os.symlink("b.jpg", folder / "a.jpg")
        os.symlink("a.jpg", folder / "b.jpg")
    os.symlink("loop", root / "loop")  # a class folder's name, round a loop
    assert _create(root, tmp_path / "out", "--layout", layout, "--skip-bad") == 0
    err = capsys.readouterr().err
    looped = [root / "cat/a.jpg", root / "cat/b.jpg", root / "loop"]
    if layout == "folder":  # the folder layout groups by basename: a.jpg and cat/a.jpg are one sample's files
        looped += [root / "a.jpg", root / "b.jpg"]
    for link in looped:
        assert f"{link}: a symbolic link to " in err
    assert err.count("(a link loop)") == len(looped)
    assert _images(tmp_path / "out") == [b"fine"]


@pytest.mark.timeout(60)  # before the fix, the FIFO's copy waited forever
def test_a_manifest_path_to_a_fifo_or_a_folder_is_a_bad_input_not_a_wait(tmp_path, capsys):
    """A dataset's archive can hold a FIFO (GNU tar makes it): named by a manifest, it is refused
    like the folder layouts' FIFOs, as is a folder; oracle: the report's lines, tarfile."""
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    os.mkfifo(data / "pipe.txt")
    manifest = _manifest(data, [{"key": "fifo", "txt_path": "pipe.txt"}, {"key": "dir", "txt_path": "sub"}])
    assert _create(manifest, tmp_path / "out", "--skip-bad") == 0
    err = capsys.readouterr().err
    assert "wrote 1, skipped 2" in err
    assert "m.jsonl:2: field 'txt': 'pipe.txt' is a FIFO, socket or device, not a regular file" in err
    assert "m.jsonl:3: field 'txt': 'sub' is a folder, not a regular file" in err
    assert _members(tmp_path / "out") == {"ok.txt": b"fine"}
