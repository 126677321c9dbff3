"""Opening shard URLs as binary streams, chosen by URL scheme through one registry.

Built in: local paths, ``file:`` URLs (``file:///abs``, ``file://localhost/abs``,
``file://relative``), ``http://`` / ``https://`` (resuming dropped
connections, see :mod:`wds_datapipes.shards.http_stream`), and ``pipe:CMD`` (the command's
standard output). Other packages add schemes with
:func:`register_opener`, or lazily through the ``wds_datapipes.openers`` entry-point
group (``aisio`` registers ``ais`` that way), so worker processes find them without an
import in user code.
"""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import BinaryIO

from ..errors import ShardOpenError, WdsError, shard_error
from ..limits import Limits, get_limits
from .http_stream import HttpStream

# opener(url) -> stream, or opener(url, start=n) -> stream positioned at byte n.
Opener = Callable[..., BinaryIO]

_OPENERS: dict[str, Opener] = {}


class ShardUrl(str):
    """A shard URL as ``load_tar`` yields it: equal to the URL, and one object per opening.

    ``group_by_key`` tells two readings of the same shard in a row apart by this object's
    identity, whatever pipes stand between it and ``load_tar``. ``cut`` says that this
    reading ended in an error a handler skipped: the sample then being assembled may
    lack fields, and ``group_by_key`` drops it.
    """

    cut = False

    @staticmethod
    def opened(url: str) -> ShardUrl:
        """A new object for one opening of ``url`` (a :class:`LocalPath` stays one)."""
        if isinstance(url, LocalPath):
            return LocalPath(local_path(url), url[: url.prefix_length])
        return ShardUrl(url)


class LocalPath(ShardUrl):
    """A path found on disk (by a glob, a directory listing or an index): always a local file.

    Only what a user literally writes may be a ``pipe:`` command or another URL. A file
    named ``pipe:touch x #.tar`` that a glob finds is still a file: :func:`url_scheme`
    answers ``file`` for a LocalPath, whatever its text says. Its text may keep the
    ``file://`` the user's spec began with; :func:`local_path` removes exactly that.
    """

    def __new__(cls, path: str, prefix: str = ""):
        self = super().__new__(cls, prefix + path)
        self.prefix_length = len(prefix)
        return self

    def __reduce__(self) -> tuple:
        return LocalPath, (self[self.prefix_length :], self[: self.prefix_length])


def url_scheme(url: str) -> str:
    """The registry key for ``url``: ``pipe``, the part before ``://``, or ``file``."""
    if isinstance(url, LocalPath):
        return "file"
    if url.startswith("pipe:"):
        return "pipe"
    head, sep, _ = url.partition("://")
    if sep and head.isidentifier():
        return head.lower()
    return "file"


def register_opener(scheme: str, opener: Opener) -> None:
    """Open URLs of ``scheme`` with ``opener(url) -> binary stream``; replaces any earlier one.

    An opener that also takes a keyword ``start`` (``opener(url, start=n)``) returns the
    stream from byte ``n`` (a seek, or an HTTP Range request): readers that start in the
    middle of a shard (resumed epochs, with a shard index) then skip nothing. Openers
    without it still work: the bytes before ``n`` are read and dropped. An opener that
    takes a keyword ``limits`` gets the pipe's :class:`~wds_datapipes.limits.Limits`
    (timeouts, retries).
    """
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


def open_shard(url: str, start: int = 0, limits: Limits | None = None) -> BinaryIO:
    """Open ``url`` for sequential binary reading from byte ``start``; failures raise
    :class:`ShardOpenError` (whatever the opener raised)."""
    opener = _opener_for(url)
    options = {"limits": limits or get_limits()} if _takes(opener, "limits") else {}
    try:
        if start and _takes(opener, "start"):
            return opener(url, start=start, **options)
        stream = opener(url, **options)
        if start:
            _skip(stream, start, url)
        return stream
    except WdsError:
        raise
    except Exception as exn:
        error = shard_error(exn, url)
        raise ShardOpenError(url, error.reason) from exn


def _takes(opener: Opener, keyword: str) -> bool:
    try:
        return keyword in inspect.signature(opener).parameters
    except (TypeError, ValueError):  # a builtin or a class without a signature
        return False


def _skip(stream: BinaryIO, count: int, url: str) -> None:
    """Moves ``stream`` ``count`` bytes on: a seek where it can, else reads and drops."""
    seekable = getattr(stream, "seekable", None)
    if seekable is not None and seekable():
        stream.seek(count, os.SEEK_CUR)
        return
    while count > 0:
        chunk = stream.read(min(count, 1 << 20))
        if not chunk:
            raise ShardOpenError(url, f"the stream ends before byte {count} that the read starts at")
        count -= len(chunk)


def stream_size(stream: BinaryIO) -> int | None:
    """The whole object's size in bytes where the stream tells it (local files, HTTP), else None."""
    fileno = getattr(stream, "fileno", None)
    if fileno is not None:
        try:
            return os.fstat(fileno()).st_size
        except (OSError, ValueError, AttributeError):
            pass
    headers = getattr(stream, "headers", None)
    if headers is not None:
        whole = (headers.get("Content-Range") or "").rpartition("/")[2]
        length = whole if whole.isdigit() else headers.get("Content-Length")
        if length is not None and str(length).isdigit():
            return int(length)
    return None


def local_path(url: str) -> str:
    """The filesystem path of a local URL (a :class:`LocalPath` as it is).

    ``file:///abs`` and ``file://localhost/abs`` name ``/abs``; ``file://rel`` and
    ``file:rel`` name the relative path ``rel``. The rest of the text is the path as
    written: ``?``, ``#`` and ``%xx`` are file-name characters here.
    """
    if isinstance(url, LocalPath):
        return str.__str__(url)[url.prefix_length :]
    if url.startswith("file://localhost/"):
        return url[len("file://localhost") :]
    if url.startswith("file://"):
        return url[len("file://") :]
    return url.removeprefix("file:")


def _open_file(url: str, start: int = 0) -> BinaryIO:
    # Unbuffered: the tar reader asks for large blocks and keeps its own buffer.
    stream = open(local_path(url), "rb", buffering=0)  # noqa: SIM115 - the caller closes it
    if start:
        stream.seek(start)
    return stream


def _open_http(url: str, start: int = 0, limits: Limits | None = None) -> BinaryIO:
    return HttpStream(url, start, limits)


class _CommandStream:
    """The standard output of a shell command; closing it checks the exit status.

    A command still running ``limits.pipe_grace`` seconds after its output was closed
    (read to the end, or closed early by the reader) is stopped, with the commands it
    started, and reported: it would otherwise hold the epoch forever.
    """

    def __init__(self, url: str, limits: Limits | None = None):
        self.url = url
        self.grace = (limits or get_limits()).pipe_grace
        # Its own session and process group, so that stopping it reaches what its shell started.
        self._proc = subprocess.Popen(url[len("pipe:"):], shell=True, stdout=subprocess.PIPE,
                                      start_new_session=True)

    def read(self, size: int = -1) -> bytes:
        return self._proc.stdout.read(size)

    def readinto(self, buffer) -> int:
        return self._proc.stdout.readinto(buffer)

    def close(self) -> None:
        if self._proc.stdout.closed:
            return
        self._proc.stdout.close()
        try:
            status = self._proc.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            self._stop()
            raise ShardOpenError(self.url, f"the command was still running {self.grace:g} s after its output "
                                           "was closed (Limits.pipe_grace); it was stopped") from None
        # A reader that stops early closes the pipe; the command then dies of SIGPIPE.
        if status not in (0, -13, 141):
            raise ShardOpenError(self.url, f"command exited with status {status}")

    def _stop(self) -> None:
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._proc.wait()



register_opener("file", _open_file)
register_opener("http", _open_http)
register_opener("https", _open_http)
register_opener("pipe", _CommandStream)
