"""What a process of a stats run is doing now: each thread's stack, and the shard it opens or reads.

The stall watchdog (:mod:`.watchdog`) asks for it. The shard a thread waits on is known in one
of two ways, neither of which costs anything per sample:

- a stream's reader keeps one note per thread, made where a shard is opened (:func:`note_shard`:
  once per shard, a dict store); its byte offset is the timed stream's own count of the bytes it
  returned (one increment per read call);
- a positional reader (reads by member places, which jump between shards sample by sample) marks
  its functions with :func:`waits_on`: a thread found inside one of them waits on the shard that
  function's locals name, at the offset its pending read starts at. Only the watchdog's request
  looks: the marked functions run as they are.

A loader worker answers the watchdog's request (``stall.request`` in the run folder)
from its publishing thread (:mod:`.recorder`: one ``stat`` per publication), writing
``stall-<request>-p<pid>.stack``: another thread than the one reading, so a worker whose main
thread waits on a socket still answers. Nothing here runs while stats are off.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any
from urllib.parse import urlsplit

REQUEST = "stall.request"
ANSWER_SUFFIX = ".stack"

_notes: dict[int, ShardNote] = {}  # by thread id: the shard each thread opened last
_waits: dict[CodeType, Callable[[dict], tuple]] = {}  # functions whose thread waits on a shard (waits_on)


class ShardNote:
    """The shard a thread opened last: its URL (secrets redacted), its server, when it was opened,
    and once open the timed stream whose ``offset`` is the next byte the reader waits for."""

    __slots__ = ("host", "opened_ns", "start", "stream", "url")

    def __init__(self, url: str, start: int = 0):
        from ..errors import redact

        self.url = redact(str(url))
        self.host = host_of(self.url)
        self.opened_ns = time.monotonic_ns()
        self.start = start  # the shard's byte the stream begins at
        self.stream: Any = None

    def row(self) -> dict:
        """The note as plain values: ``url``, ``host``, ``phase`` (``opening``, ``reading`` or
        ``closed``: read to its end or dropped), ``offset`` (bytes of the shard returned so far:
        the next read starts there; None while opening), ``seconds`` since it was opened."""
        stream = self.stream
        if stream is None:
            phase, offset = "opening", None
        else:
            offset = self.start + stream.offset
            try:
                phase = "closed" if stream.closed else "reading"
            except Exception:  # noqa: BLE001 - a stream that cannot tell is still being read
                phase = "reading"
        return {"url": self.url, "host": self.host, "phase": phase, "offset": offset,
                "seconds": round((time.monotonic_ns() - self.opened_ns) * 1e-9, 3)}


def note_shard(url: str, start: int = 0) -> ShardNote:
    """This thread opens the shard ``url`` now (from byte ``start``): its note, for the watchdog
    (set ``stream`` once open)."""
    note = _notes[threading.get_ident()] = ShardNote(url, start)
    return note


def waits_on(where: Callable[[dict], tuple[Any, str, int | None]]) -> Callable:
    """Marks a function a thread may wait on a shard in: ``where(its locals)`` gives ``(url,
    phase, offset)``: the shard, ``opening`` or ``reading``, and the byte its pending read starts
    at (None while opening). The function is returned as it is: nothing runs per call."""
    def mark(function: Callable) -> Callable:
        _waits[function.__code__] = where
        return function
    return mark


def _waited_on(frame: FrameType | None) -> dict | None:
    """The shard the innermost function marked by :func:`waits_on` in ``frame``'s chain waits on, as a
    note's row (``seconds``: None, not known); None where no marked function is running."""
    from ..errors import redact

    while frame is not None:
        where = _waits.get(frame.f_code)
        if where is not None:
            try:
                url, phase, offset = where(frame.f_locals)
            except Exception:  # noqa: BLE001 - locals not set yet (the function just began)
                return None
            url = redact(str(url))
            return {"url": url, "host": host_of(url), "phase": phase,
                    "offset": None if offset is None or offset < 0 else int(offset), "seconds": None}
        frame = frame.f_back
    return None


def host_of(url: str) -> str:
    """The server a URL names (``host:port``), ``local`` for a file, ``command`` for ``pipe:``."""
    try:
        parts = urlsplit(url)
        if parts.scheme in ("", "file") or len(parts.scheme) == 1:  # a path (a Windows drive: c:)
            return "local"
        if parts.scheme == "pipe":
            return "command"
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return ""
    return f"{host}:{port}" if port else host


def process_threads() -> list[dict]:
    """Every thread of this process but the caller: ``thread`` (its name), ``stack`` (its frames,
    outermost first, as ``traceback.format_stack`` gives them) and ``shard``: where it runs a
    function marked by :func:`waits_on`, the shard that names; else its note's row; else None."""
    from ..errors import redact

    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident in [i for i in _notes if i not in frames]:  # threads that ended
        _notes.pop(ident, None)
    me = threading.get_ident()
    threads = []
    for ident, frame in frames.items():
        if ident == me:
            continue
        note = _notes.get(ident)
        shard = _waited_on(frame) if _waits else None
        if shard is None and note is not None:
            shard = note.row()
        threads.append({"thread": names.get(ident, f"thread {ident}"),
                        "stack": [redact(line) for line in traceback.format_stack(frame)],
                        "shard": shard})
    threads.sort(key=lambda t: (t["shard"] is None, t["thread"] != "MainThread"))  # the readers first
    return threads


def process_row(rank: int, worker: int) -> dict:
    """This process as the watchdog reports it: ``pid``, ``rank``, ``worker`` and its ``threads``."""
    return {"pid": os.getpid(), "rank": rank, "worker": worker, "threads": process_threads()}


def answer_request(recorder: Any, seen: tuple | None) -> tuple | None:
    """A loader worker's publishing thread, once per publication: where the watchdog asked since
    ``seen`` (the request file's stamp), writes this process's row as its answer; returns the
    stamp now seen."""
    directory = recorder.settings.directory
    path = os.path.join(directory, REQUEST)
    try:
        info = os.stat(path)
    except OSError:
        return seen
    stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
    if stamp == seen:
        return seen
    try:
        with open(path) as source:
            request = json.load(source)
        answer = os.path.join(directory, f"stall-{int(request['n'])}-p{os.getpid()}{ANSWER_SUFFIX}")
        row = process_row(recorder.rank, recorder.worker)
        with open(f"{answer}.part", "w") as out:
            json.dump(row, out)
        os.replace(f"{answer}.part", answer)  # the watchdog reads a whole answer or none
    except (OSError, ValueError, KeyError, TypeError):  # a request replaced meanwhile, or the run ended
        pass
    return stamp


__all__ = ["ShardNote", "answer_request", "host_of", "note_shard", "process_row", "process_threads", "waits_on"]
