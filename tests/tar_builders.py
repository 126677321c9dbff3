"""Byte-level tar builders for the tests: archives tarfile's writer cannot make (sparse members,
repeated or odd PAX records, hand-set header fields), each checked against tarfile's reader."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import random
import shutil
import signal
import subprocess
import tarfile

BLOCK = 512
SPARSE_VERSIONS = ["old GNU", "PAX 0.0", "PAX 0.1", "PAX 1.0"]


def random_bytes(n: int, seed: int = 0) -> bytes:
    """Incompressible bytes that end in a non-zero byte (zero blocks mean end-of-archive)."""
    return random.Random(seed).randbytes(n - 1) + b"\xff" if n else b""


@contextlib.contextmanager
def time_limit(seconds: int):
    """Raise TimeoutError in the main thread when the block runs longer than ``seconds``."""
    def expired(signum, frame):
        raise TimeoutError(f"ran for more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def build_tar(members, fmt: int = tarfile.GNU_FORMAT, **tar_options) -> bytes:
    """Archive bytes written by ``tarfile``: ``(name | TarInfo, data)`` pairs or bare ``TarInfo``s."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt, **tar_options) as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
                continue
            info, data = member
            info = tarfile.TarInfo(info) if isinstance(info, str) else info
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def with_tarfile(archive: bytes, mode: str = "r|*") -> list[tuple[str, bytes]]:
    """(name, bytes) of each regular member as tarfile (and so webdataset) reads them."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode=mode) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar if m.isreg()]


def padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % BLOCK)


def end_of_archive() -> bytes:
    return bytes(2 * BLOCK)


def with_checksum(block: bytes | bytearray) -> bytes:
    """The header block with its checksum field recomputed (as tar writes it)."""
    block = bytearray(block)
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def header(name: str, size: int, kind: bytes = tarfile.REGTYPE, fmt: int = tarfile.GNU_FORMAT, **fields) -> bytes:
    """One header block as tarfile writes it (``fields``: TarInfo attributes)."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.type = kind
    for key, value in fields.items():
        setattr(info, key, value)
    return info.tobuf(fmt, "utf-8", "surrogateescape")


def patched(block: bytes, at: int, value: bytes) -> bytes:
    """``block`` with ``value`` written at byte ``at``, its checksum made right again."""
    block = bytearray(block)
    block[at : at + len(value)] = value
    return with_checksum(block)


def member(name: str, data: bytes, kind: bytes = tarfile.REGTYPE) -> bytes:
    """A GNU-format header and its padded data (for names of up to 100 characters)."""
    return header(name, len(data), kind) + padded(data)


def pax_record(key: str, value: str) -> bytes:
    """One PAX record, ``"<length> <key>=<value>\\n"``, its length counting itself."""
    body = f" {key}={value}\n".encode("utf-8", "surrogateescape")
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length = len(str(length)) + len(body)
    return str(length).encode() + body


def pax_header(records: list[tuple[str, str]] | bytes, kind: bytes = tarfile.XHDTYPE) -> bytes:
    """A PAX extended (or, with ``kind=b"g"``, global) header with these records, padded."""
    data = records if isinstance(records, bytes) else b"".join(pax_record(k, v) for k, v in records)
    return header("././@PaxHeader", len(data), kind, tarfile.USTAR_FORMAT) + padded(data)


def gnu_long_name(name: str, kind: bytes = tarfile.GNUTYPE_LONGNAME) -> bytes:
    data = name.encode("utf-8", "surrogateescape") + b"\0"
    return header("././@LongLink", len(data), kind) + padded(data)


# ---------------------------------------------------------------- GNU sparse members


def sparse_content(pieces: list[tuple[int, bytes]], real_size: int) -> bytes:
    """The bytes of a sparse file: zeros, with each piece at its offset."""
    out = bytearray(real_size)
    for offset, data in pieces:
        out[offset : offset + len(data)] = data
    return bytes(out)


def _octal12(n: int) -> bytes:
    return b"%011o\0" % n


def sparse_member(version: str, name: str, pieces: list[tuple[int, bytes]], real_size: int,
                  size_record: bool = False) -> bytes:
    """A sparse member (its headers and data) as GNU tar writes it in ``version``'s format.

    ``pieces`` are (offset, bytes) in order; the holes between them read as zeros.
    ``size_record`` (PAX versions): the stored size goes into a PAX ``size`` record, as GNU
    tar writes it for 8 GiB or more, and the ustar size field holds 0.
    """
    stored = b"".join(data for _, data in pieces)
    spans = [(offset, len(data)) for offset, data in pieces]
    if version == "old GNU":
        block = bytearray(header(name, len(stored), tarfile.GNUTYPE_SPARSE))
        first, rest = spans[:4], spans[4:]
        for i, (offset, length) in enumerate(first):
            block[386 + 24 * i : 410 + 24 * i] = _octal12(offset) + _octal12(length)
        block[482] = 1 if rest else 0
        block[483:495] = _octal12(real_size)
        out = with_checksum(block)
        while rest:
            more, rest = rest[:21], rest[21:]
            extension = bytearray(BLOCK)
            for i, (offset, length) in enumerate(more):
                extension[24 * i : 24 * i + 24] = _octal12(offset) + _octal12(length)
            extension[504] = 1 if rest else 0
            out += bytes(extension)
        return out + padded(stored)
    def with_size(records: list[tuple[str, str]], data: bytes, name: str) -> bytes:
        ustar = tarfile.USTAR_FORMAT  # as GNU tar's posix format: it reads PAX records only before these
        if size_record:
            return pax_header([*records, ("size", str(len(data)))]) + header(name, 0, fmt=ustar) + padded(data)
        return pax_header(records) + header(name, len(data), fmt=ustar) + padded(data)

    if version == "PAX 0.0":
        records = [("GNU.sparse.size", str(real_size)), ("GNU.sparse.numblocks", str(len(spans)))]
        for offset, length in spans:
            records += [("GNU.sparse.offset", str(offset)), ("GNU.sparse.numbytes", str(length))]
        return with_size(records, stored, name)
    if version == "PAX 0.1":
        records = [("GNU.sparse.size", str(real_size)), ("GNU.sparse.numblocks", str(len(spans))),
                   ("GNU.sparse.map", ",".join(f"{o},{n}" for o, n in spans))]
        return with_size(records, stored, name)
    if version == "PAX 1.0":
        records = [("GNU.sparse.major", "1"), ("GNU.sparse.minor", "0"), ("GNU.sparse.name", name),
                   ("GNU.sparse.realsize", str(real_size))]
        sparse_map = padded(b"".join(b"%d\n" % n for n in [len(spans), *(x for span in spans for x in span)]))
        return with_size(records, sparse_map + stored, f"./GNUSparseFile.0/{name}"[:99])
    raise ValueError(version)


# ---------------------------------------------------------------- GNU tar, the other oracle

# Run by GNU tar (through sh) for each regular member it extracts: a line with the shell's
# pid and the member's name, then cat (exec'd: one process a member) writes its bytes to d<pid>.
_TO_COMMAND = 'printf "%s %s\\n" "$$" "$TAR_FILENAME" >> "$WDS_ORACLE/log"; exec cat > "$WDS_ORACLE/d$$"'


@functools.lru_cache(maxsize=1)
def gnu_tar() -> str | None:
    """The path of GNU tar, or None where there is none (then the tests that need it skip)."""
    path = shutil.which("tar")
    if path is None:
        return None
    version = subprocess.run([path, "--version"], capture_output=True, text=True, check=False, timeout=30).stdout
    return path if "GNU tar" in version else None


def with_gnu_tar(archive: bytes, folder: str) -> tuple[int, list[tuple[str, bytes]], str]:
    """(exit status, (name, bytes) of each regular member, stderr) as GNU tar extracts them.

    GNU tar's ``--to-command`` hands each regular file it extracts (sparse ones expanded,
    hard links and other kinds not) to a command, in archive order; a member cut short by
    the end of the stream comes with the bytes GNU tar got. Names hold no newline.
    """
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "archive.tar")
    with open(path, "wb") as out:
        out.write(archive)
    log = os.path.join(folder, "log")
    if os.path.exists(log):
        os.remove(log)
    done = subprocess.run([gnu_tar() or "tar", "-xf", path, f"--to-command={_TO_COMMAND}"], capture_output=True,
                          env={**os.environ, "WDS_ORACLE": folder, "LC_ALL": "C"}, check=False, timeout=60)
    members = []
    if os.path.exists(log):
        with open(log, "rb") as lines:
            entries = [line.rstrip(b"\n").split(b" ", 1) for line in lines]
        assert len({pid for pid, _ in entries}) == len(entries), "a pid came back: repeat the test"
        for pid, name in entries:
            with open(os.path.join(folder, "d" + pid.decode()), "rb") as member:
                members.append((name.decode("utf-8", "surrogateescape"), member.read()))
            os.remove(os.path.join(folder, "d" + pid.decode()))
    return done.returncode, members, done.stderr.decode("utf-8", "replace")
