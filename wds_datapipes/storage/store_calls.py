"""The object-store calls the back end makes (head, get from a byte, list by pages, put), fork-safe.

obstore runs its requests on a Rust runtime that is global to the process and does not
survive a fork: a child forked after its parent made one obstore call hangs on its first
own call, even with a store of its own (checked with obstore 0.12.1). So each process
makes its calls in-process while that is safe (no call before a fork: a spawned worker,
a forked worker whose parent never called obstore, the main process itself), and a
process forked after its parent used obstore makes them through an agent: one fresh
``python -m wds_datapipes.storage.store_agent`` subprocess of its own, answering over a
pipe. Its object reads ask the agent only for a presigned URL (:func:`sign`) and fetch the
bytes themselves (:mod:`.signed_get`) where the store can presign; the agent relays the
bytes where it cannot. Whichever way, obstore's exceptions come back as a
:class:`~.store_failures.StoreFailure` of one kind (:mod:`.store_failures`); a store that
cannot be built (its settings) fails the call at once, before any request. Every wait on
the agent is bounded; an agent that ends or stops answering fails the call in flight
(transient, naming the object) and is replaced by a fresh one for the next call.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..errors import ShardOpenError
from ..limits import Limits
from .cloud_settings import StoreSettings, obstore_module, store_for
from .store_failures import (  # noqa: F401 - the kinds and classify, by their old names here too
    CHANGED,
    CONFIG,
    CREDENTIALS,
    DENIED,
    MISSING_BUCKET,
    MISSING_OBJECT,
    PAST_END,
    REFUSED,
    TRANSIENT,
    StoreFailure,
    classify,
    not_found,
    words,
)


@dataclass(frozen=True)
class Target:
    """Which store a call goes to: scheme, bucket, settings and the limits its client takes."""

    scheme: str
    bucket: str
    settings: StoreSettings
    limits: Limits


# -- in-process calls (the agent runs these too)

def head(target: Target, key: str) -> dict[str, Any]:
    """The object's metadata (size, e_tag, version, ...)."""
    obstore = obstore_module()
    try:
        return dict(obstore.head(_store(target), key))
    except Exception as exn:  # noqa: BLE001 - every obstore failure is classified
        raise classify(exn) from None


def get(target: Target, key: str, offset: int, if_match: str | None) -> tuple[dict[str, Any], Iterator[bytes]]:
    """(metadata, chunks) of the object from byte ``offset``; ``if_match`` pins its ETag."""
    obstore = obstore_module()
    options: dict[str, Any] = {}
    if offset:
        options["range"] = {"offset": offset}
    if if_match:
        options["if_match"] = if_match
    try:
        result = obstore.get(_store(target), key, options=options)
        meta = dict(result.meta)
        meta["range_start"] = result.range[0]
        stream = result.stream(min_chunk_size=_CHUNK)
    except Exception as exn:  # noqa: BLE001
        raise classify(exn) from None
    return meta, _chunks(stream)


def _chunks(stream) -> Iterator[bytes]:
    while True:
        try:
            chunk = next(stream)
        except StopIteration:
            return
        except Exception as exn:  # noqa: BLE001 - a body cut short, a reset, a stall
            raise classify(exn) from None
        yield chunk


def list_pages(target: Target, prefix: str, page_size: int,
               after: str | None = None) -> Iterator[list[dict[str, Any]]]:
    """The objects under ``prefix`` (lexicographic key order, as S3, GCS and Azure list), page by
    page; with ``after``, only the keys after it (a listing resumed past the last key it gave:
    obstore's ``offset``, and the keys up to it dropped here, as Azurite ignores the offset)."""
    obstore = obstore_module()
    try:
        pages = iter(obstore.list(_store(target), prefix or None, offset=after, chunk_size=page_size))
    except Exception as exn:  # noqa: BLE001
        raise classify(exn) from None
    while True:
        try:
            page = next(pages)
        except StopIteration:
            return
        except Exception as exn:  # noqa: BLE001
            raise classify(exn) from None
        yield [dict(meta) for meta in page if after is None or meta["path"] > after]


def put(target: Target, path: str, key: str) -> dict[str, Any]:
    """Uploads the file at ``path`` as ``key``, whole or not at all (multipart over the 8 MiB part size)."""
    obstore = obstore_module()
    try:
        with open(path, "rb") as source:
            return dict(obstore.put(_store(target), key, source, chunk_size=_PART, max_concurrency=4))
    except Exception as exn:  # noqa: BLE001
        raise classify(exn) from None


def sign(target: Target, key: str, expires_s: float) -> str:
    """A presigned GET URL of the object, valid ``expires_s`` seconds (a secret: see :mod:`.signed_get`)."""
    obstore = obstore_module()
    try:
        return obstore.sign(_store(target), "GET", key, timedelta(seconds=expires_s))
    except Exception as exn:  # noqa: BLE001
        raise classify(exn) from None


def _store(target: Target):
    global _runtime_pid
    _runtime_pid = _runtime_pid or os.getpid()
    try:
        return store_for(target.scheme, target.bucket, target.settings, target.limits)
    except ImportError:
        raise
    except ShardOpenError as exn:  # a variable StoreSettings.credentials_env names is not set
        raise StoreFailure(CONFIG, exn.reason or str(exn)) from None
    except Exception as exn:  # noqa: BLE001 - a store not built: its settings, never the network (no request yet)
        failure = classify(exn)
        raise (failure if failure.kind == CREDENTIALS else StoreFailure(CONFIG, words(exn))) from None


_CHUNK = 256 << 10  # the least a stream chunk holds: 256 KiB read 0.86-1.6x plain HTTP here, 1 MiB 0.56-0.64x
_PART = 8 << 20  # multipart upload part size
_runtime_pid: int | None = None  # the process whose obstore runtime has started (a fork copies this)


def _thread_names() -> dict[int, str] | None:
    """Each thread of this process and its kernel name (``comm``); None without /proc."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    names = {}
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                names[int(task)] = comm.read().rstrip("\n")
        except (OSError, ValueError):
            continue
    return names


def _runtime_threads(settle_s: float = 0.1) -> bool:
    """Whether obstore's runtime runs in this process: its tokio worker threads are there.

    A worker thread names itself once it first runs: until then it has the name of the thread
    that made it. Just after the runtime started on a busy machine, its workers can be that
    young; so where native threads of that name that Python did not start began less than a
    second ago, their names are looked at again for up to ``settle_s`` (other libraries'
    threads keep theirs: a fork soon after such a thread started waits that long, once)."""
    deadline = time.monotonic() + settle_s
    while True:
        names = _thread_names()
        if names is None:  # no /proc: only what _store noted
            return False
        if any(name.startswith("tokio-") for name in names.values()):
            return True
        main = names.get(os.getpid())
        python_threads = {t.native_id for t in threading.enumerate()}
        young = [tid for tid, name in names.items() if name == main and tid not in python_threads
                 and tid != os.getpid() and _age_s(tid) < 1.0]
        if not young or time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def _age_s(tid: int) -> float:
    """How long ago this process's thread ``tid`` started (its /proc start time); large if unknown."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as uptime:
            now = float(uptime.read().split()[0])
        return now - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("inf")


def _note_runtime_before_fork() -> None:
    """Before a fork: a runtime started by any road (a store built outside :func:`_store`, a
    test that put the mark back) is noted, so the child never calls into a copy of it."""
    global _runtime_pid
    if _runtime_pid is None and "obstore" in sys.modules and _runtime_threads():
        _runtime_pid = os.getpid()


if hasattr(os, "register_at_fork"):  # touches this module's mark only
    os.register_at_fork(before=_note_runtime_before_fork)


def forked_after_runtime() -> bool:
    """Whether this process was forked after its parent started obstore's runtime (its calls then go through the agent)."""
    return _runtime_pid is not None and _runtime_pid != os.getpid()


def calls():
    """This module, or the agent where obstore's runtime was started before this process forked."""
    if not forked_after_runtime():
        return sys.modules[__name__]
    return _agent()


# -- the agent's client

class _Agent:
    """A subprocess making the calls for a process forked after obstore started (see the module).

    Every wait on its answer is bounded (:func:`_wait_bound`: the call's read timeout, times
    obstore's tries, and a slack); an agent that ends (killed, crashed) or does not answer in
    time fails the call in flight with a transient :class:`StoreFailure` naming the object,
    and is replaced: :func:`calls` starts a fresh one for the next call (an object stream
    resumes at its byte through it)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._proc = subprocess.Popen([sys.executable, "-c", _AGENT_BOOT, _PACKAGE_DIR],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self.pid = os.getpid()
        self.ended: str | None = None  # why this agent takes no more calls
        self._open: set[int] = set()  # the handles of its open reads and listings

    def _call(self, what: str, bound_s: float, *request):
        with self._lock:
            if self.ended is not None:
                raise StoreFailure(TRANSIENT, f"the object-store agent {self.ended}; {what} was not asked")
            try:
                _send(self._proc.stdin, request)
                status, value = _receive_within(self._proc, bound_s)
            except _AgentLost as lost:
                self._end(str(lost))
                raise StoreFailure(TRANSIENT, f"the object-store agent (pid {self._proc.pid}) {lost} while asked to "
                                              f"{what}; a new agent takes the next call") from None
            except OSError as exn:  # the pipe broke: it ended before reading the request
                self._end(f"ended ({type(exn).__name__})")
                raise StoreFailure(TRANSIENT, f"the object-store agent (pid {self._proc.pid}) {self.ended} before "
                                              f"it was asked to {what}; a new agent takes the next call") from None
        if status == "error":
            raise StoreFailure(*value)
        return value

    def _end(self, why: str) -> None:
        """This agent takes no more calls: stopped (killed where it still runs) and forgotten."""
        self.ended = why
        self._open.clear()
        try:
            self._proc.kill()
            self._proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for pipe in (self._proc.stdin, self._proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass

    def head(self, target: Target, key: str) -> dict[str, Any]:
        return self._call(f"head {_named(target, key)}", _wait_bound(target.limits), "head", target, key)

    def get(self, target: Target, key: str, offset: int, if_match: str | None):
        what = f"read {_named(target, key)} from byte {offset}"
        handle, meta = self._call(what, _wait_bound(target.limits), "get", target, key, offset, if_match)
        self._open.add(handle)
        return meta, self._drain(handle, f"read {_named(target, key)}", target.limits)

    def list_pages(self, target: Target, prefix: str, page_size: int, after: str | None = None):
        what = f"list {_named(target, prefix)}"
        handle = self._call(what, _wait_bound(target.limits), "list", target, prefix, page_size, after)
        self._open.add(handle)
        return self._drain(handle, what, target.limits)

    def put(self, target: Target, path: str, key: str) -> dict[str, Any]:
        try:
            size = os.path.getsize(path)
        except OSError:
            size = 0
        return self._call(f"upload {_named(target, key)}", _wait_bound(target.limits, size), "put", target, path, key)

    def sign(self, target: Target, key: str, expires_s: float) -> str:
        return self._call(f"sign {_named(target, key)}", _wait_bound(target.limits), "sign", target, key, expires_s)

    def _drain(self, handle: int, what: str, limits: Limits) -> Iterator:
        try:
            while (item := self._call(what, _wait_bound(limits), "next", handle)) is not None:
                yield item
        finally:
            if handle in self._open and self.ended is None:
                self._open.discard(handle)
                try:
                    self._call(what, _wait_bound(limits), "close", handle)
                except StoreFailure:
                    pass  # the agent was lost meanwhile: nothing is left open


class _AgentLost(Exception):
    """The agent ended, or did not answer within the bound (the reason, in words)."""


def _named(target: Target, key: str) -> str:
    return f"{target.scheme}://{target.bucket}/{key}"


_AGENT_SLACK_S = 60.0  # the agent's start (imports) and its own work, beyond the requests it makes
_NO_TIMEOUT_S = 300.0  # the read timeout assumed where the limits set none (http_timeout=0)
_SLOWEST_UPLOAD_BPS = 64 << 10  # an upload waited for at this rate at least


def _wait_bound(limits: Limits, upload_bytes: int = 0) -> float:
    """The longest a call on the agent may take before it counts as lost: obstore's tries
    (1 + its 2 retries), each a connect (5 s) and a read timeout (``limits.http_timeout``),
    its backoff, a slack for the agent's start, and an upload's bytes at a slow rate."""
    read_s = limits.http_timeout or _NO_TIMEOUT_S
    return _AGENT_SLACK_S + 3 * (5.0 + read_s) + upload_bytes / _SLOWEST_UPLOAD_BPS


_the_agent: _Agent | None = None
# The agent imports this room's modules only: the package's __init__ (torch, the decoders:
# ~4 s of CPU, once per forked worker) is stood in for by a bare package of the same folder,
# which runs it only if something (a credential provider) asks it for a name it lacks.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_AGENT_BOOT = """
import os, sys, types
package = types.ModuleType("wds_datapipes")
package.__path__, package.__package__ = [sys.argv[1]], "wds_datapipes"
package.__file__ = os.path.join(sys.argv[1], "__init__.py")

def load_whole(name):
    del package.__getattr__
    with open(package.__file__) as source:
        exec(compile(source.read(), package.__file__, "exec"), package.__dict__)
    return getattr(package, name)

package.__getattr__ = load_whole
sys.modules["wds_datapipes"] = package
from wds_datapipes.storage import store_agent
store_agent.serve(sys.stdin.buffer, sys.stdout.buffer)
"""


def _agent() -> _Agent:
    global _the_agent
    if _the_agent is None or _the_agent.pid != os.getpid() or _the_agent.ended is not None:
        _the_agent = _Agent()
    return _the_agent


def _send(pipe, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(struct.pack("<Q", len(data)) + data)


def _receive(pipe):
    head = _read_exactly(pipe, 8)
    return pickle.loads(_read_exactly(pipe, struct.unpack("<Q", head)[0]))


def _read_exactly(pipe, count: int) -> bytes:
    parts, left = [], count
    while left:
        chunk = pipe.read(left)
        if not chunk:
            raise StoreFailure(TRANSIENT, "the object-store agent process ended")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _receive_within(proc: subprocess.Popen, bound_s: float):
    """The agent's next answer, waited for at most ``bound_s`` seconds in all; raises
    :class:`_AgentLost` where the agent ends first or the time runs out."""
    deadline = time.monotonic() + bound_s
    pipe = proc.stdout
    head = _read_within(proc, pipe, 8, deadline, bound_s)
    return pickle.loads(_read_within(proc, pipe, struct.unpack("<Q", head)[0], deadline, bound_s))


def _read_within(proc: subprocess.Popen, pipe, count: int, deadline: float, bound_s: float) -> bytes:
    parts, left = [], count
    while left:
        wait = deadline - time.monotonic()
        if wait <= 0 or not select.select([pipe], [], [], wait)[0]:
            raise _AgentLost(f"did not answer within {bound_s:.0f} s")
        chunk = pipe.read(left)  # a raw pipe: what is there, at most left; b"" once the agent ended
        if not chunk:
            try:
                code = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            raise _AgentLost(f"ended (exit code {code})")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)
