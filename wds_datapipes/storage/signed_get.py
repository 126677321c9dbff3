"""A GET of a presigned object URL over ``http.client``: how ``s3://`` and ``az://`` bodies are
read in every process, and any scheme's in a process forked after obstore started (see
:mod:`.store_calls`, and :class:`~.object_store.ObjectStream` for the rule).

The URL is signed by ``obstore.sign`` (in-process, or by a forked process's store agent:
one cheap round trip); the bytes then come straight from the server into the reader's
buffer, with no pipe between and no chunk copied out of obstore's runtime. Every answer is told as the
obstore calls tell theirs, a :class:`~.store_calls.StoreFailure` of one kind (the object
changed, access denied, missing, past the end, refused, transient), so the object stream
retries, resumes and pins the ETag the same way on either path.

A presigned URL's query string is a bearer secret: a :class:`SignedUrl` never shows it
(``repr``, ``str``), refuses to be pickled, and no message made here names the URL: the
caller's errors name the ``s3://bucket/key`` URL instead.
"""

from __future__ import annotations

import http.client
import io
import os
import re
import select
import socket
import ssl
import sys
import threading
import urllib.request
from time import monotonic
from types import NoneType
from typing import Any
from urllib.parse import urlsplit

from .resuming import Body, Opened, http_opened
from .retry import retry_after
from .store_calls import (
    CHANGED,
    DENIED,
    MISSING_BUCKET,
    MISSING_OBJECT,
    PAST_END,
    REFUSED,
    TRANSIENT,
    StoreFailure,
)

SIGNED_FOR_S = 3600  # how long a signature is asked to last
RESIGN_AFTER_S = SIGNED_FOR_S / 2  # a resume after this long signs again first
_REDIRECTS = 4
_ERROR_BODY = 4096  # the most of an error answer read, for its code
_CODE = re.compile(rb"<Code>\s*([A-Za-z]+)\s*</Code>")
_BUCKET_CODES = (b"NoSuchBucket", b"ContainerNotFound")
_RETRIED = frozenset({408, 429, 500, 502, 503, 504})


class SignedUrl:
    """A presigned GET URL and when it was made; never shown, never pickled."""

    __slots__ = ("_url", "made_at")

    def __init__(self, url: str):
        self._url = url
        self.made_at = monotonic()

    @property
    def stale(self) -> bool:
        """Whether a new request should sign again first (half its life is gone)."""
        return monotonic() - self.made_at > RESIGN_AFTER_S

    def __repr__(self) -> str:
        return "SignedUrl(<hidden>)"

    __str__ = __repr__

    def __reduce__(self):
        raise TypeError("a presigned URL is a secret and is never pickled")


def proxied(url: SignedUrl) -> bool:
    """Whether the environment sends requests for the URL's host through a proxy (``HTTPS_PROXY``
    ...): obstore honours those, ``http.client`` does not, so such URLs are read through the agent."""
    if _ENVIRONMENT_PROXIES_ONLY and not any(name[-6:].lower() == "_proxy" for name in os.environ):
        return False  # no proxy variable at all (a scan of the names only: urllib's costs ~0.1 ms an open)
    parts = urlsplit(url._url)
    return bool(urllib.request.getproxies().get(parts.scheme)) and not urllib.request.proxy_bypass(parts.hostname or "")


# Where urllib finds proxies in the environment only (not macOS's or Windows's system settings).
_ENVIRONMENT_PROXIES_ONLY = os.name == "posix" and sys.platform != "darwin"


def open_signed(url: SignedUrl, offset: int, if_match: str | None, timeouts: tuple[float, float]) -> Opened:
    """The object from byte ``offset`` (always a Range request, so a 206's Content-Range
    gives the whole size even where a body is cut); ``if_match`` pins its ETag. Raises
    :class:`StoreFailure` for an answer that is not the object (412: it changed)."""
    target = url._url
    for _ in range(_REDIRECTS + 1):
        connection, response = _get(target, offset, if_match, timeouts)
        status = response.status
        if status in (200, 206):
            return http_opened(_Body(connection, response), status, response.headers, response.getheader("ETag"))
        try:
            if status in (301, 302, 303, 307, 308) and response.getheader("Location"):
                target = _redirected(target, response.getheader("Location"))
                continue
            raise _failure(response)
        finally:
            _drop(connection, response)
    raise StoreFailure(REFUSED, f"more than {_REDIRECTS} redirects")


def _get(url: str, offset: int, if_match: str | None,
         timeouts: tuple[float, float]) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    parts = urlsplit(url)
    connect_s, read_s = (t if t != float("inf") else None for t in timeouts)
    headers = {"Range": f"bytes={offset}-"}
    if if_match:
        headers["If-Match"] = if_match
    place = (os.getpid(), parts.scheme, parts.netloc)
    while True:
        connection, reused = _idle_connection(place), True
        if connection is None:
            connection, reused = _connection(parts, connect_s), False
        try:
            if reused and connection.sock is not None:
                connection.sock.settimeout(connect_s)
            connection.request("GET", f"{parts.path}?{parts.query}" if parts.query else parts.path, headers=headers)
            if connection.sock is not None:
                connection.sock.settimeout(read_s)  # from here on a stalled read is given up after the read timeout
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as exn:
            connection.close()
            if reused and isinstance(exn, (ConnectionError, http.client.RemoteDisconnected)):
                continue  # the server closed an idle kept-alive connection: a new one
            raise _transient(exn, url) from None
        response.place = place  # where the connection goes back to once the body is read whole
        return connection, response


def _connection(parts, connect_s: float | None) -> http.client.HTTPConnection:
    if parts.scheme == "https":
        connection = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=connect_s,
                                                 context=ssl.create_default_context())
    else:
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=connect_s)
    connection.low_water = 1  # its socket's receive low-water mark (the system's default; see _Body)
    return connection


# Connections kept alive between requests, by (process, scheme, host:port): a new TCP (and
# TLS) connection per shard cost about 4 ms of each 2-4 MB read here.
_idle: dict[tuple[int, str, str], list[http.client.HTTPConnection]] = {}
_idle_lock = threading.Lock()
_MAX_IDLE = 4


def _forget_idle_in_child() -> None:
    """A forked child starts with no kept connection and a lock no thread of its parent holds."""
    global _idle_lock
    _idle_lock = threading.Lock()
    _idle.clear()


if hasattr(os, "register_at_fork"):  # touches this module's pool only
    os.register_at_fork(after_in_child=_forget_idle_in_child)


def _idle_connection(place: tuple[int, str, str]) -> http.client.HTTPConnection | None:
    with _idle_lock:
        if any(key[0] != place[0] for key in _idle):
            _idle.clear()  # a parent's, copied by a fork: never used here
        kept = _idle.get(place)
        return kept.pop() if kept else None


def _keep(place: tuple[int, str, str], connection: http.client.HTTPConnection) -> None:
    with _idle_lock:
        kept = _idle.setdefault(place, [])
        if len(kept) < _MAX_IDLE and place[0] == os.getpid():
            kept.append(connection)
            return
    connection.close()


def _failure(response: http.client.HTTPResponse) -> StoreFailure:
    """The failure an answer other than 200/206 says, by its status (and an S3 or Azure
    error code); the answer's body is read for the code only and never shown."""
    status, reason = response.status, response.reason
    try:
        code_match = _CODE.search(response.read(_ERROR_BODY) or b"")
    except (OSError, http.client.HTTPException):
        code_match = None
    code = code_match.group(1) if code_match else b""
    said = f"HTTP {status} {reason}" + (f" ({code.decode()})" if code else "")
    if status in (304, 412):
        kind = CHANGED
    elif status in (401, 403):
        kind = DENIED
    elif status == 404:
        kind = MISSING_BUCKET if code in _BUCKET_CODES else MISSING_OBJECT
    elif status == 416:
        kind = PAST_END
    elif status in _RETRIED:
        return StoreFailure(TRANSIENT, said, status, retry_after(response.getheader("Retry-After")))
    else:
        kind = REFUSED
    return StoreFailure(kind, said, status)



def _redirected(url: str, location: str) -> str:
    if location.startswith("/"):
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.netloc}{location}"
    return location


def _drop(connection: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
    for part in (response, connection):
        try:
            part.close()
        except (OSError, http.client.HTTPException):
            pass


def _transient(exn: BaseException, url: str) -> StoreFailure:
    """A connection failure in words that never hold the URL (http.client names it in some messages)."""
    text = str(exn)
    for secret in (url, urlsplit(url).query):
        if secret:
            text = text.replace(secret, "<url>")
    return StoreFailure(TRANSIENT, f"{type(exn).__name__}: {text}"[:300])


# Bulk reads: each read of a body waits, by the socket's receive low-water mark (SO_RCVLOWAT),
# for as many bytes as it asks for, up to this many and never past the body's end, instead of
# taking whatever a recv() finds (~64 KiB here). The mark starts at _FIRST_LOW_WATER and doubles
# with each read (a reader that wants a few members of a span waits for little). On the 64 MB
# shards of `make bench-storage`, the tar walk over one body took 0.95 ms of CPU per MB at one
# recv() per ~100 KB and 0.59 ms at one per MiB: each wakeup of the reader costs, besides the
# copy. 0 turns it off (bench_storage.py --only-bulk-reads compares).
RECEIVE_LOW_WATER = 1 << 20
_FIRST_LOW_WATER = 64 << 10
# Only bodies of this many bytes or more: on the 2-4 MB shards the 2-worker rows read at
# 0.81-0.91x with bulk reads (three runs; 1.11-1.14x on 64 MB in two of three).
BULK_BODY_BYTES = 16 << 20
# The longest a read waits for the mark: then it takes what came, and that body is read as
# before (one recv() at a time) from then on. A stall is still no byte within the read timeout.
LOW_WATER_WAIT_S = 0.5
# Not over TLS: a TLS read gives one record (16 KiB) at most, and the socket's mark counts
# bytes not yet decrypted. Nor where the system has no such option, or no poll().
_SO_RCVLOWAT = getattr(socket, "SO_RCVLOWAT", None) if hasattr(select, "poll") else None


class _Body(Body):
    """An answer's body: each ``readinto`` is one socket read at most straight into the
    caller's buffer (a larger read would lose what it had when the connection fails), which
    waits for a bulk of bytes where the body has them to come (RECEIVE_LOW_WATER); a failure
    is a transient :class:`StoreFailure`, so the stream resumes from its position."""

    def __init__(self, connection: http.client.HTTPConnection, response: http.client.HTTPResponse):
        self._connection, self._response = connection, response
        self._raw = response.fp  # the socket's reader: readinto1 fills the view from the socket, no copy
        self._left = None if response.chunked else response.length
        sock = connection.sock
        self._read_s = sock.gettimeout() if sock is not None else None  # as _get set it
        bulk = (RECEIVE_LOW_WATER > 1 and (self._left or 0) >= max(BULK_BODY_BYTES, 1) and _SO_RCVLOWAT
                and not isinstance(sock, (ssl.SSLSocket, NoneType)))
        self._mark = _FIRST_LOW_WATER if bulk else 0
        # Whether http.client's buffer is empty (the last read went to the socket): only then does the
        # socket hold every byte not yet read, so that poll() waiting for the mark sees them all.
        self._direct = False

    def readinto(self, view: memoryview) -> int:
        try:
            if self._left is None:  # chunked, or no length (ends at the close): http.client frames it
                data = self._response.read1(len(view))
                view[:len(data)] = data
                return len(data)
            if not self._left:
                return 0
            want = min(len(view), self._left)
            if self._mark and self._direct and want > io.DEFAULT_BUFFER_SIZE:
                n = self._bulk_read(view[:want])
            else:
                if self._connection.low_water != 1:
                    self._set_mark(1)
                n = self._raw.readinto1(view[:want])
        except (OSError, http.client.HTTPException, ValueError, AttributeError) as exn:
            if isinstance(exn, socket.timeout):
                raise StoreFailure(TRANSIENT, "the body stalled past the read timeout") from None
            raise StoreFailure(TRANSIENT, f"the body broke: {type(exn).__name__}") from None
        # readinto1 reads the socket (and leaves http.client's buffer empty) when it asks for more than that buffer
        self._direct = want > io.DEFAULT_BUFFER_SIZE
        self._left -= n
        return n

    def _bulk_read(self, view: memoryview) -> int:
        """One read that waits for ``min(len(view), mark)`` bytes, at most LOW_WATER_WAIT_S; after
        that (a slow body) it takes what came, or waits the rest of the read timeout for a byte."""
        # Half of what the body has left at most: the reader works on one half while the other comes,
        # so a body's last bytes are not all waited for before any of them is parsed.
        mark = min(len(view), self._mark, max(self._left // 2, _FIRST_LOW_WATER))
        self._mark = min(2 * self._mark, RECEIVE_LOW_WATER)
        wait = LOW_WATER_WAIT_S if self._read_s is None else min(self._read_s, LOW_WATER_WAIT_S)
        try:
            self._set_mark(mark)
        except OSError:  # the system refuses the option: one recv() at a time
            self._mark = 0
            return self._raw.readinto1(view)
        if self._readable(wait):  # poll() counts the mark; the socket's own timeout never ran out
            return self._raw.readinto1(view)
        self._mark = 0  # fewer bytes came within the wait: a slow body, one recv() at a time from now on
        self._set_mark(1)
        rest = None if self._read_s is None else self._read_s - wait
        if rest is None:
            return self._raw.readinto1(view)
        if rest <= 0:  # the read timeout is spent: a byte that came, or a stall
            if not self._readable(0):
                raise TimeoutError("timed out")
            return self._raw.readinto1(view)
        sock = self._connection.sock
        sock.settimeout(rest)  # the read's whole wait stays the read timeout
        try:
            return self._raw.readinto1(view)
        finally:
            sock.settimeout(self._read_s)

    def _readable(self, wait_s: float) -> bool:
        poller = select.poll()
        poller.register(self._connection.sock, select.POLLIN)
        return bool(poller.poll(wait_s * 1000))

    def _set_mark(self, mark: int) -> None:
        """The socket's receive low-water mark, set where it differs (a failed call leaves it)."""
        connection = self._connection
        if connection.low_water != mark:
            connection.sock.setsockopt(socket.SOL_SOCKET, _SO_RCVLOWAT, mark)
            connection.low_water = mark

    def close(self) -> None:
        response, self._response = self._response, None
        if response is None:
            return
        self._raw = None
        if self._left == 0 and not response.will_close and self._answers_whole():
            response.close()  # read whole: the connection serves the next request
            _keep(response.place, self._connection)
        else:
            _drop(self._connection, response)

    def _answers_whole(self) -> bool:
        """Whether the connection reads its next answer from its first byte on (its mark back at 1)."""
        if self._connection.low_water == 1:
            return True
        try:
            self._set_mark(1)
        except OSError:
            return False
        return True

    def __getstate__(self) -> Any:
        raise TypeError("an open body cannot be pickled")
