"""The tar reader on every format webdataset's tarfile reads: sparse members, compressions,
gzip trailers, and tarfile's rules for extended headers; differences from tarfile are the
documented ones (docs/security.md)."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import tarfile
import zlib

import pytest
import zstandard
from tar_builders import (
    SPARSE_VERSIONS,
    build_tar,
    end_of_archive,
    gnu_long_name,
    gnu_tar,
    header,
    member,
    patched,
    pax_header,
    random_bytes,
    sparse_content,
    sparse_member,
    with_gnu_tar,
    with_tarfile,
)

from wds_datapipes import Limits, ShardFormatError, ShardOpenError
from wds_datapipes.tar import iter_tar_index, iter_tar_members
from wds_datapipes.tar import sources as tar_sources

URL = "http://host/shards/shard-000007.tar"
CHUNKS = [512, 4096, 1 << 20]


def _ours(data: bytes, chunk_size: int = 4096, **options) -> list[tuple[str, bytes]]:
    return list(iter_tar_members(io.BytesIO(data), URL, chunk_size, **options))


def _read_until_error(data: bytes, chunk_size: int = 4096) -> tuple[list[tuple[str, bytes]], ShardFormatError]:
    got: list = []
    with pytest.raises(ShardFormatError) as caught:
        got.extend(iter_tar_members(io.BytesIO(data), URL, chunk_size))  # keeps what came before the error
    return got, caught.value


# ---------------------------------------------------------------- GNU sparse members

_PIECES = [(0, random_bytes(700, 1)), (5000, random_bytes(1000, 2))] + [
    (20_000 + 3000 * i, random_bytes(100 + i, 3 + i)) for i in range(30)  # > 25 pieces: old GNU extension blocks
]
_REAL_SIZE = 20_000 + 3000 * 30 + 4000  # ends in a hole


def _sparse_archive(version: str) -> bytes:
    return (member("a.txt", b"hello") + sparse_member(version, "dir/sparse.bin", _PIECES, _REAL_SIZE)
            + member("z.txt", b"after") + end_of_archive())


@pytest.mark.parametrize("chunk_size", CHUNKS)
@pytest.mark.parametrize("compression", ["plain", "gz"])
@pytest.mark.parametrize("version", SPARSE_VERSIONS)
def test_sparse_members_give_the_bytes_tarfile_gives(version, compression, chunk_size):
    archive = _sparse_archive(version)
    expected = with_tarfile(archive)
    assert [name for name, _ in expected] == ["a.txt", "dir/sparse.bin", "z.txt"]
    assert expected[1][1] == sparse_content(_PIECES, _REAL_SIZE)  # the reference itself is right
    data = gzip.compress(archive) if compression == "gz" else archive
    assert _ours(data, chunk_size) == expected


@pytest.mark.parametrize("version", SPARSE_VERSIONS)
def test_sparse_members_are_indexed_and_skipped_whole(version):
    archive = _sparse_archive(version)
    index = list(iter_tar_index(io.BytesIO(archive), URL, 512))
    assert [name for name, _ in index] == ["a.txt", "dir/sparse.bin", "z.txt"]
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        assert index[2][1] == tar.getmember("z.txt").offset  # the sparse data and maps were passed over
    _, sparse_offset = index[1]
    skipped = list(iter_tar_members(io.BytesIO(archive[sparse_offset:]), URL, 512, start=sparse_offset,
                                    skip_data=lambda name: name.endswith(".bin")))
    assert skipped == [("dir/sparse.bin", None), ("z.txt", b"after")]


@pytest.mark.parametrize("version", SPARSE_VERSIONS)
def test_a_sparse_member_larger_than_the_limit_raises_before_its_holes_are_allocated(version):
    archive = member("a.txt", b"x") + sparse_member(version, "huge.bin", [(0, b"x"), (1 << 40, b"y")], (1 << 40) + 1)
    got, error = _read_until_error(archive + end_of_archive())
    assert got == [("a.txt", b"x")]
    assert error.member == "huge.bin" and "max_member_bytes" in str(error)


@pytest.mark.parametrize("version", ["old GNU", "PAX 0.0", "PAX 0.1"])
def test_a_sparse_map_out_of_order_or_past_the_size_raises(version):
    for pieces, real_size in [([(4096, b"b" * 10), (0, b"a" * 10)], 8192), ([(0, b"a" * 10)], 5)]:
        archive = member("a.txt", b"x") + sparse_member(version, "bad.bin", pieces, real_size) + end_of_archive()
        got, error = _read_until_error(archive)
        assert got == [("a.txt", b"x")]
        assert error.member == "bad.bin" and "sparse map" in error.reason


# Pieces as GNU tar stores them: each but the last a whole number of blocks (GNU tar reads
# every piece from a block boundary; tarfile reads them back to back: they agree only so),
# and a file that ends in a hole with an empty last piece at its end (GNU tar writes its
# bytes up to the last piece to a --to-command).
_ALIGNED = [(1024, random_bytes(512, 4)), (8192, random_bytes(1536, 5)), (20_000, random_bytes(700, 6)), (24_000, b"")]
_ALIGNED_SIZE = 24_000


@pytest.mark.skipif(gnu_tar() is None, reason="needs GNU tar (the oracle)")
@pytest.mark.parametrize("chunk_size", [512, 1 << 20])
@pytest.mark.parametrize("version", ["PAX 0.0", "PAX 0.1", "PAX 1.0"])
def test_a_pax_sparse_member_with_a_size_record_is_read_as_gnu_tar_reads_it(version, chunk_size, tmp_path):
    """Oracle: GNU tar's extraction (``--to-command``). GNU tar writes a PAX ``size`` record
    for a sparse member stored in 8 GiB or more; it gives the member's bytes in the archive
    (for PAX 1.0 the map before the pieces too) and overrides the ustar size field (0 here),
    while GNU.sparse.size / realsize is the file's size. tarfile lets the real size replace
    the stored one and reads past the member (not an oracle here)."""
    archive = (member("a.txt", b"hello") + sparse_member(version, "dir/sparse.bin", _ALIGNED, _ALIGNED_SIZE,
                                                         size_record=True)
               + member("z.txt", b"after") + end_of_archive())
    status, expected, errors = with_gnu_tar(archive, str(tmp_path))
    assert status == 0, errors
    assert expected == [("a.txt", b"hello"), ("dir/sparse.bin", sparse_content(_ALIGNED, _ALIGNED_SIZE)),
                        ("z.txt", b"after")]
    assert _ours(archive, chunk_size) == expected
    index = list(iter_tar_index(io.BytesIO(archive), URL, 512))
    assert [name for name, _ in index] == ["a.txt", "dir/sparse.bin", "z.txt"]
    assert index[2][1] == len(archive) - 4 * 512  # z.txt: the stored size was what got passed over


def test_a_pax_1_0_sparse_map_longer_than_the_header_limit_raises_naming_the_limit():
    pieces = [(1024 * i, b"x") for i in range(1, 400)]  # a map of ~4 KiB
    archive = member("a.txt", b"x") + sparse_member("PAX 1.0", "big-map.bin", pieces, 1 << 20) + end_of_archive()
    assert _ours(archive)[1] == ("big-map.bin", sparse_content(pieces, 1 << 20))
    got, error = [], None
    with pytest.raises(ShardFormatError) as caught:
        got.extend(iter_tar_members(io.BytesIO(archive), URL, 4096, limits=Limits(max_header_bytes=2048)))
    error = caught.value
    assert got == [("a.txt", b"x")]
    assert error.member == "big-map.bin" and error.url == URL
    assert "more than the limit of 2048 (Limits.max_header_bytes)" in error.reason


def test_an_old_gnu_sparse_map_longer_than_the_header_limit_raises_naming_the_limit():
    pieces = [(1024 * i, b"x") for i in range(1, 400)]  # 4 in the header, 19 extension blocks
    archive = member("a.txt", b"x") + sparse_member("old GNU", "big-map.bin", pieces, 1 << 20) + end_of_archive()
    assert _ours(archive)[1] == ("big-map.bin", sparse_content(pieces, 1 << 20))
    with pytest.raises(ShardFormatError) as caught:
        _ours(archive, limits=Limits(max_header_bytes=2048))
    assert caught.value.member == "big-map.bin"
    assert "more than the limit of 2048 (Limits.max_header_bytes)" in caught.value.reason


# ---------------------------------------------------------------- compressions, by their first bytes


def _zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(write_checksum=True).compress(data)


_COMPRESSORS = {"gzip": gzip.compress, "bzip2": bz2.compress, "xz": lzma.compress, "zstd": _zstd}


@pytest.mark.parametrize("chunk_size", [512, 1 << 20])
@pytest.mark.parametrize("kind", sorted(_COMPRESSORS))
def test_compressed_shards_are_found_by_their_first_bytes(kind, chunk_size):
    plain = build_tar([("a.txt", b"hello"), ("b.bin", random_bytes(300_000, 5)), ("c.txt", b"c")])
    packed = _COMPRESSORS[kind](plain)
    assert _ours(packed, chunk_size) == with_tarfile(plain)
    index = list(iter_tar_index(io.BytesIO(packed), URL))
    assert [name for name, _ in index] == ["a.txt", "b.bin", "c.txt"] and {o for _, o in index} == {None}


@pytest.mark.parametrize("kind", ["bzip2", "xz", "zstd"])
def test_concatenated_compressed_streams_are_read_as_one(kind):
    plain = build_tar([("a.txt", b"hello"), ("b.bin", random_bytes(3000, 6))])
    compress = _COMPRESSORS[kind]
    assert _ours(compress(plain[:1000]) + compress(plain[1000:])) == with_tarfile(plain)


def test_a_plain_tar_whose_first_member_is_named_like_a_magic_number_stays_plain():
    # tarfile's stream mode ("r|*", webdataset's) takes this for bzip2 and fails; its
    # random-access mode tries a plain tar first, as we do (a valid first header).
    plain = build_tar([("BZh91AY&SY.txt", b"not bzip2"), ("\x1f\x8b.txt", b"not gzip")])
    assert _ours(plain) == with_tarfile(plain, "r:*") == [("BZh91AY&SY.txt", b"not bzip2"), ("\x1f\x8b.txt", b"not gzip")]


@pytest.mark.parametrize("kind", sorted(_COMPRESSORS))
def test_truncated_compressed_shards_raise_naming_the_member(kind):
    plain = build_tar([("a.txt", b"hello"), ("b.bin", random_bytes(100_000, 7))])
    packed = _COMPRESSORS[kind](plain)
    got, error = _read_until_error(packed[: len(packed) // 2], 1 << 20)
    assert got in ([], [("a.txt", b"hello")])  # bzip2 and zstd give nothing of an incomplete block
    assert error.url == URL and error.member in (None, "a.txt", "b.bin") and isinstance(error.offset, int)


def test_zstd_shards_without_zstandard_raise_a_clear_error(monkeypatch):
    monkeypatch.setattr(tar_sources, "zstandard", None)
    packed = _zstd(build_tar([("a.txt", b"hello")]))
    with pytest.raises(ShardOpenError, match=r"zstd-compressed.*pip install zstandard") as caught:
        _ours(packed)
    assert caught.value.url == URL


# ---------------------------------------------------------------- gzip: CRC and length trailers


def _gzip_members(*parts: bytes) -> bytes:
    return b"".join(gzip.compress(part) for part in parts)


@pytest.mark.parametrize(("trailer_byte", "what"), [(-8, "CRC"), (-1, "length")])
def test_a_bad_gzip_trailer_raises_even_after_the_end_of_archive_block(trailer_byte, what):
    plain = build_tar([("a.txt", b"hello"), ("b.txt", b"world")])
    packed = bytearray(gzip.compress(plain))
    packed[trailer_byte] ^= 0x01
    assert with_tarfile(bytes(packed)) == with_tarfile(plain)  # tarfile never looks at the trailer
    got, error = _read_until_error(bytes(packed))
    assert got == with_tarfile(plain)  # the error comes where the trailer is read: after the members
    assert error.url == URL and "gzip" in error.reason


def test_a_gzip_member_with_corrupt_stored_data_fails_its_crc_at_its_end():
    # Level 0 stores the bytes as they are: a flipped byte is valid deflate, only the CRC sees it.
    first = build_tar([("a.txt", b"A" * 2000)])[:-1024]  # the tar without its end-of-archive block
    second = member("b.txt", b"B" * 100) + end_of_archive()
    one = bytearray(gzip.compress(first, compresslevel=0))
    one[one.index(b"A" * 100) + 50] ^= 0x20
    packed = bytes(one) + gzip.compress(second)
    got, error = _read_until_error(packed, 512)
    assert [name for name, _ in got] in ([], ["a.txt"])  # never b.txt: the first member's CRC fails first
    assert "gzip" in error.reason


def test_every_gzip_member_is_checked_in_a_multi_member_shard():
    plain = build_tar([("a.txt", b"hello"), ("b.bin", random_bytes(5000, 8))])
    cut = len(plain) // 2
    packed = bytearray(_gzip_members(plain[:cut], plain[cut:]))
    first_end = len(gzip.compress(plain[:cut]))
    packed[first_end - 5] ^= 0x01  # the first member's CRC
    got, error = _read_until_error(bytes(packed), 512)
    assert "gzip" in error.reason and error.url == URL
    assert len(got) <= 1


def test_zero_padding_after_the_last_gzip_member_is_accepted():
    plain = build_tar([("a.txt", b"hello")])
    assert _ours(gzip.compress(plain) + bytes(3000)) == with_tarfile(plain)


# ---------------------------------------------------------------- tarfile's rules for names and headers


def _regular(name: str, data: bytes) -> bytes:
    return header(name, len(data)) + data + bytes(-len(data) % 512)


def _case_archives() -> dict[str, bytes]:
    """Archives built byte by byte where tarfile's rules are easy to get wrong."""
    ustar_prefixed = header("q" * 90 + ".txt", 3, fmt=tarfile.USTAR_FORMAT)
    ustar_prefixed = patched(ustar_prefixed, 345, b"p" * 80 + b"\0")
    gnu_with_prefix_bytes = patched(header("n.txt", 1), 345, b"pre\0")  # GNU magic: tarfile still joins it
    empty_size = patched(header("e.txt", 0), 124, bytes(12))
    v7_dir = header("olddir/", 0, kind=tarfile.AREGTYPE)
    return {
        "two-gnu-long-names": gnu_long_name("first-" + "a" * 100 + ".txt") + gnu_long_name("second-" + "b" * 100
                                                                                        + ".txt") + _regular("x", b"1"),
        "pax-path-then-long-name": pax_header([("path", "from-pax.txt")]) + gnu_long_name("l" * 120 + ".txt")
        + _regular("x", b"2"),
        "long-name-then-pax-path": gnu_long_name("l" * 120 + ".txt") + pax_header([("path", "from-pax.txt")])
        + _regular("x", b"3"),
        "two-pax-headers": pax_header([("path", "outer.txt")]) + pax_header([("path", "inner.txt"), ("size", "4")])
        + _regular("x", b"4444"),
        "pax-path-with-slashes": pax_header([("path", "dir/file.txt//")]) + _regular("x", b"5"),
        "repeated-pax-key": pax_header([("path", "one.txt"), ("mtime", "1"), ("path", "two.txt")]) + _regular("x", b"6"),
        "solaris-X-header": pax_header([("path", "solaris.txt")], kind=b"X") + _regular("x", b"7"),
        "ustar-prefix": ustar_prefixed + b"pre" + bytes(509),
        "prefix-bytes-in-gnu-header": gnu_with_prefix_bytes + b"n" + bytes(511),
        "empty-size-field": empty_size + _regular("after.txt", b"8"),
        "v7-directory-with-long-name": gnu_long_name("looks-like-a-file.txt") + v7_dir + _regular("f.txt", b"9"),
        "mtime-only-pax-before-each": pax_header([("mtime", "1700000000.5")]) + _regular("m.txt", b"m")
        + pax_header([("mtime", "1700000001.25")]) + _regular("n.txt", b"n"),
        "unknown-type-with-data": header("v.txt", 600, kind=b"V") + random_bytes(1024, 9) + _regular("w.txt", b"w"),
        "long-link-before-a-file": gnu_long_name("target", tarfile.GNUTYPE_LONGLINK) + _regular("k.txt", b"k"),
        "global-pax-without-paths": pax_header([("comment", "hi")], kind=b"g") + _regular("g.txt", b"g"),
    }


@pytest.mark.parametrize("chunk_size", [512, 4096])
@pytest.mark.parametrize("case", sorted(_case_archives()))
def test_members_are_named_and_cut_as_tarfile_names_and_cuts_them(case, chunk_size):
    archive = _case_archives()[case] + end_of_archive()
    expected = with_tarfile(archive)
    assert expected, "the reference read nothing"
    assert _ours(archive, chunk_size) == expected


def _refused_archives() -> dict[str, tuple[bytes, str]]:
    """Archives where tarfile yields something other than their members' bytes, or stops without
    a word: we raise, naming what is wrong, and yield no member tarfile would not."""
    return {
        "global-pax-path": (pax_header([("path", "all.txt")], kind=b"g") + _regular("a.txt", b"1"), "global PAX"),
        "pax-record-of-length-zero": (pax_header(b"0 mtime=1\n") + _regular("a.txt", b"1"), "length 0"),
        "pax-size-not-a-number": (pax_header([("size", "ten")]) + _regular("a.txt", b"1"), "PAX size"),
        "long-name-then-end": (_regular("a.txt", b"1") + gnu_long_name("orphan.txt"), "extended headers"),
        "bad-checksum-later": (_regular("a.txt", b"1") + header("b.txt", 1)[:148] + b"0000001\0"
                               + header("b.txt", 1)[156:] + bytes(512), "checksum"),
        "sparse-realsize-without-map": (pax_header([("GNU.sparse.realsize", "100")]) + _regular("a.txt", b"1"),
                                        "sparse"),
    }


@pytest.mark.parametrize("case", sorted(_refused_archives()))
def test_archives_tarfile_misreads_raise_without_yielding_more_than_tarfile(case):
    body, words = _refused_archives()[case]
    archive = body + end_of_archive()
    try:
        reference = with_tarfile(archive)
    except tarfile.TarError:
        reference = []
    got, error = _read_until_error(archive)
    assert words in str(error) and error.url == URL and isinstance(error.offset, int)
    assert len(got) <= max(len(reference), 1) and got == [("a.txt", b"1")][: len(got)]


def test_a_header_with_unused_number_fields_that_are_not_numbers_is_read_where_tarfile_stops():
    # The documented difference: tarfile parses mode, uid, gid, mtime and the device numbers
    # and, at a header where one is not a number, ends the archive without a word. We use
    # none of them and read on, so the members after it are not lost.
    odd = patched(header("b.txt", 1), 100, b"9x9x9x9\0")  # mode
    archive = _regular("a.txt", b"1") + odd + b"2" + bytes(511) + _regular("c.txt", b"3") + end_of_archive()
    assert with_tarfile(archive) == [("a.txt", b"1")]
    assert _ours(archive) == [("a.txt", b"1"), ("b.txt", b"2"), ("c.txt", b"3")]


def test_a_truncated_ustar_member_error_names_it_with_its_prefix():
    name = "p" * 80 + "/" + "q" * 90 + ".bin"
    archive = build_tar([("a.txt", b"1"), (name, random_bytes(3000, 10))], tarfile.USTAR_FORMAT)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        cut = tar.getmember(name).offset_data + 1000
    got, error = _read_until_error(archive[:cut], 512)
    assert got == [("a.txt", b"1")]
    assert error.member == name and repr(name) in str(error)


# ---------------------------------------------------------------- limits on claims


@pytest.mark.parametrize("compression", ["plain", "gz"])
def test_a_size_field_claiming_more_than_the_limit_raises_before_reading(compression):
    huge = patched(header("huge.bin", 0), 124, b"\x80" + (1 << 60).to_bytes(11, "big"))  # base-256: 1 EiB
    archive = member("a.txt", b"x") + huge + b"tiny" + end_of_archive()
    data = gzip.compress(archive) if compression == "gz" else archive
    with pytest.raises(ShardFormatError, match="max_member_bytes") as caught:
        _ours(data)
    assert caught.value.member == "huge.bin" and caught.value.offset == 1024


def test_a_pax_size_record_of_any_length_ends_in_our_error():
    for size in ["9" * 5000, str(1 << 80), "-5"]:
        archive = pax_header([("size", size)]) + _regular("a.txt", b"1") + end_of_archive()
        with pytest.raises(ShardFormatError):
            _ours(archive)


def test_an_extended_header_longer_than_its_limit_raises():
    archive = gnu_long_name("n" * 5000) + _regular("a.txt", b"1") + end_of_archive()
    assert _ours(archive) == [("n" * 5000, b"1")]
    with pytest.raises(ShardFormatError, match="max_header_bytes"):
        _ours(archive, limits=Limits(max_header_bytes=1000))


def test_a_member_within_the_limit_is_read_whole_in_small_chunks():
    big = random_bytes(3 << 20, 11)
    archive = build_tar([("big.bin", big), ("b.txt", b"after")])
    assert _ours(archive, 4096, limits=Limits(max_member_bytes=3 << 20)) == [("big.bin", big), ("b.txt", b"after")]
    with pytest.raises(ShardFormatError, match="max_member_bytes"):
        _ours(archive, 4096, limits=Limits(max_member_bytes=(3 << 20) - 1))


def test_zlib_stays_the_checker_of_gzip_trailers():
    # The gzip module checks what zlib's inflater checks: a bad CRC is an error (pinned so a
    # change of decompressor that stops checking it fails here).
    data = bytearray(gzip.compress(b"payload"))
    data[-8] ^= 1
    with pytest.raises((OSError, zlib.error)):
        gzip.decompress(bytes(data))
