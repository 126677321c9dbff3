"""Opening shard URLs as binary streams, chosen by URL scheme through one registry.

Built in: local paths and ``file://``, ``http://`` / ``https://``, and ``pipe:CMD``
(the command's standard output). Other packages add schemes with
:func:`register_opener`, or lazily through the ``wds_datapipes.openers`` entry-point
group (``aisio`` registers ``ais`` that way), so worker processes find them without an
import in user code.
"""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import BinaryIO

from .errors import ShardOpenError

Opener = Callable[[str], BinaryIO]

_OPENERS: dict[str, Opener] = {}


def url_scheme(url: str) -> str:
    """The registry key for ``url``: ``pipe``, the part before ``://``, or ``file``."""
    if url.startswith("pipe:"):
        return "pipe"
    head, sep, _ = url.partition("://")
    if sep and head.isidentifier():
        return head.lower()
    return "file"


def register_opener(scheme: str, opener: Opener) -> None:
    """Open URLs of ``scheme`` with ``opener(url) -> binary stream``; replaces any earlier one."""
    _OPENERS[scheme.lower()] = opener


def _opener_for(url: str) -> Opener:
    scheme = url_scheme(url)
    opener = _OPENERS.get(scheme)
    if opener is None:
        for ep in entry_points(group="wds_datapipes.openers"):
            if ep.name == scheme:
                register_opener(scheme, ep.load())
                opener = _OPENERS[scheme]
                break
    if opener is None:
        known = ", ".join(sorted(_OPENERS))
        raise ShardOpenError(url, f"no opener for scheme {scheme!r} (known: {known})")
    return opener


def open_shard(url: str) -> BinaryIO:
    """Open ``url`` for sequential binary reading; failures raise :class:`ShardOpenError`."""
    opener = _opener_for(url)
    try:
        return opener(url)
    except ShardOpenError:
        raise
    except (OSError, ValueError) as exn:
        raise ShardOpenError(url, f"{type(exn).__name__}: {exn}") from exn


def local_path(url: str) -> str:
    """The filesystem path of a local URL (``file://`` removed)."""
    return url.removeprefix("file://")


def _open_file(url: str) -> BinaryIO:
    # Unbuffered: the tar reader asks for large blocks and keeps its own buffer.
    return open(local_path(url), "rb", buffering=0)


def _open_http(url: str) -> BinaryIO:
    try:
        return urllib.request.urlopen(url)
    except urllib.error.HTTPError as exn:
        raise ShardOpenError(url, f"HTTP {exn.code} {exn.reason}") from exn


class _CommandStream:
    """The standard output of a shell command; closing it checks the exit status."""

    def __init__(self, url: str):
        self.url = url
        self._proc = subprocess.Popen(url[len("pipe:"):], shell=True, stdout=subprocess.PIPE)

    def read(self, size: int = -1) -> bytes:
        return self._proc.stdout.read(size)

    def readinto(self, buffer) -> int:
        return self._proc.stdout.readinto(buffer)

    def close(self) -> None:
        if self._proc.stdout.closed:
            return
        self._proc.stdout.close()
        status = self._proc.wait()
        # A reader that stops early closes the pipe; the command then dies of SIGPIPE.
        if status not in (0, -13, 141):
            raise ShardOpenError(self.url, f"command exited with status {status}")



register_opener("file", _open_file)
register_opener("http", _open_http)
register_opener("https", _open_http)
register_opener("pipe", _CommandStream)
