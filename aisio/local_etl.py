"""Running an ETL in the reading worker, from the same class the cluster would run.

An AIStore ETL written with the SDK's ETL server classes (``ETLServer`` subclasses such
as ``HTTPMultiThreadedServer``, overriding ``transform(data, path, etl_args)`` or
``transform_stream(reader, path, etl_args)``) runs in two places:

- on the cluster: deploy it (:func:`aisio.etl.init_etl_class`, Kubernetes clusters only)
  and read with ``etl_name=``; each GET names the ETL and the targets run it;
- here: read with ``etl_local=TheClass`` (``AISSourceLister(..., etl_local=...)``); the
  URL then carries ``etl_local=module:Class``, and each worker fetches the object as it
  is and calls the same method the server would, with the same ``path`` and ``etl_args``.

A sample's ``__url__`` therefore says where its bytes were transformed: with
``etl_local=`` in it, in the worker; with ``etl_name=`` alone, on the cluster.

The class must be importable by its module path (define it in a module, not in a
notebook cell or ``__main__``, which spawned workers cannot import). One instance per
worker process, made on first use: its ``__init__`` (model loading and the like) runs once
there, as in the ETL pod. The base class's side effects on the process (a root logging
handler on stdout, the open-file limit) are undone after construction.
"""

from __future__ import annotations

import importlib
import io
import logging
import os
import resource
import threading
from collections.abc import Iterator
from urllib.parse import quote

from aistore.sdk.etl.webserver.base_etl_server import ETLServer

from wds_datapipes.errors import ShardOpenError

from .client import AISUrl, endpoint
from .errors import ETLError
from .streams import AISObjectStream

logger = logging.getLogger("aisio")

_SERVERS: dict[tuple[int, str], ETLServer] = {}
_LOCK = threading.Lock()
# The ETL path argument as each server kind hands it to transform(): the threaded HTTP
# server passes the request path as sent ("/bucket/object", escaped); FastAPI and Flask
# pass their decoded {path} parameter ("bucket/object").
_RAW_PATH_SERVERS = frozenset({"HTTPMultiThreadedServer"})


def class_path(cls: type | str) -> str:
    """``module:QualName`` of an ETL server class (a string is returned as it is)."""
    if isinstance(cls, str):
        return cls
    if not isinstance(cls, type) or not issubclass(cls, ETLServer):
        raise TypeError(f"etl_local must be an ETLServer subclass (aistore.sdk.etl.webserver), got {cls!r}")
    if "<locals>" in cls.__qualname__:
        raise ValueError(f"etl_local: {cls.__qualname__} is defined inside a function; workers cannot import it")
    return f"{cls.__module__}:{cls.__qualname__}"


def load_class(path: str) -> type[ETLServer]:
    """The ETL server class named ``module:QualName``."""
    module_name, _, qualname = path.partition(":")
    try:
        obj = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError) as exn:
        raise ETLError(f"cannot import the ETL class {path!r} in this process: {type(exn).__name__}: {exn}") from exn
    if not isinstance(obj, type) or not issubclass(obj, ETLServer):
        raise ETLError(f"{path!r} is not an ETLServer subclass")
    return obj


def server_for(path: str) -> ETLServer:
    """This process's instance of the ETL class ``path`` (made on first use)."""
    key = (os.getpid(), path)
    with _LOCK:
        server = _SERVERS.get(key)
        if server is None:
            server = _SERVERS[key] = _construct(load_class(path))
            logger.info("ETL class %s runs in this process (pid %d), not on the cluster", path, os.getpid())
    return server


def _construct(cls: type[ETLServer]) -> ETLServer:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    os.environ.setdefault("AIS_TARGET_URL", endpoint())  # the base class insists on it
    try:
        return cls()
    except Exception as exn:
        raise ETLError(f"cannot construct the ETL class {cls.__module__}:{cls.__qualname__}: "
                       f"{type(exn).__name__}: {exn}") from exn
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)


def request_path(server: ETLServer, aurl: AISUrl) -> str:
    """The ``path`` argument the server would get from a target for ``aurl``'s object."""
    names = {c.__name__ for c in type(server).__mro__}
    if names & _RAW_PATH_SERVERS:
        return "/" + quote(f"{aurl.bucket}/{aurl.object}", safe="/!$&'()*+,;=:@")
    return f"{aurl.bucket}/{aurl.object}"


class _ChunkStream(io.RawIOBase):
    """A read-only stream over an iterator of byte chunks, from byte ``skip`` on."""

    def __init__(self, chunks: Iterator[bytes], skip: int, on_close):
        super().__init__()
        self._chunks = chunks
        self._pending = memoryview(b"")
        self._skip = skip
        self._on_close = on_close

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        while not len(self._pending) or self._skip:
            if len(self._pending) and self._skip:
                drop = min(self._skip, len(self._pending))
                self._pending, self._skip = self._pending[drop:], self._skip - drop
                continue
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = memoryview(chunk)
        n = min(len(view), len(self._pending))
        view[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        if not self.closed:
            self._on_close()
        super().close()


def open_transformed(url: str, start: int = 0) -> io.RawIOBase:
    """The output of ``url``'s ``etl_local`` class for its object, from output byte ``start``.

    The object is fetched as it is (with the retries of :class:`~aisio.streams.AISObjectStream`);
    a ``transform_stream`` server streams it through, a ``transform`` server gets it whole.
    Errors of the transform raise :class:`~wds_datapipes.errors.ShardOpenError` naming the
    class, the object and the cause.
    """
    aurl = AISUrl.parse(url)
    server = server_for(aurl.etl_local)
    source = AISObjectStream(aurl.plain)
    path, args = request_path(server, aurl), (aurl.etl_args or "").strip()
    what = f"ETL class {aurl.etl_local} (etl_local, ETL {aurl.etl_name!r}) on {aurl.plain}"
    try:
        if server.use_streaming:
            chunks = server.transform_stream(source, path, args)
        else:
            with source:
                output = server.transform(source.read(), path, args)
            if not isinstance(output, (bytes, bytearray, memoryview)):
                raise TypeError(f"transform() returned {type(output).__name__}, not bytes")
            chunks = iter((bytes(output),))
    except ShardOpenError:
        raise
    except Exception as exn:
        source.close()
        raise ShardOpenError(url, f"{what} failed: {type(exn).__name__}: {exn}") from exn
    return _ChunkStream(_guarded(chunks, url, what), start, source.close)


def _guarded(chunks: Iterator[bytes], url: str, what: str) -> Iterator[bytes]:
    try:
        yield from chunks
    except ShardOpenError:
        raise
    except Exception as exn:
        raise ShardOpenError(url, f"{what} failed: {type(exn).__name__}: {exn}") from exn
