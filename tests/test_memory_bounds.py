"""Bombs and huge claims under an address-space limit: each ends in our error naming the shard
and the member (or sample and field), and none raises the peak memory by more than 512 MB;
memory stays flat over many epochs, in one process and under DataLoader2 with 2 workers."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
import zlib
from pathlib import Path

import numpy as np
import PIL.Image
import pytest
import webdataset as wds
from stack import needs_dataloader2
from tar_builders import end_of_archive, header, member, patched, pax_header, sparse_member

PROBE = Path(__file__).with_name("memory_probe.py")
HEADROOM_MB = 512
MiB = 1 << 20


def _gzip_of(path: Path, pieces: list[bytes | tuple[int]]) -> None:
    """Writes a gzip file of ``pieces``: bytes as they are, (n,) for n zero bytes; streamed."""
    compressor = zlib.compressobj(1, zlib.DEFLATED, 31)
    zeros = bytes(MiB)
    with open(path, "wb") as out:
        for piece in pieces:
            if isinstance(piece, tuple):
                out.writelines(compressor.compress(zeros[: min(MiB, piece[0] - start)])
                               for start in range(0, piece[0], MiB))
            else:
                out.write(compressor.compress(piece))
        out.write(compressor.flush())


def _png_bomb(path: Path, side: int) -> None:
    """A greyscale PNG of side x side black pixels (a few hundred KB)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")
    row = bytes(side + 1)  # filter byte 0, then the row
    compressor = zlib.compressobj(9)
    idat = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()
    ihdr = side.to_bytes(4, "big") * 2 + bytes([8, 0, 0, 0, 0])
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def bombs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bombs")
    huge = patched(header("huge.bin", 0), 124, b"\x80" + (100 << 30).to_bytes(11, "big"))
    (d / "claim.tar").write_bytes(member("a.cls", b"1") + huge + b"x" * 1024 + end_of_archive())
    (d / "pax-claim.tar").write_bytes(pax_header([("size", str(10**15))]) + header("huge.bin", 0) + b"x" * 1024
                                      + end_of_archive())
    (d / "sparse.tar").write_bytes(sparse_member("PAX 0.1", "holes.bin", [(0, b"x"), (100 << 30, b"y")],
                                                 (100 << 30) + 1) + end_of_archive())
    # A 400 MiB member of zeros in a ~400 KB .tar.gz, and 512 members of 1 MiB.
    _gzip_of(d / "bomb.tar.gz", [header("bomb.bin", 400 * MiB), (400 * MiB,), end_of_archive()])
    many = []
    for i in range(512):
        many += [header(f"{i:04d}.bin", MiB), (MiB,)]
    _gzip_of(d / "many.tar.gz", [*many, end_of_archive()])
    _png_bomb(d / "bomb.png", 12_000)  # 144 M pixels: ~2.3 GB as float RGB
    _gzip_of(d / "bomb.json.gz", [(600 * MiB,)])
    claim = np.lib.format.header_data_from_array_1_0(np.zeros(1))
    claim["shape"] = (10**10,)
    npy = io.BytesIO()
    np.lib.format.write_array_header_1_0(npy, claim)
    (d / "claim.npy").write_bytes(npy.getvalue() + bytes(80))
    with (zipfile.ZipFile(d / "bomb.npz", "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive,
          archive.open("zeros.npy", "w", force_zip64=True) as out):
        header_data = np.lib.format.header_data_from_array_1_0(np.zeros(1))
        header_data["shape"] = (75 * MiB,)  # 600 MiB of float64
        np.lib.format.write_array_header_1_0(out, header_data)
        out.writelines(bytes(MiB) for _ in range(600))
    with wds.TarWriter(str(d / "warm.tar")) as sink:
        sink.write({"__key__": "w", "cls": b"1"})
    PIL.Image.new("RGB", (8, 8)).save(d / "warm.png")
    out = io.BytesIO()
    np.savez_compressed(out, a=np.arange(3))
    (d / "warm.npz").write_bytes(out.getvalue())
    return d


def _probe(data: Path, *scenarios: str, timeout: int = 240) -> dict[str, dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MALLOC_ARENA_MAX": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(PROBE), str(data), str(HEADROOM_MB), *scenarios], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {report["scenario"]: report for report in reports}


BOMBS = {
    # scenario: (error, words in its message)
    "claim-100GiB": ("ShardFormatError", ["huge.bin", "max_member_bytes"]),
    "claim-100GiB-no-limit": ("ShardFormatError", ["huge.bin", "truncated"]),
    "pax-size-1PB-no-limit": ("ShardFormatError", ["huge.bin", "truncated"]),
    "sparse-100GiB": ("ShardFormatError", ["holes.bin", "max_member_bytes"]),
    "gz-member-bomb": ("ShardFormatError", ["bomb.bin", "max_member_bytes"]),
    "png-bomb": ("DecodeError", ["bomb.png", "'png'", "max_image_pixels"]),
    "gz-field-bomb": ("DecodeError", ["bomb.json.gz", "'json.gz'", "max_gz_bytes"]),
    "npy-claim": ("DecodeError", ["claim.npy", "'npy'", "max_array_bytes"]),
    "npz-bomb": ("DecodeError", ["bomb.npz", "'npz'", "max_array_bytes"]),
}


def test_bombs_and_huge_claims_end_in_our_error_within_512_mb(bombs):
    reports = _probe(bombs, *BOMBS, "gz-many-1MiB-members")
    for scenario, (error, words) in BOMBS.items():
        report = reports[scenario]
        assert report.get("error") == error, report
        assert "MemoryError" not in report["message"], report
        for word in words:
            assert word in report["message"], (word, report)
        assert report["peak_rise"] is None or report["peak_rise"] < HEADROOM_MB * MiB, report
    many = reports["gz-many-1MiB-members"]
    assert many.get("result") == 512, many  # 512 MiB inflated in bounded pieces
    assert many["peak_rise"] is None or many["peak_rise"] < 64 * MiB, many


@pytest.fixture(scope="module")
def epoch_shards(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("epochs")
    rng = np.random.default_rng(0)
    for shard in range(4):
        with wds.TarWriter(str(d / f"epoch-{shard:03d}.tar")) as sink:
            for i in range(64):
                sink.write({"__key__": f"{shard}-{i}", "cls": str(i % 10).encode(),
                            "bin": rng.integers(0, 256, 20_000, dtype=np.uint8).tobytes()})
    return d


@pytest.mark.parametrize("loader", ["none", pytest.param("dataloader2", marks=needs_dataloader2)])
def test_memory_stays_flat_over_thirty_epochs(epoch_shards, loader):
    report = _probe(epoch_shards, f"epochs:{loader}")[f"epochs:{loader}"]
    assert report["batches"] == 4 * 64 // 16  # every epoch read whole
    if loader == "dataloader2":
        assert report["processes"] == 3  # the main process and its 2 workers, measured together
    growth = report["rss_30"] - report["rss_5"]
    assert growth < 16 * MiB, f"RSS grew by {growth / MiB:.1f} MiB between epochs 5 and 30: {report}"


def test_the_probe_reports_a_scenario_that_needs_too_much_memory(bombs):
    # The harness itself: without the pixel limit, the same PNG bomb needs far more than the
    # headroom, and the address-space limit turns that into a MemoryError.
    report = _probe_unbounded_png(bombs)
    assert report.get("error") == "DecodeError" and "MemoryError" in report["message"], report


def _probe_unbounded_png(bombs: Path) -> dict:
    code = (
        "import sys; sys.argv = ['probe', sys.argv[1], '512', 'png-bomb'];"
        "import memory_probe as probe; import wds_datapipes as wd;"
        "wd.set_limits(max_image_pixels=10**9); probe.main()"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROBE.parent), *sys.path]), "MALLOC_ARENA_MAX": "1"}
    done = subprocess.run([sys.executable, "-c", code, str(bombs)], env=env, capture_output=True, text=True,
                          timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_shards_the_probe_reads_are_what_they_claim(bombs):
    with tarfile.open(bombs / "bomb.tar.gz") as tar:
        (info,) = tar.getmembers()[:1]
        assert info.size == 400 * MiB
    assert os.path.getsize(bombs / "bomb.tar.gz") < 2 * MiB
    assert os.path.getsize(bombs / "many.tar.gz") < 4 * MiB
