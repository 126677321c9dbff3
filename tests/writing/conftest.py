"""Inputs the writer tests share: in-memory samples and a Pets-like folder of files; and a check
after every test that GNU tar reads each shard it left under ``tmp_path`` as tarfile does."""

from __future__ import annotations

import random
import tarfile

import numpy as np
import pytest

from tests.writing.gnu_tar import check_with_gnu_tar, shards_under

_GNU_TAR_MOST = 200  # shards checked a test (two tar runs each, all in one shell)


def make_samples(n: int, seed: int = 0) -> list[dict]:
    """``n`` samples of every common field kind, keys in order, payloads 0-3000 bytes."""
    rng = random.Random(seed)
    return [{"__key__": f"s{i:05d}", "bin": rng.randbytes(rng.randrange(0, 3000)), "cls": rng.randrange(10),
             "txt": f"sample {i} é", "json": {"i": i, "tags": ["a", "b"][: i % 3]},
             "npy": np.arange(i % 5, dtype=np.int16)} for i in range(n)]


def make_pets(root, n: int = 12, seed: int = 0) -> dict[str, bytes]:
    """A Pets-like tree: images/<k>.jpg, annotations/trimaps/<k>.png, annotations/list.txt."""
    rng = random.Random(seed)
    (root / "images").mkdir(parents=True)
    (root / "annotations" / "trimaps").mkdir(parents=True)
    files = {}
    lines = ["#Image CLASS-ID SPECIES BREED ID"]
    for i in range(n):
        key = f"{['Abyssinian', 'beagle'][i % 2]}_{i}"
        files[f"{key}.jpg"] = rng.randbytes(rng.randrange(100, 5000))
        files[f"{key}.png"] = rng.randbytes(rng.randrange(10, 500))
        (root / "images" / f"{key}.jpg").write_bytes(files[f"{key}.jpg"])
        (root / "annotations" / "trimaps" / f"{key}.png").write_bytes(files[f"{key}.png"])
        lines.append(f"{key} {i % 2 + 1} {i % 2 + 1} {i}")
    (root / "annotations" / "list.txt").write_text("\n".join(lines) + "\n")
    (root / "images" / ".DS_Store").write_bytes(b"junk")
    return files


def shard_keys(paths) -> list[str]:
    """The sample keys of these shards, in order (a key's members are adjacent). oracle:
    tarfile, not our reader."""
    keys: list[str] = []
    for path in paths:
        with tarfile.open(path) as tar:
            for member in tar:
                key = member.name.partition(".")[0]
                if not keys or keys[-1] != key:
                    keys.append(key)
    return keys


@pytest.fixture
def samples() -> list[dict]:
    return make_samples(60)


@pytest.fixture
def store(monkeypatch):
    """An in-memory store registered as ``memlist://`` that lists but cannot delete
    (``memory_store.ListingStore``: put, stamp, a glob list)."""
    from tests.writing.memory_store import ListingStore
    from wds_datapipes.shards import openers
    from wds_datapipes.storage.backend import Backend

    memory = ListingStore()
    monkeypatch.setitem(openers._BACKENDS, "memlist",
                        Backend("memlist", memory.open, stamp=memory.stamp, list=memory.list, put=memory.put))
    return memory


@pytest.fixture(autouse=True)
def _shards_read_by_gnu_tar(request):
    """After each test that used ``tmp_path``: every shard left there (``.tar``, ``.tar.gz``,
    ``.tar.bz2``, ``.tar.xz``) is listed and extracted by GNU tar, which must find the names,
    sizes and bytes that tarfile finds. oracle: GNU tar."""
    folder = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if folder is not None:
        check_with_gnu_tar(shards_under(folder)[:_GNU_TAR_MOST])
