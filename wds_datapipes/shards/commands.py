"""``pipe:CMD`` shards: a shell command's standard output as a stream (the ``pipe`` back end's open)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time

from ..errors import ShardOpenError, ShardReadError
from ..limits import Limits, get_limits


class CommandStream:
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
