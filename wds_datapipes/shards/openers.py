"""Opening shard URLs as binary streams, chosen by URL scheme through one registry.

Each scheme has one :class:`~wds_datapipes.storage.backend.Backend` record (open, stamp,
list, put). Built in: local paths and ``file:`` URLs (``file:///abs``,
``file://localhost/abs``, ``file://relative``; list: globs and directories; put: a copy
renamed into place), ``http://`` / ``https://`` (resuming dropped connections, see
:mod:`wds_datapipes.shards.http_stream`; stamp: a HEAD request), and ``pipe:CMD`` (the
command's standard output, :mod:`wds_datapipes.shards.commands`). Other packages add
schemes with :func:`register_backend` (or :func:`register_opener` for one that only
opens), or lazily through the ``wds_datapipes.backends`` entry-point group (``aisio``
registers ``ais`` that way; the older ``wds_datapipes.openers`` group of bare openers
still works), so worker processes find them without an import in user code.
"""

from __future__ import annotations

import dataclasses
import glob
import inspect
import os
import shutil
import urllib.request
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import BinaryIO

from ..errors import ShardOpenError, WdsError, shard_error
from ..limits import Limits, get_limits
from ..storage.backend import SHARD_SUFFIXES, Backend
from ..storage.resuming import content_range, skip
from .commands import CommandStream
from .files import publish, unlink
from .http_stream import HttpStream

# opener(url) -> stream, or opener(url, start=n) -> stream positioned at byte n.
Opener = Callable[..., BinaryIO]

_BACKENDS: dict[str, Backend] = {}
_NO_ENTRY_POINT: set[str] = set()  # schemes no installed package registers (looked up once)

# What stands between the openers and the readers: layer(url, start, limits, open_source) -> stream,
# where open_source(url, start, limits) opens through the registry. The shard cache installs
# itself here (wds_datapipes.cache), so no scheme needs an if for it.
StreamLayer = Callable[[str, int, "Limits | None", Callable[..., BinaryIO]], BinaryIO]
_layer: StreamLayer | None = None
_layer_report: Callable[[str], None] | None = None  # logs what the layer did, where a reader ends a pass


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
    old = _BACKENDS.get(scheme)
    stamp = getattr(opener, "source_stamp", None) or (old.stamp if old is not None else None)
    if old is None:
        register_backend(Backend(scheme, opener, stamp=stamp), replace=True)
    else:  # the scheme's listing and upload stay
        register_backend(dataclasses.replace(old, open=opener, stamp=stamp), replace=True)


def register_backend(backend: Backend, *, replace: bool = False) -> None:
    """Register ``backend`` for its scheme; a scheme already taken raises unless ``replace``."""
    if not replace and backend.scheme in _BACKENDS and _BACKENDS[backend.scheme] != backend:
        raise ValueError(f"the scheme {backend.scheme!r} has a back end already (replace=True replaces it)")
    _BACKENDS[backend.scheme] = backend


def set_stream_layer(layer: StreamLayer | None, report: Callable[[str], None] | None = None) -> StreamLayer | None:
    """Put ``layer`` between the openers and every reader of :func:`open_shard`; returns the previous one.
    ``report(what)``, if given, logs what the layer did, where a reader ends a pass (:func:`report_stream_layer`)."""
    global _layer, _layer_report
    previous, _layer, _layer_report = _layer, layer, report
    return previous


def report_stream_layer(what: str = "epoch") -> None:
    """Where a reader ends a pass (``"epoch"``): the stream layer logs what it did (the shard cache, its counters)."""
    if _layer_report is not None:
        _layer_report(what)


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
    if scheme in _NO_ENTRY_POINT:  # entry_points() reads every installed package's metadata (~3 ms)
        return None
    for ep in entry_points(group="wds_datapipes.backends", name=scheme):
        register_backend(ep.load())
        return _BACKENDS.get(scheme)
    for ep in entry_points(group="wds_datapipes.openers", name=scheme):
        register_opener(scheme, ep.load())
        return _BACKENDS[scheme]
    _NO_ENTRY_POINT.add(scheme)
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


_GLOB_CHARS = frozenset("*?[")


def resolve_local(url: str) -> list[str]:
    """A local glob becomes its sorted matches, a directory its sorted shard files (the ``file``
    back end's ``list``; any other URL comes back as it is).

    What the filesystem returns comes back as :class:`LocalPath`: a found name is never
    read as a URL or a ``pipe:`` command. A path with glob characters that names an
    existing file (``shard[1].tar``) is that file, as webdataset (which never globs) reads it.
    """
    if url_scheme(url) != "file":
        return [url]
    path = local_path(url)
    prefix = url[: len(url) - len(path)]  # "file://" stays on what it expands to
    if _GLOB_CHARS.intersection(path):
        if os.path.isfile(path):
            return [url]
        return [LocalPath(match, prefix) for match in sorted(glob.glob(path))]
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if n.endswith(SHARD_SUFFIXES))
        return [LocalPath(os.path.join(path, n), prefix) for n in names]
    return [url]


def _list_files(spec: str, limits: Limits | None = None) -> Iterator[str]:
    return iter(resolve_local(spec))


def _put_file(path: str, url: str, limits: Limits | None = None) -> str:
    """Copies ``path`` to ``<url's path>.part``, then renames it to the final name: the file
    appears whole or not at all. Returns its version (:func:`file_version`)."""
    final = local_path(url)
    os.makedirs(os.path.dirname(os.path.abspath(final)), exist_ok=True)
    part = final + ".part"
    try:
        shutil.copyfile(path, part)
        publish(part, final)
    except BaseException:
        unlink(part)
        raise
    return file_version(os.stat(final).st_mtime_ns)


def list_urls(url: str, limits: Limits | None = None) -> Iterator[str]:
    """The shard URLs ``url`` names, as its back end's ``list`` gives them (a glob, a directory,
    a prefix: lazily, page by page); ``url`` itself where its scheme lists nothing or is
    unknown (opening it says so)."""
    try:
        lister = backend_for(url).list
    except ShardOpenError:
        lister = None
    if lister is None:
        yield url
        return
    yield from lister(url, limits or get_limits())


register_backend(Backend("file", _open_file, stamp=_file_stamp, list=_list_files, put=_put_file), replace=True)
register_backend(Backend("http", _open_http, stamp=_http_stamp), replace=True)
register_backend(Backend("https", _open_http, stamp=_http_stamp), replace=True)
register_backend(Backend("pipe", CommandStream), replace=True)
