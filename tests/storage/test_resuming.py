"""ResumingStream, the one resume loop of every remote stream, against the plain bytes of the object.

A back end of memory (no sockets) answers each request as a generated schedule says: a body
cut at a random byte (by a reset, or by ending early), a stall, an answer that ignores the
Range header, a 503, an object replaced between requests. Oracle: the object's bytes from
``start`` on. A read that ends without an error returned exactly them (each byte once, none
wrong); one that ends in an error is our ShardReadError/ShardOpenError naming the URL, and
what it returned before is a prefix of them.
"""

from __future__ import annotations

import io
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wds_datapipes.errors import ShardOpenError, ShardReadError
from wds_datapipes.storage.resuming import Opened, ResumingStream, content_range, skip
from wds_datapipes.storage.retry import Attempts, RetryPolicy

FAULTS = ("ok", "cut", "reset", "stall", "ignore-range", "503", "change", "wrong-range")


class _Unavailable(Exception):
    """A 503: retryable."""


class _Body:
    """A body of ``data`` that gives its bytes until ``cut`` and then fails as ``how`` says."""

    def __init__(self, data: bytes, cut: int | None, how: str):
        self.data, self.cut, self.how, self.at = data, cut, how, 0
        self.closed = False

    def readinto(self, view) -> int:
        end = len(self.data) if self.cut is None else self.cut
        if self.at >= end:
            if self.cut is None or self.how == "cut":
                return 0  # the end, or a cut the size must catch
            raise ConnectionResetError("reset") if self.how == "reset" else TimeoutError("timed out")
        n = min(len(view), end - self.at, 7_000)  # one network read gives a part
        view[:n] = self.data[self.at : self.at + n]
        self.at += n
        return n

    def read(self, n: int) -> bytes:
        buffer = bytearray(n)
        return bytes(buffer[: self.readinto(memoryview(buffer))])

    def close(self) -> None:
        self.closed = True


class _MemoryStream(ResumingStream):
    """An object in memory, each request answered as ``schedule[i]`` says (then ``ok``)."""

    def __init__(self, versions: list[bytes], schedule: list[tuple[str, float]], start: int, retries: int):
        self.versions, self.schedule, self.current, self.requests = versions, schedule, 0, 0
        self.bodies: list[_Body] = []
        super().__init__("mem://bucket/object.tar", start,
                         RetryPolicy(budget_s=math.inf, first_wait_s=0, max_wait_s=0, max_retries=retries))

    def _request(self, offset: int) -> Opened:
        fault, where = self.schedule[self.requests] if self.requests < len(self.schedule) else ("ok", 0.0)
        self.requests += 1
        if fault == "503":
            raise _Unavailable("HTTP 503")
        if fault == "change" and self.current + 1 < len(self.versions):
            self.current += 1
        data = self.versions[self.current]
        version = f"v{self.current}"
        if offset > len(data):
            raise ShardOpenError(self.url, f"byte {offset} is beyond the object's end")
        whole = fault == "ignore-range"
        first = 0 if whole else offset + (1 if fault == "wrong-range" and offset < len(data) else 0)
        rest = data[first:]
        cut = int(where * len(rest)) if fault in ("cut", "reset", "stall") else None
        body = _Body(rest, cut, fault)
        self.bodies.append(body)
        return Opened(body, None if whole else first, len(data), version, f"bytes {first}-/{len(data)}")

    def _retryable(self, exn: BaseException) -> bool:
        return isinstance(exn, (_Unavailable, ConnectionError, TimeoutError))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(size=st.integers(0, 30_000), start_at=st.floats(0, 1),
       schedule=st.lists(st.tuples(st.sampled_from(FAULTS), st.floats(0, 1)), max_size=12),
       retries=st.integers(0, 4), read_size=st.sampled_from([97, 4096, 65536]))
def test_resuming_stream_gives_the_objects_bytes_once_or_a_clear_error(size, start_at, schedule, retries, read_size):
    """Oracle: the object's bytes from ``start``: the whole rest, or a prefix of it and our error."""
    versions = [bytes((i * 7 + 3) % 251 for i in range(size)), bytes((i * 5 + 1) % 253 for i in range(size + 3))]
    start = int(start_at * size)
    got = bytearray()
    try:
        stream = _MemoryStream(versions, schedule, start, retries)
    except ShardOpenError as exn:  # before the first byte: the open fails (ShardReadError is one too)
        assert exn.url == "mem://bucket/object.tar"
        return
    expected = versions[int(stream.version[1:])][start:]  # the object as the first answer found it
    try:
        while chunk := stream.read(read_size):
            got += chunk
    except ShardReadError as exn:
        assert exn.url == "mem://bucket/object.tar" and exn.offset == start + len(got)
        assert expected.startswith(bytes(got)), "a byte was lost, repeated or wrong before the error"
        assert ("changed while it was read" in exn.reason or "gave up after" in exn.reason
                or "asked for bytes" in exn.reason), exn.reason
        return
    finally:
        stream.close()
    assert bytes(got) == expected
    assert stream.position == start + len(expected) and stream.size == start + len(expected)
    assert all(body.closed for body in stream.bodies)


def test_a_stream_that_keeps_failing_without_progress_names_the_url_the_failure_and_the_tries():
    with pytest.raises(ShardReadError, match=r"gave up after 2 retries in a row without progress, 3 failed tries"):
        stream = _MemoryStream([b"x" * 1000], [("cut", 0.5)] + [("cut", 0.0)] * 5, 0, retries=2)
        stream.read()


def test_progress_restarts_the_retry_count():
    """Each answer cut after a few bytes more: 20 cuts with 1 retry allowed in a row still read it all."""
    data = bytes(range(256)) * 40
    schedule = [("cut", 0.05)] * 20
    stream = _MemoryStream([data], schedule, 0, retries=1)
    assert stream.read() == data and stream.resumes == 20


def test_content_range_reads_every_form_and_nothing_else():
    assert content_range("bytes 5-999/1000") == (5, 999, 1000)
    assert content_range("bytes */1000") == (None, None, 1000)
    assert content_range("bytes 0-9/*") == (0, 9, None)
    assert content_range(None) == (None, None, None)
    assert content_range("items 0-9/10") == (None, None, None)


def test_skip_says_how_many_bytes_were_missing():
    assert skip(io.BytesIO(b"x" * 10), 4) == 0
    assert skip(io.BytesIO(b"x" * 10), 14) == 4


def test_attempts_stop_after_max_retries_in_a_row_and_restart_on_progress():
    attempts = Attempts(RetryPolicy(budget_s=math.inf, first_wait_s=0, max_wait_s=0, max_retries=1))
    assert attempts.failed("a") and not attempts.failed("b")
    attempts.progress()
    assert attempts.failed("c")
