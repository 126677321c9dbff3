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
import select
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import BinaryIO

from ..errors import ShardOpenError, ShardReadError, WdsError, shard_error
from ..limits import Limits, get_limits
from ..storage.backend import Backend
from ..storage.resuming import content_range, skip
from .http_stream import HttpStream

# opener(url) -> stream, or opener(url, start=n) -> stream positioned at byte n.
Opener = Callable[..., BinaryIO]

_BACKENDS: dict[str, Backend] = {}

# What stands between the openers and the readers: layer(url, start, limits, open_source) -> stream,
# where open_source(url, start, limits) opens through the registry. The shard cache installs
# itself here (wds_datapipes.shards.cache), so no scheme needs an if for it.
StreamLayer = Callable[[str, int, "Limits | None", Callable[..., BinaryIO]], BinaryIO]
_layer: StreamLayer | None = None


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


def plain_url(url: str) -> str:
    """What a sample carries in ``__url__``: a plain ``str``, as webdataset's samples do, that
    opens the same shard again. A path found on disk whose text reads as a ``pipe:`` command
    or another URL (``pipe:touch x #.tar``) becomes its absolute path: handed back to a
    lister, it is still the file."""
    plain = str(url)
    if isinstance(url, LocalPath) and url_scheme(plain) != "file":
        return os.path.abspath(local_path(url))
    return plain


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

    The shorthand of :func:`register_backend` for a scheme that only opens. An opener that
    also takes a keyword ``start`` (``opener(url, start=n)``) returns the stream from byte
    ``n`` (a seek, or an HTTP Range request): readers that start in the middle of a shard
    (resumed epochs, with a shard index) then skip nothing. Openers without it still work:
    the bytes before ``n`` are read and dropped. An opener that takes a keyword ``limits``
    gets the pipe's :class:`~wds_datapipes.limits.Limits` (timeouts, retries). An opener's
    ``source_stamp(url, limits)`` attribute, where it has one, is the back end's ``stamp``.
    """
    scheme = scheme.lower()
    register_backend(Backend(scheme, opener, stamp=getattr(opener, "source_stamp", None)), replace=True)


def register_backend(backend: Backend, *, replace: bool = False) -> None:
    """Register ``backend`` for its scheme; a scheme already taken raises unless ``replace``."""
    if not replace and backend.scheme in _BACKENDS and _BACKENDS[backend.scheme] != backend:
        raise ValueError(f"the scheme {backend.scheme!r} has a back end already (replace=True replaces it)")
    _BACKENDS[backend.scheme] = backend


def set_stream_layer(layer: StreamLayer | None) -> StreamLayer | None:
    """Put ``layer`` between the openers and every reader of :func:`open_shard`; returns the previous one."""
    global _layer
    previous, _layer = _layer, layer
    return previous


def backend_for(url: str) -> Backend:
    """The back end registered for ``url``'s scheme (an entry point's, loaded when first asked for:
    the group ``wds_datapipes.backends`` holds records, ``wds_datapipes.openers`` bare openers)."""
    scheme = url_scheme(url)
    backend = _BACKENDS.get(scheme)
    if backend is None:
        backend = _load_entry_point(scheme)
    if backend is None:
        known = ", ".join(sorted(_BACKENDS))
        raise ShardOpenError(url, f"no opener for scheme {scheme!r} (known: {known})")
    return backend


def _load_entry_point(scheme: str) -> Backend | None:
    for ep in entry_points(group="wds_datapipes.backends", name=scheme):
        register_backend(ep.load())
        return _BACKENDS.get(scheme)
    for ep in entry_points(group="wds_datapipes.openers", name=scheme):
        register_opener(scheme, ep.load())
        return _BACKENDS[scheme]
    return None


def opener_for(url: str) -> Opener:
    """The opener registered for ``url``'s scheme (its back end's ``open``)."""
    return backend_for(url).open


def open_shard(url: str, start: int = 0, limits: Limits | None = None) -> BinaryIO:
    """Open ``url`` for sequential binary reading from byte ``start``; failures raise
    :class:`ShardOpenError` (whatever the opener raised)."""
    if _layer is not None:
        return _layer(url, start, limits, open_source)
    return open_source(url, start, limits)


def open_source(url: str, start: int = 0, limits: Limits | None = None) -> BinaryIO:
    """:func:`open_shard` by the opener of ``url``'s scheme alone (no stream layer: the source itself)."""
    opener = opener_for(url)
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
    if skip(stream, count):
        raise ShardOpenError(url, f"the stream ends before byte {count} that the read starts at")


def stream_size(stream: BinaryIO) -> int | None:
    """The whole object's size in bytes where the stream tells it (local files; HTTP headers;
    a ``size`` attribute: aisio's streams, the shard cache's copies), else None."""
    fileno = getattr(stream, "fileno", None)
    if fileno is not None:
        try:
            return os.fstat(fileno()).st_size
        except (OSError, ValueError, AttributeError):
            pass
    size = getattr(stream, "size", None)
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    headers = getattr(stream, "headers", None)
    return None if headers is None else _headers_stamp(headers)[0]


def _headers_stamp(headers) -> tuple[int | None, str | None]:
    """(size, version) as HTTP headers say them: the whole object's size (a Content-Range's
    total, else the Content-Length), its ETag or Last-Modified."""
    whole = content_range(headers.get("Content-Range"))[2]
    length = headers.get("Content-Length")
    size = whole if whole is not None else int(length) if length is not None and str(length).isdigit() else None
    return size, headers.get("ETag") or headers.get("Last-Modified")


def stream_stamp(stream: BinaryIO, url: str) -> tuple[int | None, str | None]:
    """(size, version) of an opened shard as it says them, each None where it does not: the
    version is the stream's ``version`` (aisio's streams, the shard cache's copies), an HTTP
    ETag or Last-Modified, or a local file's modification time (``"mtime_ns:<n>"``)."""
    version = getattr(stream, "version", None)
    headers = getattr(stream, "headers", None)
    if version is None and headers is not None:
        version = _headers_stamp(headers)[1]
    if version is None and url_scheme(url) == "file":
        try:
            version = file_version(os.fstat(stream.fileno()).st_mtime_ns)
        except (OSError, ValueError, AttributeError):
            version = None
    return stream_size(stream), version


def source_stamp(url: str, limits: Limits) -> tuple[int | None, str | None] | None:
    """(size, version) of the object at ``url`` as its source says now; None where it cannot tell.

    The back end's ``stamp`` tells (``aisio`` has one); HTTP (a HEAD request) and local files
    (a stat) are known here. The shard cache asks it whether its copy is current."""
    scheme = url_scheme(url)
    ask = backend_for(url).stamp or {"http": _http_stamp, "https": _http_stamp, "file": _file_stamp}.get(scheme)
    return ask(url, limits) if ask is not None else None


def _http_stamp(url: str, limits: Limits) -> tuple[int | None, str | None]:
    with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=limits.http_timeout or None) as r:
        return _headers_stamp(r.headers)


def _file_stamp(url: str, limits: Limits) -> tuple[int, str]:
    info = os.stat(local_path(url))
    return info.st_size, file_version(info.st_mtime_ns)


def file_version(mtime_ns: int) -> str:
    """A local file's version, as stamps of streams and sources say it: its modification time."""
    return f"mtime_ns:{mtime_ns}"


def file_mtime(version: str | None) -> int | None:
    """The modification time a :func:`file_version` says; None for any other version."""
    text = (version or "").removeprefix("mtime_ns:")
    return int(text) if version and text != version and text.isdigit() else None


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
    """The standard output of a shell command, as it arrives; closing it checks the exit status.

    Reads return what the command has written so far (the pipe is unbuffered), so a shard
    whose command writes it and then lingers (``cat x.tar; sleep 30``, an ``ssh`` that
    stays connected) gives its samples at once. A command that writes nothing for
    ``limits.pipe_timeout`` seconds mid-shard (a hung ``curl`` or ``aws s3 cp``) is stopped
    and the read fails naming it, instead of waiting forever while the other ranks time
    out.

    Closing it says how the command ended:

    - Closed before its output ended, what it still writes within a second (at most
      256 KiB: a tar's record padding after the end-of-archive block) is read: if its
      output then ends, it was read whole (below). Otherwise the reader is done with it (a
      span ending mid-shard, a ``break``): the command is stopped (its output closed, then ``SIGTERM`` to what its shell
      started) without a wait, and whatever that makes it exit with (``curl``'s 23 for
      a failed write, SIGPIPE, SIGTERM) is not an error. Only a command that had already
      exited non-zero by then (it said it failed while writing what the reader took) is.
    - Read to the end of its output: it must exit 0 (or die of SIGPIPE inside a pipeline
      of its own) within ``limits.pipe_grace`` seconds; one still running then is stopped,
      with the commands it started, and reported: it would otherwise hold the epoch forever.

    ``succeeded`` is True once the command exited 0 after its whole output was read: the
    shard cache keeps a copy only then.
    """

    def __init__(self, url: str, limits: Limits | None = None):
        limits = limits or get_limits()
        self.url = url
        self.grace, self.timeout = limits.pipe_grace, limits.pipe_timeout
        # Its own session and process group, so that stopping it reaches what its shell started.
        self._proc = subprocess.Popen(url[len("pipe:"):], shell=True, stdout=subprocess.PIPE, bufsize=0,
                                      start_new_session=True)
        self._out = self._proc.stdout  # raw: a read returns what has arrived, not a full buffer
        self._passed = 0  # bytes read so far, for errors
        self._ended = False  # its output was read to the end
        self.succeeded = False

    def readinto(self, buffer) -> int:
        self._wait_for_output()
        n = self._out.readinto(buffer) or 0
        self._passed += n
        self._ended = self._ended or (n == 0 and len(buffer) > 0)
        return n

    def read(self, size: int = -1) -> bytes:
        if size is not None and size >= 0:
            self._wait_for_output()
            data = self._out.read(size) or b""
            self._passed += len(data)
            self._ended = self._ended or (not data and size > 0)
            return data
        parts = []
        while chunk := self.read(1 << 20):
            parts.append(chunk)
        return b"".join(parts)

    def _wait_for_output(self) -> None:
        """Returns once the command has written something or closed its output; a command
        silent for ``pipe_timeout`` seconds is stopped and the read fails."""
        if self._out.closed:
            raise ShardReadError(self.url, None, self._passed, "the command's output was closed")
        if not self.timeout:
            return
        ready, _, _ = select.select([self._out], [], [], self.timeout)
        if not ready:
            self._stop()
            self._out.close()  # settled here: close() has no exit status left to report
            raise ShardReadError(self.url, None, self._passed, f"the command wrote nothing for {self.timeout:g} s "
                                 "(Limits.pipe_timeout); it was stopped")

    def close(self) -> None:
        if self._out.closed:
            return
        if not self._ended:
            self._drain()
        if not self._ended:  # the reader is done with it: stopped, and that is no error
            before = self._proc.poll()
            self._out.close()
            self._stop()
            if before is not None and before not in _CLEAN_EXITS:
                raise ShardOpenError(self.url, f"command exited with status {before}")
            return
        self._out.close()
        try:
            status = self._proc.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            self._stop()
            raise ShardOpenError(self.url, f"the command was still running {self.grace:g} s after its output "
                                           "was closed (Limits.pipe_grace); it was stopped") from None
        if status not in _CLEAN_EXITS:
            raise ShardOpenError(self.url, f"command exited with status {status}")
        self.succeeded = status == 0

    def _drain(self) -> None:
        """Reads what the command still writes for a moment (a tar's record padding after its
        end-of-archive block): a command whose output then ends was read whole, and its exit
        status counts (``gsutil cat`` checks a CRC at the end). One that goes on writing past
        ``_DRAIN_BYTES`` or for ``_DRAIN_S`` seconds has more than padding to give: the reader
        stopped early."""
        deadline, drained = time.monotonic() + _DRAIN_S, 0
        while drained <= _DRAIN_BYTES:
            ready, _, _ = select.select([self._out], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return
            chunk = self._out.read(1 << 16)
            if not chunk:
                self._ended = True
                return
            drained += len(chunk)

    def _stop(self) -> None:
        """Stops the command and what its shell started: SIGTERM, then SIGKILL to what is left
        after a moment (never ``pipe_grace``: a reader that is done does not wait)."""
        for sig, wait in ((signal.SIGTERM, 1.0), (signal.SIGKILL, None)):
            try:
                os.killpg(self._proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self._proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            if sig == signal.SIGTERM:  # the shell is gone; what it started in the background may not be
                try:
                    os.killpg(self._proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return


# What a closed command may still write that is read, to see its exit status: a tar's record padding.
_DRAIN_BYTES, _DRAIN_S = 1 << 18, 1.0

# How a command that was read to its end may exit: 0, or SIGPIPE inside a pipeline of its own.
_CLEAN_EXITS = (0, -13, 141)


register_opener("file", _open_file)
register_opener("http", _open_http)
register_opener("https", _open_http)
register_opener("pipe", _CommandStream)
