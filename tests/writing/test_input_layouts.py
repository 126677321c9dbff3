"""The input layouts as users meet them: a shuffle over any input, names that are not UTF-8,
and ImageFolder trees that hold more than images."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from wds_datapipes import ShardLister
from wds_datapipes.cli import main

COMMON = ["--quiet", "--no-fsync"]


def _samples(folder) -> list[tuple[str, dict[str, bytes]]]:
    """oracle: tarfile (names as bytes by surrogateescape), (key, {suffix: bytes}) in shard order."""
    out: list[tuple[str, dict[str, bytes]]] = []
    for path in sorted(folder.glob("*.tar")):
        with tarfile.open(path, encoding="utf-8", errors="surrogateescape") as tar:
            for member in tar:
                dot = member.name.index(".", member.name.rfind("/") + 1)  # the readers' split: the base's first dot
                key, suffix = member.name[:dot], member.name[dot + 1 :]
                if not out or out[-1][0] != key:
                    out.append((key, {}))
                out[-1][1][suffix] = tar.extractfile(member).read()
    return out


def _pets(root, n: int = 30) -> None:
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    for i in range(n):
        (root / "images" / f"p{i:03d}.jpg").write_bytes(os.urandom(50 + i))
        (root / "labels" / f"p{i:03d}.txt").write_text(f"label {i}")


def _tree(root, n: int = 30) -> None:
    for c in ("cat", "dog", "eel"):
        (root / c).mkdir(parents=True)
        for i in range(n // 3):
            (root / c / f"{c}{i:02d}.png").write_bytes(os.urandom(40 + i))


def _manifest(root, n: int = 30) -> str:
    (root / "img").mkdir(parents=True)
    rows = []
    for i in range(n):
        (root / "img" / f"{i}.png").write_bytes(os.urandom(30 + i))
        rows.append({"key": f"k{i:03d}", "png_path": f"img/{i}.png", "cls": i % 4, "txt": f"caption {i}"})
    rows.append({"key": "gone", "png_path": "img/missing.png"})  # a bad input: it stays one after the shuffle
    (root / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(root / "m.jsonl")


@pytest.mark.parametrize("layout", ["folder", "imagefolder", "manifest"])
def test_a_seeded_shuffle_works_over_folders_imagefolder_trees_and_manifests(tmp_path, capsys, layout):
    """oracles: the unshuffled conversion read by tarfile (the same samples, whole); a second run with
    the same seed (the same bytes); another seed (another order); the bad input listed either way."""
    source = tmp_path / "in"
    if layout == "folder":  # a bad input in each: a link to nothing, a missing file (listed, shuffled or not)
        _pets(source)
        os.symlink(tmp_path / "gone.jpg", source / "images/missing.png")
    elif layout == "imagefolder":
        _tree(source)
        os.symlink(tmp_path / "gone.png", source / "cat/missing.png")
    else:
        source = _manifest(source)
    runs = {}
    for name, seed in (("plain", None), ("x", "5"), ("y", "5"), ("z", "6")):
        extra = [] if seed is None else ["--shuffle-seed", seed, "--shuffle-memory", "400"]
        code = main(["create", str(source), "-o", str(tmp_path / name / "s-%02d.tar"), "--layout", layout,
                     "--maxcount", "8", "--skip-bad", *COMMON, *extra])
        assert code == 0
        err = capsys.readouterr().err
        assert "skipped 1" in err and "missing.png" in err
        runs[name] = _samples(tmp_path / name)
    keys = {name: [k for k, _ in samples] for name, samples in runs.items()}
    assert len(keys["plain"]) == 30 and keys["plain"] == sorted(keys["plain"])
    assert sorted(runs["x"]) == sorted(runs["z"]) == sorted(runs["plain"])
    assert keys["x"] == keys["y"] and keys["x"] != keys["plain"] and keys["x"] != keys["z"]
    assert ({p.name: p.read_bytes() for p in (tmp_path / "x").glob("*.tar")} ==
            {p.name: p.read_bytes() for p in (tmp_path / "y").glob("*.tar")})
    assert not list((tmp_path / "x").glob(".wds-shuffle-*"))


def _fs(path) -> bytes:
    return os.fsencode(str(path))


@pytest.mark.parametrize("layout", ["folder", "imagefolder"])
def test_a_file_name_that_is_not_utf8_keeps_its_bytes(tmp_path, capsys, layout):
    """oracles: GNU tar's listing (the name's bytes as on disk), tarfile with surrogateescape,
    our reader's keys, and the index's verify."""
    root = tmp_path / "in"
    folder = _fs(root) + b"/cl\xe4s"  # a folder name that is not UTF-8 either (the class of an ImageFolder)
    os.makedirs(folder)
    names = [b"caf\xe9.jpg", b"ok.jpg", b"na\xefve \xff.jpg"]
    for n, name in enumerate(names):
        with open(folder + b"/" + name, "wb") as out:
            out.write(bytes([n]) * (100 + n))
    assert main(["create", str(root), "-o", str(tmp_path / "out/s-%02d.tar"), "--layout", layout, *COMMON]) == 0
    assert "wrote 3, skipped 0" in capsys.readouterr().err
    prefix = b"cl\xe4s/" if layout == "imagefolder" else b""
    stems = sorted(prefix + name[:-4] for name in names)
    want = [s + suffix for s in stems for suffix in ([b".cls", b".jpg"] if layout == "imagefolder" else [b".jpg"])]
    shard = tmp_path / "out/s-00.tar"
    if shutil.which("tar"):
        listed = subprocess.run(["tar", "--quoting-style=literal", "-tf", str(shard)], capture_output=True,
                                check=True)
        assert listed.stdout.split(b"\n")[:-1] == want and not listed.stderr
    got = _samples(tmp_path / "out")
    assert [k.encode("utf-8", "surrogateescape") for k, _ in got] == stems
    assert {k: v["jpg"] for k, v in got} == {
        (prefix + name[:-4]).decode("utf-8", "surrogateescape"): bytes([n]) * (100 + n) for n, name in enumerate(names)}
    ours = [s["__key__"] for s in ShardLister(str(shard)).load_tar().group_by_key()]
    assert ours == [k for k, _ in got]
    assert main(["verify", str(tmp_path / "out/index.json")]) == 0


def test_an_imagefolder_tree_takes_only_what_torchvision_takes_and_lists_the_rest(tmp_path, capsys):
    """oracle: torchvision's ImageFolder over the same tree (its samples and class numbers, with
    its own IMG_EXTENSIONS); every other file is listed as left out."""
    folder = pytest.importorskip("torchvision.datasets.folder")
    root = tmp_path / "tree"
    files = []
    for c, cls in enumerate(("ant", "bee")):
        (root / cls / "deeper").mkdir(parents=True)
        for e, extension in enumerate(folder.IMG_EXTENSIONS):
            name = f"{cls}{e}{extension.upper() if e % 3 == 0 else extension}"
            files.append(root / cls / (("deeper/" if e % 4 == 0 else "") + name))
        files += [root / cls / "README.txt", root / cls / "desktop.ini", root / cls / "x.gif", root / cls / "jpg",
                  root / cls / "deeper/notes.md"]
    for n, path in enumerate(files):
        path.write_bytes(f"file {n}".encode())
    assert main(["create", str(root), "-o", str(tmp_path / "out/s-%02d.tar"), "--layout", "imagefolder",
                 *COMMON]) == 0
    err = capsys.readouterr().err
    theirs = folder.ImageFolder(str(root), loader=lambda path: path)
    want = {os.path.relpath(path, root).rsplit(".", 1)[0]: (target, Path(path).read_bytes())
            for path, target in theirs.samples}
    got = {key: (int(fields["cls"]), next(v for s, v in fields.items() if s != "cls"))
           for key, fields in _samples(tmp_path / "out")}
    assert got == want and len(got) == 2 * len(folder.IMG_EXTENSIONS)
    left = {line.split("left out ", 1)[1] for line in err.splitlines() if line.startswith("  left out ")}
    assert left == {str(p) for p in files} - {path for path, _ in theirs.samples}
    assert f"left out {len(left)} file(s) or folder(s): hidden, beside the class folders, or not images" in err


def test_hidden_files_and_folders_of_an_imagefolder_tree_are_left_out_and_listed(tmp_path, capsys):
    """``.ipynb_checkpoints`` (torchvision would make it class 0), ``.DS_Store``, ``.x.jpg``: not
    taken, each listed (a hidden folder once, not its files). Oracle: torchvision's ImageFolder
    over a copy of the tree without hidden names (its samples and class numbers)."""
    folder = pytest.importorskip("torchvision.datasets.folder")
    root = tmp_path / "tree"
    for cls in ("ant", "bee"):
        (root / cls).mkdir(parents=True)
        (root / cls / f"{cls}.jpg").write_bytes(cls.encode())
    hidden = [root / ".ipynb_checkpoints", root / "ant/.DS_Store", root / "bee/.x.jpg"]
    hidden[0].mkdir()
    (hidden[0] / "old.jpg").write_bytes(b"old")
    hidden[1].write_bytes(b"finder")
    hidden[2].write_bytes(b"hidden image")
    assert main(["create", str(root), "-o", str(tmp_path / "out/s-%02d.tar"), "--layout", "imagefolder",
                 *COMMON]) == 0
    err = capsys.readouterr().err
    shutil.copytree(root, tmp_path / "plain", ignore=shutil.ignore_patterns(".*"))
    theirs = folder.ImageFolder(str(tmp_path / "plain"), loader=lambda path: path)
    want = {os.path.relpath(path, tmp_path / "plain").rsplit(".", 1)[0]: (target, Path(path).read_bytes())
            for path, target in theirs.samples}
    got = {key: (int(fields["cls"]), fields["jpg"]) for key, fields in _samples(tmp_path / "out")}
    assert got == want == {"ant/ant": (0, b"ant"), "bee/bee": (1, b"bee")}
    left = {line.split("left out ", 1)[1] for line in err.splitlines() if line.startswith("  left out ")}
    assert left == {str(p) for p in hidden} and "left out 3 file(s) or folder(s): hidden" in err


def test_a_manifest_that_is_not_utf8_is_refused_naming_its_line_and_a_byte_order_mark_is_read(tmp_path, capsys):
    """A Latin-1 CSV stops before anything is written, naming the file and line; a JSONL line
    that is not UTF-8 is a bad input of its own (listed with --skip-bad); Excel's UTF-8 CSV
    and a JSONL starting with a byte order mark read as without it. Oracle: tarfile's keys."""
    (tmp_path / "a.txt").write_bytes(b"a")
    cases = {"latin.csv": b"key,txt_path\nok,a.txt\ncaf\xe9,a.txt\n",
             "latin.jsonl": b'{"key": "ok", "txt_path": "a.txt"}\n{"key": "caf\xe9", "txt_path": "a.txt"}\n',
             "bom.csv": b"\xef\xbb\xbfkey,txt_path\nok,a.txt\n",
             "bom.jsonl": b'\xef\xbb\xbf{"key": "ok", "txt_path": "a.txt"}\n'}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
    out = tmp_path / "out"
    assert main(["create", str(tmp_path / "latin.csv"), "-o", str(out / "csv/s-%02d.tar"), *COMMON]) == 1
    err = capsys.readouterr().err
    assert "latin.csv:3': the manifest is not UTF-8 text: line 3 has the byte 0xe9" in err
    assert not list((out / "csv").glob("*.tar"))
    assert main(["create", str(tmp_path / "latin.jsonl"), "-o", str(out / "jsonl/s-%02d.tar"), "--skip-bad",
                 *COMMON]) == 0
    err = capsys.readouterr().err
    assert "wrote 1, skipped 1" in err and "latin.jsonl:2: not UTF-8 text: the byte 0xe9" in err
    assert [k for k, _ in _samples(out / "jsonl")] == ["ok"]
    for name in ("bom.csv", "bom.jsonl"):
        assert main(["create", str(tmp_path / name), "-o", str(out / name / "s-%02d.tar"), *COMMON]) == 0
        assert [k for k, _ in _samples(out / name)] == ["ok"]


def test_extensions_choose_what_an_imagefolder_tree_takes(tmp_path, capsys):
    """``--layout imagefolder --extensions gif,.JPG``: those instead of torchvision's (once silently
    ignored); the rest listed as left out, naming the extensions used. Oracle: tarfile's members."""
    root = tmp_path / "tree"
    (root / "cat").mkdir(parents=True)
    for name in ("a.gif", "b.jpg", "c.png", "d.txt"):
        (root / "cat" / name).write_bytes(name.encode())
    assert main(["create", str(root), "-o", str(tmp_path / "out/s-%02d.tar"), "--layout", "imagefolder",
                 "--extensions", "gif, .JPG", *COMMON]) == 0
    err = capsys.readouterr().err
    assert {k: set(v) for k, v in _samples(tmp_path / "out")} == {"cat/a": {"cls", "gif"}, "cat/b": {"cls", "jpg"}}
    left = {line.split("left out ", 1)[1] for line in err.splitlines() if line.startswith("  left out ")}
    assert left == {str(root / "cat/c.png"), str(root / "cat/d.txt")} and "(--extensions gif, .JPG)" in err
