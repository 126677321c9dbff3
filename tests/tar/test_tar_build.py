"""Tar bytes out (wds_datapipes.tar.build): what tarfile, GNU tar and our reader read back."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tar_builders import with_tarfile
from wds_datapipes.tar import iter_tar_members, iter_tar_places
from wds_datapipes.tar.build import build_tar, member_header, pax_record, ustar_block

_PART = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\0\n"), min_size=1, max_size=60)
_NAMES = st.lists(_PART, min_size=1, max_size=6).map("/".join).filter(lambda n: n not in (".", "..") and
                                                                      ".." not in n.split("/") and
                                                                      "." not in n.split("/"))
_MEMBERS = st.lists(st.tuples(_NAMES, st.binary(max_size=1500)), max_size=6,
                    unique_by=lambda m: m[0]).map(lambda ms: [(n, d) for n, d in ms])


def _ours(archive: bytes) -> list[tuple[str, bytes]]:
    return list(iter_tar_members(io.BytesIO(archive), "built.tar"))


@settings(max_examples=120, deadline=None)
@given(_MEMBERS)
def test_built_archive_reads_back_the_same_names_and_bytes(members):
    """oracle: Python's tarfile (the reader webdataset uses), and our own reader."""
    archive = build_tar(members)
    assert len(archive) % 512 == 0
    assert with_tarfile(archive) == members
    assert _ours(archive) == members


@settings(max_examples=60, deadline=None)
@given(_MEMBERS)
def test_built_headers_are_deterministic_and_owned_by_nobody(members):
    """oracle: tarfile's TarInfo fields (mtime 0, uid/gid 0, empty names, mode 0o444)."""
    archive = build_tar(members)
    assert build_tar(members) == archive
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for info in tar:
            assert (info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode) == (0, 0, 0, "", "", 0o444)


def test_long_names_split_into_the_ustar_prefix_or_go_into_pax():
    """oracle: tarfile; a 150-byte path splits at '/', a 300-byte one needs PAX."""
    split = "d" * 120 + "/" + "f" * 29 + ".jpg"
    long = "/".join(["x" * 99] * 3) + ".cls"
    assert len(member_header(split, 3)) == 512
    assert len(member_header(long, 3)) > 512
    members = [(split, b"abc"), (long, b"1"), ("ünïcode.txt", b"u")]
    assert with_tarfile(build_tar(members)) == members == _ours(build_tar(members))


def test_sizes_of_8_gib_and_more_go_into_a_pax_size_record():
    """oracle: tarfile reads the PAX size of a header built for a 9 GiB member."""
    size = 9 << 30
    head = member_header("big.bin", size)
    with tarfile.open(fileobj=io.BytesIO(head + bytes(1024)), mode="r|") as tar:
        info = tar.next()
        assert (info.name, info.size) == ("big.bin", size)


def test_pax_record_length_counts_its_own_digits():
    """oracle: the POSIX rule, checked by hand at the 9 -> 10 and 99 -> 100 borders."""
    for n in range(1, 300):
        record = pax_record("path", "x" * n)
        assert int(record.split(b" ")[0]) == len(record)


def test_header_checksum_is_the_one_the_reader_checks():
    """oracle: tarfile accepts the block (it checks the checksum) and our header_ok does too."""
    from wds_datapipes.tar.headers import header_ok

    block = ustar_block(b"a.txt", 5)
    assert header_ok(memoryview(block), 0)
    with tarfile.open(fileobj=io.BytesIO(block + b"hello" + bytes(507) + bytes(1024))) as tar:
        assert tar.getnames() == ["a.txt"]


@pytest.mark.skipif(shutil.which("tar") is None, reason="no GNU tar here")
@settings(max_examples=15, deadline=None)
@given(_MEMBERS.filter(lambda ms: len(ms) > 0))
def test_gnu_tar_lists_and_extracts_what_was_built(tmp_path_factory, members):
    """oracle: GNU tar (tar -tf lists the names, tar -xOf prints each member's bytes)."""
    path = tmp_path_factory.mktemp("gnu") / "built.tar"
    path.write_bytes(build_tar(members))
    names = subprocess.run(["tar", "--quoting-style=literal", "-tf", str(path)], capture_output=True,
                           check=True).stdout.decode("utf-8", "surrogateescape")
    assert names.split("\n")[:-1] == [name for name, _ in members]
    for name, data in members:
        out = subprocess.run(["tar", "--no-unquote", "-xOf", str(path), "--", name], capture_output=True,
                             check=True).stdout  # --no-unquote: a name such as "\\1" is not an escape
        assert out == data


def test_places_of_a_built_archive_point_at_the_bytes():
    """oracle: slicing the archive at each place gives the member's bytes."""
    members = [("a.jpg", b"x" * 700), ("a.cls", b"3"), ("b/" * 70 + "c.txt", b"hi")]
    archive = build_tar(members)
    for (name, _, data, size), (want_name, want) in zip(iter_tar_places(io.BytesIO(archive), "t.tar"), members):
        assert name == want_name and archive[data : data + size] == want


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="abcXYZ019._-/ ", min_size=1, max_size=100), st.integers(0, 8**11 - 1),
       st.integers(0, 8**11 - 1), st.sampled_from([0o444, 0o644, 0o755, 0o600]))
def test_a_plain_member_header_equals_the_block_built_field_by_field(name, size, mtime, mode):
    """oracle: ustar_block (every field set, the checksum summed over the whole block) and tarfile's
    reading of it: the one-join header of an ASCII name of <= 100 bytes is the same 512 bytes."""
    header = member_header(name, size, mtime=mtime, mode=mode)
    assert header == ustar_block(name.encode(), size, mtime=mtime, mode=mode)
    info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
    assert (info.name, info.size, info.mtime, info.mode) == (name, size, mtime, mode)
