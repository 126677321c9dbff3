"""GNU tar as an oracle: every shard a writer test leaves is listed and extracted by GNU tar,
and what it finds must be what Python's tarfile finds (names, sizes, bytes, in order)."""

from __future__ import annotations

import codecs
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

# The suffixes both GNU tar (through gzip, bzip2, xz) and tarfile read without an extra package.
SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
_SEP = b"\n--wds-gnu-tar-next--\n"


def shards_under(folder: Path) -> list[Path]:
    """The shard files under ``folder`` (not ``.part`` files, not links)."""
    found = []
    for root, _, names in os.walk(folder):
        found += [Path(root) / n for n in names if n.endswith(SUFFIXES) and not os.path.islink(Path(root) / n)]
    return sorted(found)


def _tarfile_view(path: Path) -> tuple[list[tuple[bytes, int]], bytes] | None:
    """(name bytes, size) of each regular member, and their data concatenated; None where
    tarfile cannot read the file (not a shard a writer left whole: another test's concern)."""
    try:
        with tarfile.open(path) as tar:
            members, data = [], []
            for member in tar:
                if member.isreg():
                    members.append((member.name.encode("utf-8", "surrogateescape"), member.size))
                    data.append(tar.extractfile(member).read())
            return members, b"".join(data)
    except (tarfile.TarError, OSError, EOFError):
        return None


def check_with_gnu_tar(paths: list[Path]) -> int:
    """Asserts that GNU tar lists and extracts each of ``paths`` as tarfile reads it: two tar
    runs a shard, all in one shell (C locale: names come back octal-escaped, so any byte
    round-trips). Skips files tarfile cannot read; returns how many shards were compared."""
    views = {p: v for p in paths if (v := _tarfile_view(p)) is not None}
    if not views:
        return 0
    if shutil.which("tar") is None:
        assert not os.environ.get("CI"), "GNU tar is missing"
        return 0
    script = "".join(f'tar --quoting-style=escape --numeric-owner -tvf "$1" && printf "{_SEP.decode()!s}" && '
                     f'tar -xOf "$1" && printf "{_SEP.decode()!s}"; shift; '.replace("\n", "\\n")
                     for _ in views)
    done = subprocess.run(["sh", "-c", script, "sh", *map(str, views)], capture_output=True, timeout=120, check=False,
                          env={**os.environ, "LC_ALL": "C"})
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    parts = done.stdout.split(_SEP)
    assert len(parts) == 2 * len(views) + 1, done.stderr.decode(errors="replace")
    for number, (path, (members, data)) in enumerate(views.items()):
        listing, extracted = parts[2 * number], parts[2 * number + 1]
        seen = []
        for line in listing.decode("ascii").splitlines():
            fields = line.split(None, 5)  # mode, uid/gid, size, date, time, name
            if fields[0].startswith("-"):
                seen.append((codecs.escape_decode(fields[5].encode("ascii"))[0], int(fields[2])))
        assert seen == members, f"GNU tar lists {path} otherwise than tarfile"
        assert extracted == data, f"GNU tar extracts other bytes from {path} than tarfile"
    return len(views)
