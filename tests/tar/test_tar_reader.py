"""The sequential tar reader: same members as ``tarfile``, and clear errors on bad archives."""

from __future__ import annotations

import gzip
import io
import itertools
import tarfile
from datetime import timedelta

import pytest
import webdataset as wds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tar_builders import build_tar, random_bytes, time_limit

from wds_datapipes.errors import ShardFormatError
from wds_datapipes.tar import iter_tar_members

URL = "file:///data/shard-000042.tar"
FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
CHUNKS = [512, 1000, 4096]


def _info(name: str, kind: bytes, **fields) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    for field, value in fields.items():
        setattr(info, field, value)
    return info


def _rich_members(fmt: int) -> list:
    """Regular files of many shapes between directories and links, as the format allows."""
    members = [
        ("a.txt", b"hello"),
        _info("dir", tarfile.DIRTYPE),
        ("dir/x.y.z.JPG", random_bytes(700, 1)),
        ("empty.txt", b""),
        ("exact.bin", random_bytes(512, 2)),
        ("big.bin", random_bytes(9000, 3)),  # larger than every chunk size tested
        _info("link.txt", tarfile.SYMTYPE, linkname="a.txt"),
        _info("hard.txt", tarfile.LNKTYPE, linkname="a.txt"),
        _info("olddir/", tarfile.AREGTYPE),  # an old-style (v7) directory entry
        (_info("cont.txt", tarfile.CONTTYPE), b"contiguous"),
        # > 100 characters with a slash where ustar can split it into prefix + name.
        ("p" * 80 + "/" + "q" * 90 + ".txt", b"prefixed"),
        ("dïr/ñame.txt", b"non-ascii"),
        ("last.txt", b"the end"),
    ]
    if fmt != tarfile.USTAR_FORMAT:
        members[5:5] = [
            ("f" * 150 + ".cls", b"long name"),  # GNU: an 'L' record; PAX: a path record
            _info("sym-long", tarfile.SYMTYPE, linkname="t" * 150),  # GNU: a 'K' record
            _info("h" * 120 + ".txt", tarfile.LNKTYPE, linkname="l" * 120),  # 'L' and 'K' records
            ("after-links.txt", b"name not taken from a pending link record"),
        ]
    return members


def _rich_archive(fmt: int) -> bytes:
    options = {"pax_headers": {"comment": "a global header"}} if fmt == tarfile.PAX_FORMAT else {}
    return build_tar(_rich_members(fmt), fmt, **options)


def _with_tarfile(plain: bytes) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(plain), mode="r:") as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar if m.isreg()]


def _ours(data: bytes, chunk_size: int = 4096, stream=None) -> list[tuple[str, bytes]]:
    return list(iter_tar_members(stream if stream is not None else io.BytesIO(data), URL, chunk_size))


def _multi_gzip(plain: bytes, *cuts: int) -> bytes:
    """``plain`` as several concatenated gzip members, split at ``cuts`` (any byte offset)."""
    bounds = [0, *cuts, len(plain)]
    return b"".join(gzip.compress(plain[a:b]) for a, b in itertools.pairwise(bounds))


def _compress(plain: bytes, kind: str) -> bytes:
    if kind == "gz":
        return gzip.compress(plain)
    if kind == "multigz":
        return _multi_gzip(plain, 700, len(plain) // 2)
    return plain


class _ReadOnly:
    """A stream with only ``read`` (no ``readinto``, no ``fileno``), giving at most ``step`` bytes a call."""

    def __init__(self, data: bytes, step: int = 1 << 30):
        self._stream = io.BytesIO(data)
        self._step = step

    def read(self, size: int = -1) -> bytes:
        return self._stream.read(self._step if size < 0 else min(size, self._step))


class _Trickle(_ReadOnly):
    """Short reads through ``readinto``, as pipes and sockets give them."""

    def readinto(self, target) -> int:
        data = self.read(len(target))
        target[: len(data)] = data
        return len(data)


# ---------------------------------------------------------------- same members as tarfile


@pytest.mark.parametrize("chunk_size", CHUNKS)
@pytest.mark.parametrize("compression", ["plain", "gz", "multigz"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_reader_yields_the_regular_files_tarfile_finds(fmt, compression, chunk_size):
    plain = _rich_archive(FORMATS[fmt])
    expected = _with_tarfile(plain)
    assert len(expected) >= 9  # the reference itself saw the files, links and dirs skipped
    assert _ours(_compress(plain, compression), chunk_size) == expected


@pytest.mark.parametrize("fmt", FORMATS)
def test_reader_names_long_prefixed_and_non_ascii_members_as_tarfile_does(fmt):
    names = [name for name, _ in _ours(_rich_archive(FORMATS[fmt]), 512)]
    assert "p" * 80 + "/" + "q" * 90 + ".txt" in names
    assert "dïr/ñame.txt" in names
    assert "cont.txt" in names
    if fmt != "ustar":
        assert "f" * 150 + ".cls" in names
        assert "after-links.txt" in names
    skipped = {"dir", "dir/", "link.txt", "hard.txt", "olddir/", "olddir", "sym-long", "h" * 120 + ".txt"}
    assert not skipped.intersection(names)


@pytest.mark.parametrize("compression", ["plain", "gz", "multigz"])
@pytest.mark.parametrize("stream_kind", ["read-only", "trickle-read", "trickle-readinto"])
def test_reader_needs_only_read_and_copes_with_short_reads(stream_kind, compression):
    plain = _rich_archive(tarfile.GNU_FORMAT)
    data = _compress(plain, compression)
    stream = {
        "read-only": _ReadOnly(data),
        "trickle-read": _ReadOnly(data, step=7),
        "trickle-readinto": _Trickle(data, step=7),
    }[stream_kind]
    assert not hasattr(stream, "fileno")
    assert _ours(data, 1000, stream) == _with_tarfile(plain)


def test_reader_joins_gzip_members_split_anywhere():
    plain = _rich_archive(tarfile.PAX_FORMAT)
    expected = _with_tarfile(plain)
    for cuts in [(1,), (511, 512, 513), tuple(range(100, len(plain), 997))]:
        assert _ours(_multi_gzip(plain, *cuts), 512) == expected


def test_reader_ignores_zero_padding_after_the_last_gzip_member():
    plain = _rich_archive(tarfile.GNU_FORMAT)
    assert _ours(gzip.compress(plain) + bytes(1000), 512) == _with_tarfile(plain)


@pytest.mark.parametrize("compression", ["plain", "gz"])
def test_reader_yields_nothing_for_an_empty_archive(compression):
    plain = build_tar([])
    assert _with_tarfile(plain) == []
    assert _ours(_compress(plain, compression)) == []


@pytest.mark.parametrize("chunk_size", CHUNKS)
def test_reader_reports_an_archive_cut_before_its_end_of_archive_block(chunk_size):
    # tarfile would end quietly here; we cannot tell such a cut from the loss of whole
    # members, so it is reported as truncated, after every complete member was yielded.
    plain = build_tar([("a.txt", b"x" * 100), ("b.bin", random_bytes(3000))])
    with tarfile.open(fileobj=io.BytesIO(plain)) as tar:
        last = tar.getmembers()[-1]
    end = last.offset_data + (last.size + 511) // 512 * 512
    assert plain[end:] == bytes(len(plain) - end)  # only end-of-archive zeros are cut
    got = []
    with pytest.raises(ShardFormatError, match="end-of-archive") as caught:
        for name, data in iter_tar_members(io.BytesIO(plain[:end]), URL, chunk_size):
            got.append((name, data))
    assert got == _with_tarfile(plain)
    assert caught.value.member == "b.bin" and caught.value.offset == end


def test_reader_reads_a_member_far_larger_than_its_chunk():
    big = random_bytes(300_000, 9)
    plain = build_tar([("a.bin", big), ("b.txt", b"after")])
    assert _ours(plain, 512) == [("a.bin", big), ("b.txt", b"after")]
    assert _ours(gzip.compress(plain), 512) == [("a.bin", big), ("b.txt", b"after")]


# ---------------------------------------------------------------- truncated and corrupt archives


def _layout():
    """An archive and its members' header and data offsets, read back with tarfile."""
    long_name = "n" * 130 + ".bin"
    plain = build_tar(
        [("a.txt", b"x" * 100), ("b.bin", random_bytes(3000, 4)), (long_name, random_bytes(2000, 5)), ("c.txt", b"c" * 10)],
        tarfile.GNU_FORMAT,
    )
    with tarfile.open(fileobj=io.BytesIO(plain)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    return plain, members, long_name


def _truncation_cases():
    _, m, long_name = _layout()
    a, b, c, n = m["a.txt"], m["b.bin"], m["c.txt"], m[long_name]
    # (cut, member named in the error or None, error offset or None when not checked)
    return [
        pytest.param(100, None, 0, id="first-header"),
        pytest.param(b.offset + 200, None, b.offset, id="mid-header"),
        pytest.param(b.offset_data, "b.bin", b.offset, id="after-header"),
        pytest.param(b.offset_data + 1500, "b.bin", b.offset, id="mid-data"),
        pytest.param(b.offset_data + 2999, "b.bin", b.offset, id="last-data-byte-missing"),
        # The 'L' record's header is where the long-named member starts.
        pytest.param(n.offset_data + 1000, long_name, None, id="mid-data-gnu-long-name"),
        pytest.param(a.offset_data + 100 + 50, "a.txt", None, id="mid-padding"),
        pytest.param(c.offset_data + 10, "c.txt", None, id="no-padding-at-end"),
    ]


@pytest.mark.parametrize("chunk_size", [*CHUNKS, 1 << 20])
@pytest.mark.parametrize(("cut", "member", "offset"), _truncation_cases())
def test_truncated_archive_raises_shard_format_error_naming_shard_and_member(cut, member, offset, chunk_size):
    plain, _, _ = _layout()
    with pytest.raises(ShardFormatError) as caught:
        _ours(plain[:cut], chunk_size)
    error = caught.value
    assert URL in str(error)
    assert isinstance(error.offset, int)
    if member is not None:
        assert error.member == member
        assert repr(member) in str(error)
    if offset is not None:
        assert error.offset == offset
        assert f"byte {offset}" in str(error)


def test_truncated_webdataset_shard_never_loses_members_silently(tmp_path):
    path = tmp_path / "w.tar"
    with wds.TarWriter(str(path)) as sink:
        for i in range(4):
            sink.write({"__key__": f"k{i}", "cls": str(i).encode(), "txt": b"short"})
    data = path.read_bytes()
    complete = _ours(data)
    silent = []
    for cut in range(1, len(data), 64):
        try:
            members = _ours(data[:cut], 512)
        except ShardFormatError:
            continue
        if members != complete:
            silent.append(cut)
    assert silent == []


def test_truncated_archive_error_says_it_is_truncated():
    plain, m, _ = _layout()
    with pytest.raises(ShardFormatError, match="truncated"):
        _ours(plain[: m["b.bin"].offset_data + 10])
    with pytest.raises(ShardFormatError, match="truncated"):
        _ours(plain[: m["b.bin"].offset + 10])


@pytest.mark.parametrize("chunk_size", [512, 1 << 20])
@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9])
def test_truncated_gzip_stream_raises_shard_format_error_naming_the_shard(fraction, chunk_size):
    plain, _, _ = _layout()
    packed = gzip.compress(plain)
    with pytest.raises(ShardFormatError) as caught:
        _ours(packed[: int(len(packed) * fraction)], chunk_size)
    assert URL in str(caught.value)
    assert isinstance(caught.value.offset, int)


def test_truncated_gzip_stream_inside_a_member_names_that_member():
    plain, m, _ = _layout()
    packed = gzip.compress(plain)
    # b.bin is incompressible: half-way through the compressed stream lies inside its data.
    assert m["b.bin"].offset_data < len(packed) // 2 < m["b.bin"].offset_data + 3000
    with pytest.raises(ShardFormatError) as caught:
        _ours(packed[: len(packed) // 2], 1 << 20)
    assert caught.value.member == "b.bin"


@pytest.mark.parametrize("compression", ["plain", "gz"])
@pytest.mark.parametrize("field_offset", [0, 20, 100, 124, 300, 511])  # name, mode, size, ..., padding
def test_flipped_header_byte_raises_checksum_error_at_that_header(field_offset, compression):
    plain, m, _ = _layout()
    header = m["b.bin"].offset
    corrupt = bytearray(plain)
    corrupt[header + field_offset] ^= 0x41
    with pytest.raises(ShardFormatError, match="checksum") as caught:
        _ours(_compress(bytes(corrupt), compression), 512)
    assert caught.value.offset == header
    assert URL in str(caught.value)


def test_corrupt_gzip_data_raises_shard_format_error():
    packed = bytearray(gzip.compress(_layout()[0]))
    packed[3] = 0xFF  # reserved gzip flag bits
    with pytest.raises(ShardFormatError, match="gzip"):
        _ours(bytes(packed))


# ---------------------------------------------------------------- property: garbage in, our error out


_FUZZ_PLAIN = build_tar(
    [
        ("a.txt", b"hello"),
        _info("d", tarfile.DIRTYPE),
        ("d/x.y.JPG", random_bytes(600, 7)),
        ("ü" * 60 + ".txt", b"pax path"),
        ("e.cls", b"3"),
    ],
    tarfile.PAX_FORMAT,
)
_FUZZ_GNU = build_tar(
    [("g" * 120 + ".txt", b"L record"), _info("s", tarfile.SYMTYPE, linkname="k" * 120), ("z.txt", b"z")]
)
_FUZZ_BASES = {
    "pax": _FUZZ_PLAIN,
    "gnu": _FUZZ_GNU,
    "gz": gzip.compress(_FUZZ_PLAIN),
    "multigz": _multi_gzip(_FUZZ_PLAIN, 900),
}


@st.composite
def _damaged_archives(draw) -> bytes:
    kind = draw(st.sampled_from(["random", "truncated", "flipped", "truncated+flipped"]))
    if kind == "random":
        prefix = draw(st.sampled_from([b"", b"\x1f\x8b", b"\x1f\x8b\x08\x00"]))
        return prefix + draw(st.binary(max_size=2048))
    data = bytearray(_FUZZ_BASES[draw(st.sampled_from(sorted(_FUZZ_BASES)))])
    if "flipped" in kind:
        for _ in range(draw(st.integers(1, 4))):
            position = draw(st.integers(0, len(data) - 1))
            data[position] ^= draw(st.integers(1, 255))
    if "truncated" in kind:
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


@settings(max_examples=300, deadline=timedelta(seconds=2), suppress_health_check=[HealthCheck.too_slow])
@given(data=_damaged_archives(), chunk_size=st.sampled_from(CHUNKS), read_only=st.booleans())
def test_damaged_archive_yields_members_or_raises_shard_format_error(data, chunk_size, read_only):
    stream = _ReadOnly(data, step=333) if read_only else io.BytesIO(data)
    with time_limit(5):
        try:
            for name, value in iter_tar_members(stream, URL, chunk_size):
                assert isinstance(name, str)
                assert isinstance(value, bytes)
        except ShardFormatError as exn:
            assert URL in str(exn)
            assert isinstance(exn.offset, int)


def test_undamaged_fuzz_bases_read_back_as_tarfile_reads_them():
    for name, data in _FUZZ_BASES.items():
        expected = _with_tarfile(_FUZZ_GNU if name == "gnu" else _FUZZ_PLAIN)
        assert len(expected) == (2 if name == "gnu" else 4)
        assert _ours(data, 512) == expected
