"""A bounded, seeded fuzz of real shards: bit flips, truncations, huge and wrong size fields,
odd typeflags, mangled PAX records and gzip damage. Whatever the damage, the reader raises
only our errors, never hangs, and never yields a member that tarfile (webdataset's reader)
does not yield with the same bytes: what it yields is a prefix of tarfile's members.

The documented differences (docs/security.md), where both readers agree on
the members both yield, and ours may yield more:

- a flipped bit inside the compressed bytes of a .tar.gz makes zlib yield wrong bytes
  until it notices, at the latest at the gzip member's CRC. tarfile reads further ahead,
  so it may notice a few members before us; ours then ends in the error.
- a header whose checksum holds but whose mode, uid, gid, mtime or device numbers are not
  numbers (two flips whose sums cancel): tarfile stops there; we do not use those fields
  and read on.
- a PAX sparse member is named by its GNU.sparse.name, as GNU tar names it, where tarfile
  takes a "path" record that follows it (the reference here names it as we do).
"""

from __future__ import annotations

import gzip
import io
import random
import tarfile

import pytest
import webdataset as wds
from tar_builders import (
    build_tar,
    end_of_archive,
    member,
    random_bytes,
    sparse_member,
    time_limit,
    with_checksum,
)

from wds_datapipes import Limits, WdsError
from wds_datapipes.tar import iter_tar_members

URL = "http://host/fuzz/shard.tar"
CASES_PER_BASE = 400
SEED = 20261122
# Members above this are neither read by the reference nor by us (ours raises on them).
LIMITS = Limits(max_member_bytes=4 << 20, max_header_bytes=64 << 10)


def _webdataset_shard() -> bytes:
    out = io.BytesIO()
    with wds.TarWriter(out) as sink:
        for i in range(5):
            sink.write({"__key__": f"sample{i:03d}", "cls": str(i).encode(), "txt": f"caption {i}".encode(),
                        "bin": random_bytes(700 + 300 * i, i)})
    return out.getvalue()


def _gnu_shard() -> bytes:
    link = tarfile.TarInfo("link.txt")
    link.type, link.linkname = tarfile.SYMTYPE, "k" * 120
    folder = tarfile.TarInfo("dir")
    folder.type = tarfile.DIRTYPE
    return build_tar([("a.txt", b"hello"), folder, ("dir/" + "g" * 120 + ".bin", random_bytes(1500, 7)), link,
                      ("z.cls", b"3")], tarfile.GNU_FORMAT)


def _pax_shard() -> bytes:
    return build_tar([("ü" * 60 + ".txt", b"pax path"), ("p" * 80 + "/" + "q" * 60 + ".bin", random_bytes(900, 8)),
                      ("e.cls", b"4")], tarfile.PAX_FORMAT, pax_headers={"comment": "a global header"})


def _sparse_shard() -> bytes:
    pieces = [(0, random_bytes(600, 9)), (4096, random_bytes(700, 10))] + [(9000 + 1000 * i, b"s" * 10)
                                                                           for i in range(26)]
    return (member("a.txt", b"x") + sparse_member("old GNU", "old.bin", pieces, 40_000)
            + sparse_member("PAX 1.0", "one.bin", pieces, 40_000) + sparse_member("PAX 0.1", "zero.bin", pieces, 40_000)
            + member("z.txt", b"z") + end_of_archive())


_PLAIN_BASES = {"webdataset": _webdataset_shard(), "gnu": _gnu_shard(), "pax": _pax_shard(), "sparse": _sparse_shard()}


def _headers(archive: bytes) -> list[tuple[int, int, int]]:
    """(offset, typeflag, size) of every header block of ``archive`` (extended ones included)."""
    found = []
    pos = 0
    while pos + 512 <= len(archive) and archive[pos : pos + 512] != bytes(512):
        block = archive[pos : pos + 512]
        size = int(block[124:136].split(b"\0")[0].strip() or b"0", 8)
        found.append((pos, block[156], size))
        data = 0 if block[156] in b"123456" else size
        if block[156] == ord("S"):  # old GNU sparse: extension blocks, then the stored data
            extended = block[482]
            while extended and pos + 1024 <= len(archive):
                pos += 512
                extended = archive[pos + 504]
        pos += 512 + (data + 511) // 512 * 512
    return found


# ---------------------------------------------------------------- mutations


def _flip_bits(rng: random.Random, data: bytearray) -> str:
    for _ in range(rng.randint(1, 4)):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return "bit flips"


def _truncate(rng: random.Random, data: bytearray) -> str:
    del data[rng.randrange(len(data)) :]
    return "truncation"


def _header_field(rng: random.Random, data: bytearray, headers) -> str:
    offset, _, size = rng.choice(headers)
    block = bytearray(data[offset : offset + 512])
    choice = rng.randrange(4)
    if choice == 0:  # a huge size, octal or base-256
        huge = rng.choice([8**11 - 1, 1 << 40, 1 << 62, 10**30])
        block[124:136] = b"%011o\0" % huge if huge < 8**11 else b"\x80" + (huge % (1 << 88)).to_bytes(11, "big")
        kind = "huge size"
    elif choice == 1:  # a wrong size: the stream goes out of step
        block[124:136] = b"%011o\0" % rng.randint(0, 2 * size + 2048)
        kind = "wrong size"
    elif choice == 2:
        block[156] = ord(rng.choice("0125xXgLKSV7\0"))
        kind = "typeflag"
    else:
        block[124:136] = rng.choice([bytes(12), b"   \0        ", b"0" * 12, b"-1\0" + bytes(9)])
        kind = "odd size text"
    data[offset : offset + 512] = with_checksum(block)
    return kind


def _pax_data(rng: random.Random, data: bytearray, headers) -> str:
    extended = [(o, s) for o, flag, s in headers if flag in b"xgL"]
    if not extended:
        return _flip_bits(rng, data)
    offset, size = rng.choice(extended)
    start = offset + 512
    record = rng.choice([b"0 path=x\n", b"30 size=99999999999999999999\n", b"12 path=a/\n", b"18 size=-5\n",
                         b"99999999999999999999 mtime=1\n", b"20 GNU.sparse.size=5\n", b"9 x\n",
                         b"25 GNU.sparse.major=1\n", b"13 size=abc\n"])
    at = start + rng.randrange(max(1, size))
    data[at : at + len(record)] = record
    return "PAX record"


def _gzip_damage(rng: random.Random, packed: bytearray) -> str:
    choice = rng.randrange(3)
    if choice == 0:
        packed[rng.randrange(10, len(packed))] ^= 1 << rng.randrange(8)
        return "gzip bit flip"
    if choice == 1:
        packed[rng.randrange(len(packed) - 8, len(packed))] ^= 0xFF
        return "gzip trailer"
    del packed[rng.randrange(len(packed)) :]
    return "gzip truncation"


def _cases():
    rng = random.Random(SEED)
    for base_name, plain in _PLAIN_BASES.items():
        headers = _headers(plain)
        for i in range(CASES_PER_BASE):
            data = bytearray(plain)
            kind = rng.choice([_flip_bits, _truncate, _header_field, _header_field, _pax_data])
            what = kind(rng, data, headers) if kind in (_header_field, _pax_data) else kind(rng, data)
            if i % 3 == 0:  # a third of the cases travel gzipped, some with damage to the gzip itself
                packed = bytearray(gzip.compress(bytes(data), compresslevel=rng.choice([0, 6])))
                if rng.random() < 0.5:
                    what += " + " + _gzip_damage(rng, packed)
                data = packed
            yield base_name, what, bytes(data)


# ---------------------------------------------------------------- the two readers


def _tarfile_reads(data: bytes) -> tuple[list[tuple[str, bytes]], bool]:
    """tarfile's members, and whether it read the archive whole.

    Random-access mode ("r:*"): it parses headers as the stream mode webdataset uses
    ("r|*") does, but its stream mode skips a huge size block by block, for minutes.
    """
    got = []
    try:
        with time_limit(5), tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            for info in tar:
                if not info.isreg():
                    continue
                if info.size > LIMITS.max_member_bytes:  # tarfile would build it whole: stop here
                    return got, False
                # The documented difference: a sparse member is named by GNU.sparse.name, as
                # GNU tar names it, whatever "path" record the damage made after it.
                got.append((info.pax_headers.get("GNU.sparse.name", info.name), tar.extractfile(info).read()))
    except Exception:  # noqa: BLE001 - anything tarfile raises (or a hang) ends its reading
        return got, False
    return got, True


def _ours(data: bytes) -> tuple[list[tuple[str, bytes]], BaseException | None]:
    got = []
    try:
        with time_limit(5):
            got.extend(iter_tar_members(io.BytesIO(data), URL, 4096, limits=LIMITS))
    except Exception as exn:  # noqa: BLE001 - the test checks what it is
        return got, exn
    return got, None


def _unused_fields_unreadable(data: bytes) -> bool:
    """Whether a header block of ``data`` (gunzipped) has a valid checksum and a mode, uid,
    gid, mtime or device number that tarfile cannot read."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except Exception:  # noqa: BLE001 - damaged: nothing to look at
            return False
    for pos in range(0, len(data) - 511, 512):
        block = data[pos : pos + 512]
        try:
            if tarfile.nti(block[148:156]) not in tarfile.calc_chksums(block):
                continue
        except tarfile.HeaderError:
            continue
        for start, end in [(100, 108), (108, 116), (116, 124), (136, 148), (329, 337), (337, 345)]:
            try:
                tarfile.nti(block[start:end])
            except tarfile.HeaderError:
                return True
    return False


def test_the_fuzz_bases_read_back_as_tarfile_reads_them():
    for name, plain in _PLAIN_BASES.items():
        expected, whole = _tarfile_reads(plain)
        assert whole and len(expected) >= 3, name
        assert _ours(plain) == (expected, None), name
        assert _ours(gzip.compress(plain)) == (expected, None), name


@pytest.mark.parametrize("base", sorted(_PLAIN_BASES))
def test_damaged_shards_raise_only_our_errors_and_never_yield_what_tarfile_does_not(base):
    kinds: dict[str, int] = {}
    for base_name, what, data in _cases():
        if base_name != base:
            continue
        kinds[what.split(" + ")[0]] = kinds.get(what.split(" + ")[0], 0) + 1
        ours, error = _ours(data)
        reference, whole = _tarfile_reads(data)
        context = f"{base}: {what}, {len(data)} bytes; ours {len(ours)} members ({error!r}), tarfile {len(reference)}"
        assert error is None or isinstance(error, WdsError), context
        if error is not None:
            assert error.url == URL, context
        if "gzip bit flip" in what:  # the documented differences: both agree as far as both read
            assert ours[: len(reference)] == reference[: len(ours)], context
            assert len(ours) <= len(reference) or error is not None, context
            continue
        if _unused_fields_unreadable(data):
            assert ours[: len(reference)] == reference[: len(ours)], context
            continue
        assert ours == reference[: len(ours)], context  # the same names and bytes, never more members
        if error is None and whole:
            assert ours == reference, context
    assert len(kinds) >= 4, kinds  # every kind of damage was tried
