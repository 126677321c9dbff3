"""The one retry policy of every remote stream and listing: a budget that restarts on progress.

A read retries a failed request or a broken body until it has gone
:attr:`RetryPolicy.budget_s` seconds, or :attr:`RetryPolicy.max_retries` tries in a row,
without a byte arriving; bytes that arrived since the last failure restart both (a
multi-GB shard read slowly over a flaky network is never given up on while it moves).
Waits between tries double from ``first_wait_s`` to ``max_wait_s`` (with jitter), and
each request's timeouts are cut to the time left.

Two sources of settings: :meth:`RetryPolicy.for_limits` (``Limits.http_retries`` and
``Limits.http_timeout``, the knobs of ``http(s)://`` and object-store streams; they travel
pickled with the pipe) and :meth:`RetryPolicy.from_env` (aisio's 60 s time budget,
``$AISIO_RETRY_BUDGET``). :class:`Attempts` is the state of one retry loop.
"""

from __future__ import annotations

import datetime
import email.utils
import math
import os
import random
import time
from dataclasses import dataclass

from ..limits import Limits, get_limits
from ..stats.probe import retried as count_retry

RETRY_BUDGET_ENV = "AISIO_RETRY_BUDGET"
DEFAULT_BUDGET_S = 60.0
_MIN_TIMEOUT_S = 0.05
RETRY_AFTER_CAP_S = 30.0  # the longest a server's Retry-After is waited (within the budget left)


@dataclass(frozen=True)
class RetryPolicy:
    """Retry settings for one kind of request.

    Args:
        budget_s: seconds a read or page may go without progress before it fails (``inf``: no limit in time).
        first_wait_s, max_wait_s: the backoff between tries (doubling, with jitter).
        connect_timeout_s, read_timeout_s: per-request limits, cut to the budget left
            (the read timeout is the stall timeout: a body silent this long counts as broken).
        max_retries: at most this many retries in a row without progress (None: the budget decides).
        named: where a user changes these settings, for error messages (``"Limits.http_retries"``).
    """

    budget_s: float = DEFAULT_BUDGET_S
    first_wait_s: float = 0.1
    max_wait_s: float = 2.0
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 15.0
    max_retries: int | None = None
    named: str = ""

    def __post_init__(self):
        if not self.budget_s >= 0:
            raise ValueError(f"the retry budget must be >= 0 seconds, got {self.budget_s!r}")
        if self.max_retries is not None and not self.max_retries >= 0:
            raise ValueError(f"max_retries must be >= 0 or None, got {self.max_retries!r}")

    @classmethod
    def from_env(cls) -> RetryPolicy:
        """The default policy, with the budget of ``$AISIO_RETRY_BUDGET`` when it is set."""
        raw = os.environ.get(RETRY_BUDGET_ENV)
        if not raw:
            return cls()
        try:
            return cls(budget_s=float(raw))
        except ValueError:
            raise ValueError(f"${RETRY_BUDGET_ENV} must be a number of seconds, got {raw!r}") from None

    @classmethod
    def for_limits(cls, limits: Limits | None = None, *, first_wait_s: float = 0.5,
                   max_wait_s: float = 8.0) -> RetryPolicy:
        """The policy of ``http(s)://`` and object-store streams: ``limits.http_retries`` retries in
        a row without progress, each request stalling at most ``limits.http_timeout`` seconds
        (0: no timeout), no limit in time; waits of 0.5, 1, 2, 4, 8 s."""
        limits = limits or get_limits()
        timeout = limits.http_timeout or math.inf
        return cls(budget_s=math.inf, first_wait_s=first_wait_s, max_wait_s=max_wait_s, connect_timeout_s=timeout,
                   read_timeout_s=timeout, max_retries=int(limits.http_retries), named="Limits.http_retries")


class Attempts:
    """The state of one retry loop: time and retries left, the next wait, and what failed so far.

    ``progress()`` restarts the budget (bytes arrived); ``failed(why)`` records a failure and
    sleeps before the next try, or returns ``False`` when the budget is spent.
    """

    def __init__(self, policy: RetryPolicy):
        self.policy = policy
        self.started = time.monotonic()
        self.tries = 0  # failed tries in all
        self.retried = 0  # retries since the last progress
        self.failures: list[str] = []
        self.progress()

    def progress(self, at: float | None = None) -> None:
        """Bytes arrived (at ``at``, a ``time.monotonic()`` value; default: now): the budget restarts then."""
        self._deadline = (time.monotonic() if at is None else at) + self.policy.budget_s
        self._wait = self.policy.first_wait_s
        self.retried = 0

    def remaining(self) -> float:
        return self._deadline - time.monotonic()

    def timeouts(self) -> tuple[float, float]:
        """(connect, read) timeouts for the next request: the policy's, cut to the time left
        (``inf`` where neither limits it)."""
        left = max(self.remaining(), _MIN_TIMEOUT_S)
        return min(self.policy.connect_timeout_s, left), min(self.policy.read_timeout_s, left)

    def failed(self, why: str, retry_after: float | None = None) -> bool:
        """Record a failed try; sleep and return ``True`` if another try fits in the budget.
        ``retry_after``: the seconds the server's answer asked to wait (``Retry-After``): the
        wait is at least that, up to :data:`RETRY_AFTER_CAP_S`, never past the budget."""
        self.tries += 1
        self.failures.append(why)
        if self.policy.max_retries is not None and self.retried >= self.policy.max_retries:
            return False
        left = self.remaining()
        if left <= 0:
            return False
        self.retried += 1
        count_retry()  # stats, where on: a retry of the I/O this thread is doing (its stage, source, scheme)
        wait = self._wait * random.uniform(0.5, 1.0)
        if retry_after is not None and retry_after > 0:
            wait = max(wait, min(retry_after, RETRY_AFTER_CAP_S))
        time.sleep(min(wait, left))
        self._wait = min(self._wait * 2, self.policy.max_wait_s)
        return self.remaining() > 0

    def summary(self) -> str:
        """What was tried: how many times, for how long, the first and the last failure."""
        elapsed = time.monotonic() - self.started
        if math.isinf(self.policy.budget_s):
            limit = f"{self.policy.max_retries} retries in a row without progress"
        else:
            limit = f"retry budget {self.policy.budget_s:g} s without progress"
        head = f"{self.tries} {'try' if self.tries == 1 else 'tries'} in {elapsed:.1f} s ({limit})"
        if not self.failures:
            return head
        if len(self.failures) == 1 or self.failures[0] == self.failures[-1]:
            return f"{head}; {self.failures[-1]}"
        return f"{head}; first: {self.failures[0]}; last: {self.failures[-1]}"

    def gave_up(self, why: str) -> str:
        """The reason of the error that ends a stream after ``why`` failed one time too many."""
        elapsed = time.monotonic() - self.started
        where = f"; {self.policy.named}" if self.policy.named else ""
        return (f"{why} (gave up after {self.retried} retries in a row without progress, "
                f"{self.tries} failed tries in {elapsed:.1f} s{where})")


def retry_after(value: str | None) -> float | None:
    """The seconds a ``Retry-After`` header asks to wait (a number of seconds, or an HTTP
    date), None where it is absent or unreadable; never negative."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0.0, (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds())
