"""A test server as a process: started in its own process group with its output in a log file,
waited for until it answers, and stopped whole (every process of its group, then a check that
none is left), from the process that started it or from any other (:func:`stop_group`)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path


class ServerError(RuntimeError):
    """A test server could not be installed or started (the message says why, with its log tail)."""


class ServerUnavailable(ServerError):
    """What a server needs is not on this machine (no Go, no Node): tests skip, except in CI."""


class _Process:
    """A server in its own process group, its output in a log file, stopped whole."""

    def __init__(self, name: str, argv: list[str], workdir: Path):
        self.name = name
        self.log_path = workdir / f"{name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop, or by detach)
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=workdir, start_new_session=True)

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)

    def wait_ready(self, probe: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"{self.name} exited with status {self.proc.returncode} before answering; "
                                  f"its log ends:\n{self.log_tail()}")
            if probe():
                return
            time.sleep(0.05)
        self.stop()
        raise ServerError(f"{self.name} did not answer within {timeout:.0f} s; its log ends:\n{self.log_tail()}")

    def stop(self, grace: float = 10.0) -> None:
        """Ends the whole process group (SIGTERM, then SIGKILL after ``grace`` s) and checks none of it is left."""
        self._log.close()
        stop_group(self.name, self.proc.pid, grace, reap=self.proc.wait)

    def detach(self) -> None:
        """Lets the server outlive this object (and this process): another process stops it with
        :func:`stop_group`. The log file stays open in the server alone."""
        self._log.close()
        _DETACHED.append(self.proc)  # reaped by stop_group where this process is the one that stops it


_DETACHED: list[subprocess.Popen] = []


def stop_group(name: str, group: int, grace: float = 10.0, reap: Callable[[float], object] | None = None) -> None:
    """Ends process group ``group`` (SIGTERM; SIGKILL to what is left after ``grace`` s) and raises
    :class:`ServerError` when a process of it outlives that. ``reap`` waits for the group's
    leader where it is this process's child; a detached child of this process is reaped too."""
    for proc in [p for p in _DETACHED if p.pid == group]:
        _DETACHED.remove(proc)
        reap = proc.wait
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGTERM)
    if not _gone(group, grace, reap):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        _gone(group, grace, reap)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)  # any child left behind by the leader
    left = group_members(group)
    if left:
        raise ServerError(f"{name}: processes {left} of its group outlived it")


def _gone(group: int, timeout: float, reap: Callable[[float], object] | None) -> bool:
    """Waits up to ``timeout`` s for the group to have no live process; whether it has none."""
    deadline = time.monotonic() + timeout
    if reap is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            reap(timeout)
    while group_members(group):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def launch(name: str, workdir: Path, timeout: float, probe_path: str,
           argv_for: Callable[[int], list[str]]) -> tuple[_Process, str]:
    """Starts a server on a free port and waits until ``GET <it><probe_path>`` answers; a port
    taken between choosing and binding it is tried again with another (twice)."""
    for attempt in range(3):
        port = free_port()
        endpoint = f"http://127.0.0.1:{port}"
        server = _Process(name, argv_for(port), workdir)
        try:
            server.wait_ready(lambda: _answers(endpoint + probe_path), timeout)  # noqa: B023 (used at once)
            return server, endpoint
        except ServerError as exn:
            server.stop()
            if attempt == 2 or not any(w in str(exn).lower() for w in ("in use", "eaddrinuse")):
                raise
    raise AssertionError("unreachable")


def group_members(group: int) -> list[int]:
    """The live (not zombie) processes of process group ``group``, read from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != b"Z":
            found.append(int(entry))
    return found


def free_port() -> int:
    """A TCP port of 127.0.0.1 that no one listens on now (a server's, or a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    """Whether an HTTP server answers at ``url`` (any status)."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a server's log file."""
    try:
        return tail(path.read_text(errors="replace"), lines)
    except OSError:
        return "(no log)"


def tail(text: str, lines: int = 20) -> str:
    return "\n".join((text or "").strip().splitlines()[-lines:]) or "(empty)"
