"""The tar reader against two independent readers over generated archives.

Oracles: GNU tar's extraction (``tar -xf --to-command``, which hands over each regular file
it extracts, sparse ones expanded, in archive order: :func:`tar_builders.with_gnu_tar`) and
Python's ``tarfile``; and the files the archive was made from. Archives are written by
GNU tar in each of its formats (``gnu``, ``oldgnu``, ``posix``, ``ustar``, ``v7``, sparse
files in old GNU and PAX 0.0, 0.1 and 1.0 form) and by ``tarfile`` (GNU, PAX, ustar),
from members hypothesis draws: long names (past 100 and 255 bytes), non-ASCII names,
names with dots, directories, symlinks, hard links, empty files, sizes around 512.

Cut archives follow this rule, GNU tar's behaviour being the oracle:

- what we yield is always a prefix of the whole archive's members, the same bytes: the
  members GNU tar extracts whole from the cut archive, and where the cut falls in the last
  block of a member after its bytes, that member too (GNU tar reads whole blocks);
- where GNU tar fails (a cut inside a header or a member's bytes), we raise
  ShardFormatError naming the shard, and the member whose bytes are cut;
- where GNU tar succeeds, we end cleanly only if the cut is after the end-of-archive
  block, and then with every member; before it we raise "truncated" (the documented
  difference). GNU tar ends quietly at a cut at a header boundary, and at some cuts
  inside a header (it reads a short last block as if padded with zeros: a GNU long-name
  header whose zero tail is cut still reads, and its missing data ends the archive), so
  it loses the members after without a word.
"""

from __future__ import annotations

import io
import os
import random
import subprocess
import tarfile
import tempfile

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tar_builders import (
    end_of_archive,
    gnu_tar,
    member,
    random_bytes,
    sparse_content,
    sparse_member,
    with_gnu_tar,
)

from wds_datapipes import ShardFormatError
from wds_datapipes.tar import iter_tar_members

pytestmark = [pytest.mark.skipif(gnu_tar() is None, reason="needs GNU tar (the oracle)"), pytest.mark.timeout(300)]

URL = "http://host/oracle/shard-000001.tar"
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                          HealthCheck.data_too_large])
GNU_FORMATS = ["gnu", "oldgnu", "posix", "ustar", "v7"]
SPARSE_FORMATS = {"gnu": [None], "oldgnu": [None], "posix": ["0.0", "0.1", "1.0"]}

_name_part = st.text(st.characters(categories=("L", "N"), include_characters=".-_ é日\u00a0"), min_size=1,
                     max_size=70).filter(lambda part: part not in (".", ".."))
_size = st.one_of(st.sampled_from([0, 1, 100, 511, 512, 513, 1023, 1024, 1025, 10_240]), st.integers(0, 20_000))
_member = st.tuples(
    st.sampled_from(["file", "file", "file", "dir", "symlink", "hardlink", "sparse"]),
    st.lists(_name_part, min_size=1, max_size=5),  # up to ~350 bytes: past 100 and 255
    _size,
    st.integers(0, 1 << 30),  # the seed of its bytes (or of its sparse map)
)
_members = st.lists(_member, min_size=1, max_size=6)


def _ours(archive: bytes, chunk_size: int) -> list[tuple[str, bytes]]:
    return list(iter_tar_members(io.BytesIO(archive), URL, chunk_size))


def _sparse_pieces(size: int, seed: int) -> list[tuple[int, bytes]]:
    """Data pieces with holes of whole blocks between them (what GNU tar can detect)."""
    rng = random.Random(seed)
    pieces, at = [], rng.choice([0, 512 * rng.randint(1, 8)])
    while at < 64 * 1024 and len(pieces) < 6:
        data = rng.randbytes(rng.randint(1, 3000))
        pieces.append((at, data))
        at += len(data) + 512 * rng.randint(1, 20)
    return pieces


class _Files(dict):
    """The bytes of each regular file archived; ``linked``: those of each hard link, by its name."""

    def __init__(self):
        super().__init__()
        self.linked: dict[str, bytes] = {}


def _make_tree(folder: str, members) -> tuple[list[str], dict[str, bytes]]:
    """Writes the drawn members under ``folder``; returns the paths to archive, in order,
    and the bytes of each regular file (what every reader must give back)."""
    paths: list[str] = []
    files = _Files()
    linked = files.linked
    for i, (kind, parts, size, seed) in enumerate(members):
        path = "/".join([f"{i}{parts[0]}", *parts[1:]])  # its own top folder: no clash with another
        full = os.path.join(folder, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        if kind == "dir":
            os.makedirs(full)
        elif kind == "symlink":
            os.symlink(parts[-1] * (1 + seed % 3), full)  # a target of up to ~210 bytes
        elif kind == "hardlink" and files:
            target = next(iter(files))
            os.link(os.path.join(folder, target), full)
            # A link whose target the format could not hold is archived as a file of its own.
            linked[path] = files[target]
        elif kind == "sparse":
            pieces = _sparse_pieces(size, seed)
            real_size = pieces[-1][0] + len(pieces[-1][1]) + (seed % 3) * 4096  # some end in a hole
            with open(full, "wb") as out:
                for offset, data in pieces:
                    out.seek(offset)
                    out.write(data)
                out.truncate(real_size)
            files[path] = sparse_content(pieces, real_size)
        else:
            data = random_bytes(size, seed)
            with open(full, "wb") as out:
                out.write(data)
            files[path] = data
        paths.append(path)
    return paths, files


def _gnu_archive(folder: str, members, fmt: str, sparse_version: str | None) -> tuple[bytes, dict[str, bytes]]:
    """The archive GNU tar writes of the drawn members in ``fmt`` (members whose names or
    links the format cannot hold are left out by GNU tar, with a warning)."""
    tree = os.path.join(folder, "tree")
    os.makedirs(tree)
    paths, files = _make_tree(tree, members)
    listing = os.path.join(folder, "list")
    with open(listing, "wb") as out:
        out.write(b"".join(p.encode() + b"\0" for p in paths))
    archive = os.path.join(folder, "out.tar")
    command = [gnu_tar(), "-cf", archive, f"--format={fmt}", "--no-recursion", "-C", tree, "--null", "-T", listing]
    if fmt in SPARSE_FORMATS:
        command += ["--sparse", "--hole-detection=raw"]
        if sparse_version is not None:
            command.append(f"--sparse-version={sparse_version}")
    made = subprocess.run(command, capture_output=True, check=False, timeout=60, env={**os.environ, "LC_ALL": "C"})
    assert made.returncode in (0, 2), made.stderr  # 2: some member not dumped (too long for the format)
    with open(archive, "rb") as data:
        return data.read(), files


def _gnu_formats():
    return st.sampled_from([(fmt, version) for fmt in GNU_FORMATS for version in SPARSE_FORMATS.get(fmt, [None])])


def _with_tarfile(archive: bytes) -> list[tuple[str, bytes]]:
    """(name, bytes) of each regular member as tarfile reads them, but for the documented
    difference: a sparse member is named by its GNU.sparse.name, as GNU tar names it (where
    GNU tar writes a "path" record too, tarfile names it ./GNUSparseFile.<pid>/<name>)."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        return [(m.pax_headers.get("GNU.sparse.name", m.name), tar.extractfile(m).read()) for m in tar if m.isreg()]


def _check_against_oracles(archive: bytes, files: dict[str, bytes], folder: str, chunk_size: int,
                           tarfile_too: bool = True) -> list[tuple[str, bytes]]:
    status, expected, errors = with_gnu_tar(archive, os.path.join(folder, "gnu"))
    assert status == 0, errors
    ours = _ours(archive, chunk_size)
    assert ours == expected  # oracle: GNU tar
    if tarfile_too:
        assert ours == _with_tarfile(archive)  # oracle: tarfile
    linked = getattr(files, "linked", {})
    for name, data in ours:  # oracle: the files the archive was made of
        assert data == (files[name] if name in files else linked[name])
    return ours


@SETTINGS
@given(members=_members, form=_gnu_formats(), chunk_size=st.sampled_from([512, 4096, 1 << 20]))
# Found by a draw: a name too long for ustar is not dumped, and a hard link to it becomes a file.
@example(members=[("file", ["0000" + "\U00010000" * 22 + "\U00010636\U0001d498\U0001d499"], 0, 0),
                  ("hardlink", ["0"], 0, 0)], form=("ustar", None), chunk_size=512)
def test_archives_gnu_tar_writes_read_as_gnu_tar_and_tarfile_read_them(members, form, chunk_size):
    """Oracles: GNU tar's extraction, tarfile, and the files archived (every GNU tar format,
    sparse files in old GNU and PAX 0.0/0.1/1.0 form, long and non-ASCII names, links)."""
    fmt, sparse_version = form
    with tempfile.TemporaryDirectory() as folder:
        archive, files = _gnu_archive(folder, members, fmt, sparse_version)
        ours = _check_against_oracles(archive, files, folder, chunk_size)
        if fmt in ("gnu", "oldgnu", "posix"):  # formats that hold every name: nothing was left out
            assert sorted(name for name, _ in ours) == sorted(files)


@pytest.mark.parametrize("version", ["0.0", "0.1", "1.0"])
@pytest.mark.parametrize("name", ["caf\u00e9/sparse.bin", "d/" + "n" * 120])
def test_a_pax_sparse_member_is_named_by_its_gnu_sparse_name_as_gnu_tar_names_it(version, name, tmp_path):
    """Oracle: GNU tar's extraction. For a name that is long or not ASCII, GNU tar's PAX
    sparse writers add a "path" record ./GNUSparseFile.<pid>/<name> after GNU.sparse.name;
    GNU tar names the member by GNU.sparse.name (tarfile by the "path" record)."""
    folder = str(tmp_path)
    members = [("file", ["a"], 10, 1), ("sparse", name.split("/"), 0, 7), ("file", ["z"], 600, 2)]
    archive, files = _gnu_archive(folder, members, "posix", version)
    assert (b"GNUSparseFile" in archive) == (version != "0.0")
    ours = _check_against_oracles(archive, files, folder, 4096)
    assert [n for n, _ in ours] == ["0a", "1" + name, "2z"]


_TARFILE_FORMATS = {"gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT, "ustar": tarfile.USTAR_FORMAT}


@SETTINGS
@given(members=_members, fmt=st.sampled_from(sorted(_TARFILE_FORMATS)), size_records=st.booleans(),
       chunk_size=st.sampled_from([512, 4096, 1 << 20]))
def test_archives_tarfile_writes_read_as_gnu_tar_and_tarfile_read_them(members, fmt, size_records, chunk_size):
    """Oracles: GNU tar's extraction, tarfile, and the members written (tarfile's GNU, PAX
    and ustar writers; PAX headers with ``size`` records where drawn)."""
    out = io.BytesIO()
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=out, mode="w", format=_TARFILE_FORMATS[fmt]) as tar:
        for i, (kind, parts, size, seed) in enumerate(members):
            info = tarfile.TarInfo("/".join([f"{i}{parts[0]}", *parts[1:]]))
            data = b""
            if kind == "dir":
                info.type = tarfile.DIRTYPE
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, parts[-1] * (1 + seed % 3)
            elif kind == "hardlink" and files:
                info.type, info.linkname = tarfile.LNKTYPE, next(iter(files))
            else:
                data = random_bytes(size, seed)
                info.size = len(data)
                if size_records and fmt == "pax":
                    info.pax_headers = {"size": str(len(data))}
            try:
                tar.addfile(info, io.BytesIO(data))
            except ValueError:  # a name or link ustar cannot hold: tarfile writes nothing of it
                continue
            if info.isreg():
                files[info.name] = data
    with tempfile.TemporaryDirectory() as folder:
        ours = _check_against_oracles(out.getvalue(), files, folder, chunk_size)
    assert [name for name, _ in ours] == list(files)


_aligned_pieces = st.lists(st.tuples(st.integers(0, 8), st.integers(1, 2000), st.integers(0, 1 << 20)),
                           min_size=1, max_size=30)


@SETTINGS
@given(version=st.sampled_from(["old GNU", "PAX 0.0", "PAX 0.1", "PAX 1.0"]), spans=_aligned_pieces,
       tail=st.integers(0, 3000), size_record=st.booleans(), chunk_size=st.sampled_from([512, 1 << 20]))
def test_sparse_maps_read_as_gnu_tar_reads_them(version, spans, tail, size_record, chunk_size):
    """Oracles: GNU tar's extraction, and tarfile where it reads the member (not beside a PAX
    ``size`` record, which tarfile misreads). Maps of up to 30 pieces (old GNU extension
    blocks), holes of whole blocks, pieces a whole number of blocks but the last (as GNU
    tar stores them and reads them back), files ending in data or in a hole."""
    size_record = size_record and version != "old GNU"
    pieces, at = [], 0
    for i, (holes, length, seed) in enumerate(spans):
        at += 512 * holes
        if i < len(spans) - 1:
            length += -length % 512  # whole blocks, but the last piece
        pieces.append((at, random_bytes(length, seed)))
        at += length
    real_size = pieces[-1][0] + len(pieces[-1][1]) + tail
    pieces.append((real_size, b""))  # GNU tar's map always ends at the file's size
    archive = (member("a.txt", b"before") + sparse_member(version, "dir/sparse.bin", pieces, real_size, size_record)
               + member("z.txt", b"after") + end_of_archive())
    files = {"a.txt": b"before", "dir/sparse.bin": sparse_content(pieces, real_size), "z.txt": b"after"}
    with tempfile.TemporaryDirectory() as folder:
        ours = _check_against_oracles(archive, files, folder, chunk_size, tarfile_too=not size_record)
    assert [name for name, _ in ours] == ["a.txt", "dir/sparse.bin", "z.txt"]


def _end_of_archive(archive: bytes) -> int:
    """Where the end-of-archive block ends: past it, a cut loses nothing."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        tar.getmembers()
        return tar.offset + 512


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(members=_members, form=_gnu_formats(), data=st.data())
def test_a_cut_archive_yields_what_gnu_tar_extracts_whole_and_fails_where_it_fails(members, form, data):
    """Oracle: GNU tar's extraction of the cut archive (its exit status and the members it
    extracts whole), and of the whole one; the rule is in the module's docstring."""
    fmt, sparse_version = form
    with tempfile.TemporaryDirectory() as folder:
        archive, _ = _gnu_archive(folder, members, fmt, sparse_version)
        end = _end_of_archive(archive)
        cut = data.draw(st.one_of(st.integers(0, end + 512), st.integers(0, end // 512 + 1).map(lambda n: 512 * n)),
                        label="cut")
        _, whole, _ = with_gnu_tar(archive, os.path.join(folder, "whole"))
        status, extracted, errors = with_gnu_tar(archive[:cut], os.path.join(folder, "cut"))
    complete = []  # the members GNU tar extracted whole from the cut archive
    for got, full in zip(extracted, whole):
        if got != full:
            break
        complete.append(got)
    ours: list[tuple[str, bytes]] = []
    error = None
    try:
        ours.extend(iter_tar_members(io.BytesIO(archive[:cut]), URL, data.draw(st.sampled_from([512, 1 << 20]))))
    except ShardFormatError as exn:
        error = exn
    assert ours == whole[: len(ours)]  # never other bytes
    assert ours[: len(complete)] == complete  # never less than GNU tar got whole
    if len(ours) > len(complete):  # GNU tar reads whole blocks: a member whose last block is cut
        assert len(ours) == len(complete) + 1 and cut % 512 and status != 0 and error is not None
    if status != 0:
        assert error is not None and error.url == URL, errors
    if error is None:
        assert status == 0 and cut >= end and ours == whole
    elif status == 0:  # the documented difference: GNU tar ended quietly before the end block
        assert cut < end and "truncated" in error.reason
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        for info in tar:
            if info.isreg() and not info.issparse() and info.offset_data <= cut < info.offset_data + info.size:
                assert error is not None and error.member == info.name  # the member whose bytes are cut
