"""``python -m wds_datapipes create``: every input kind to shards that webdataset, verify and our reader accept."""

from __future__ import annotations

import json

import pytest

from tests.writing.conftest import make_pets
from wds_datapipes import ShardLister
from wds_datapipes.cli import main
from wds_datapipes.epochs.index import ShardIndex


def _read(folder) -> list[dict]:
    """oracle reader: webdataset 1.0.2 over the written shards, in shard order."""
    import webdataset as wds

    urls = sorted(str(p) for p in folder.glob("*.tar"))
    return [{k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"}
            for s in wds.WebDataset(urls, shardshuffle=False).decode()]


def _verify(index) -> None:
    assert main(["verify", str(index)]) == 0


def test_a_pets_folder_becomes_shards_with_images_trimaps_and_list_fields(tmp_path, capsys):
    """oracle: the files' bytes and list.txt's columns, read back by webdataset 1.0.2."""
    files = make_pets(tmp_path / "pets", n=12)
    code = main(["create", str(tmp_path / "pets"), "-o", str(tmp_path / "out/pets-%04d.tar"), "--layout", "folder",
                 "--fields", str(tmp_path / "pets/annotations/list.txt"), "--field-names", "cls,species,breed",
                 "--extensions", "jpg,png", "--require", "jpg,png", "--maxcount", "5", "--quiet", "--no-fsync"])
    assert code == 0
    samples = _read(tmp_path / "out")
    assert [s["__key__"] for s in samples] == sorted(k.split(".")[0] for k in files if k.endswith(".jpg"))
    for s in samples:
        assert (s["jpg"], s["png"]) == (files[s["__key__"] + ".jpg"], files[s["__key__"] + ".png"])
        assert s["cls"] == (1 if s["__key__"].startswith("Aby") else 2)
        assert s["species"] == str(s["cls"]).encode()  # no decoder for .species: its bytes
    assert "read 12 samples: wrote 12, skipped 0" in capsys.readouterr().err
    _verify(tmp_path / "out/index.json")


def test_an_imagefolder_tree_gives_classes_in_sorted_order_and_reports_a_dotted_name(tmp_path, capsys):
    """oracle: torchvision's ImageFolder rule (classes numbered in sorted order), by hand."""
    for cls in ("dog", "cat"):
        (tmp_path / "tree" / cls).mkdir(parents=True)
        for i in range(3):
            (tmp_path / "tree" / cls / f"{cls}{i}.jpg").write_bytes(f"{cls}{i}".encode())
    (tmp_path / "tree/cat/bad.name.jpg").write_bytes(b"x")
    out = str(tmp_path / "out/s-%02d.tar")
    assert main(["create", str(tmp_path / "tree"), "-o", out, "--quiet", "--no-fsync"]) == 1
    assert "bad.name" in capsys.readouterr().err
    assert main(["create", str(tmp_path / "tree"), "-o", out, "--skip-bad", "--quiet", "--no-fsync",
                 "--restart"]) == 0
    err = capsys.readouterr().err
    assert "read 7 samples: wrote 6, skipped 1" in err and "bad.name.jpg" in err and "dot in its last part" in err
    got = {s["__key__"]: (s["jpg"], s["cls"]) for s in _read(tmp_path / "out")}
    assert got == {f"{c}/{c}{i}": (f"{c}{i}".encode(), n) for n, c in enumerate(["cat", "dog"]) for i in range(3)}
    _verify(tmp_path / "out/index.json")


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_a_manifest_of_paths_and_fields_becomes_shards_and_reports_a_missing_file(tmp_path, kind, capsys):
    """oracle: the manifest's rows and files, read back by webdataset 1.0.2."""
    (tmp_path / "img").mkdir()
    rows = []
    for i in range(5):
        (tmp_path / "img" / f"{i}.png").write_bytes(bytes([i]) * (i + 1))
        rows.append({"key": f"k{i}", "png_path": f"img/{i}.png", "cls": i, "txt": f"caption {i}"})
    rows.append({"key": "k9", "png_path": "img/missing.png", "cls": 9, "txt": "gone"})
    manifest = tmp_path / f"m.{kind}"
    if kind == "jsonl":
        manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        manifest.write_text("key,png_path,cls,txt\n" + "".join(f"{r['key']},{r['png_path']},{r['cls']},{r['txt']}\n"
                                                               for r in rows))
    assert main(["create", str(manifest), "-o", str(tmp_path / "out/m-%02d.tar"), "--skip-bad", "--quiet",
                 "--no-fsync", "--maxcount", "2"]) == 0
    err = capsys.readouterr().err
    assert "read 6 samples: wrote 5, skipped 1" in err and "missing.png" in err
    assert _read(tmp_path / "out") == [{"__key__": f"k{i}", "png": bytes([i]) * (i + 1), "cls": i,
                                        "txt": f"caption {i}"} for i in range(5)]


def test_existing_shards_are_resharded_and_filtered_by_key(tmp_path):
    """oracle: the first conversion's samples (our ShardLister pipeline), filtered by the glob by hand."""
    make_pets(tmp_path / "pets", n=10)
    assert main(["create", str(tmp_path / "pets"), "-o", str(tmp_path / "a/p-%02d.tar"), "--extensions", "jpg,png",
                 "--maxcount", "4", "--quiet", "--no-fsync"]) == 0
    assert main(["create", str(tmp_path / "a"), "-o", str(tmp_path / "b/q-%02d.tar"), "--maxcount", "2",
                 "--keys", "Aby*", "--quiet", "--no-fsync"]) == 0
    first = [s for s in ShardLister(str(tmp_path / "a")).load_tar().group_by_key()]
    want = [{k: v for k, v in s.items() if k != "__url__"} for s in first if s["__key__"].startswith("Aby")]
    assert _read(tmp_path / "b") == want
    assert list(ShardIndex.load(str(tmp_path / "b/index.json")).sizes) == [2, 2, 1]


def test_ranks_from_the_slurm_environment_write_disjoint_shards_then_join(tmp_path, monkeypatch):
    """oracle: a one-rank conversion of the same folder (same shards, same index sizes)."""
    make_pets(tmp_path / "pets", n=9)
    common = ["--extensions", "jpg,png", "--maxcount", "2", "--quiet", "--no-fsync"]
    assert main(["create", str(tmp_path / "pets"), "-o", str(tmp_path / "one/p-%02d.tar"), *common]) == 0
    for rank in range(2):
        monkeypatch.setenv("SLURM_PROCID", str(rank))
        monkeypatch.setenv("SLURM_NTASKS", "2")
        assert main(["create", str(tmp_path / "pets"), "-o", str(tmp_path / "two/p-%02d.tar"), *common]) == 0
    assert not (tmp_path / "two/index.json").exists()
    assert main(["create", str(tmp_path / "pets"), "-o", str(tmp_path / "two/p-%02d.tar"), "--join", *common]) == 0
    assert ([p.read_bytes() for p in sorted((tmp_path / "one").glob("*.tar"))] ==
            [p.read_bytes() for p in sorted((tmp_path / "two").glob("*.tar"))])
    _verify(tmp_path / "two/index.json")


def test_a_file_over_the_limit_stops_the_command_or_is_listed_as_skipped(tmp_path, capsys):
    """oracle: the planted big file's name and size in the error and in the report; read = written + skipped."""
    make_pets(tmp_path / "pets", n=6)
    (tmp_path / "pets/images/huge_1.jpg").write_bytes(bytes(20_000))
    common = [str(tmp_path / "pets"), "-o", str(tmp_path / "out/p-%02d.tar"), "--extensions", "jpg",
              "--max-field-bytes", "10k", "--quiet", "--no-fsync"]
    assert main(["create", *common]) == 1
    assert "huge_1" in capsys.readouterr().err
    assert main(["create", *common, "--skip-bad", "--restart"]) == 0
    err = capsys.readouterr().err
    assert "read 7 samples: wrote 6, skipped 1" in err
    assert "skipped " + str(tmp_path / "pets/images/huge_1.jpg") in err and "20000 bytes, over the limit of 10000" in err
    assert [s["__key__"] for s in _read(tmp_path / "out")] == sorted(
        p.stem for p in (tmp_path / "pets/images").glob("*.jpg") if p.stem != "huge_1")


def test_the_progress_bar_shows_samples_per_second_bytes_per_second_and_an_eta(monkeypatch):
    """oracle: tqdm's own rendering of the bar (its remaining-time field needs the total)."""
    import io

    from wds_datapipes.writing.command import _Bar

    monkeypatch.setattr("sys.stderr", io.StringIO())
    with _Bar(quiet=False, total=100, world=2) as bar:
        bar.advance(10, 5_000_000)
        shown = str(bar.bar)
    assert "10/50" in shown and "sample/s" in shown and "MB/s" in shown and "<" in shown


def test_a_dotted_basename_in_a_folder_is_reported_not_silently_left_out(tmp_path, capsys):
    """oracle: the planted file name, split as the readers split it (split_key), in the report."""
    make_pets(tmp_path / "pets", n=4)
    (tmp_path / "pets/images/photo.v2.jpg").write_bytes(b"dotted")
    common = [str(tmp_path / "pets"), "-o", str(tmp_path / "out/p-%02d.tar"), "--extensions", "jpg,png",
              "--quiet", "--no-fsync"]
    assert main(["create", *common]) == 1
    assert "photo.v2.jpg" in capsys.readouterr().err
    assert main(["create", *common, "--skip-bad", "--restart"]) == 0
    err = capsys.readouterr().err
    assert "read 5 samples: wrote 4, skipped 1" in err
    assert "into the key 'photo' and the field 'v2.jpg'" in err
