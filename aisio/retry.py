"""How long aisio keeps trying: a budget in time, with backoff, per object and per listing page.

A node that dies takes the cluster tens of seconds to route around (its primary drops it
from the cluster map after missed keepalives: 28-38 s with AIStore's defaults). A read
or a listing page therefore retries until it has gone :attr:`RetryPolicy.budget_s`
seconds (default 60) without progress, waiting 0.1 s, 0.2 s, ... up to 2 s between
tries, every request's timeouts cut to the time left. ``$AISIO_RETRY_BUDGET`` sets the
budget for a process and the DataLoader workers it starts (:func:`set_retry_budget`).
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass

RETRY_BUDGET_ENV = "AISIO_RETRY_BUDGET"
DEFAULT_BUDGET_S = 60.0
_MIN_TIMEOUT_S = 0.05


@dataclass(frozen=True)
class RetryPolicy:
    """Retry settings for one kind of request.

    Args:
        budget_s: seconds a read or page may go without progress before it fails.
        first_wait_s, max_wait_s: the backoff between tries (doubling, with jitter).
        connect_timeout_s, read_timeout_s: per-request limits, cut to the budget left.
    """

    budget_s: float = DEFAULT_BUDGET_S
    first_wait_s: float = 0.1
    max_wait_s: float = 2.0
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 15.0

    def __post_init__(self):
        if not self.budget_s >= 0:
            raise ValueError(f"the retry budget must be >= 0 seconds, got {self.budget_s!r}")

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


def set_retry_budget(seconds: float) -> None:
    """Set how long reads and listings retry without progress, for this process and the
    worker processes it starts later (``$AISIO_RETRY_BUDGET``)."""
    RetryPolicy(budget_s=float(seconds))  # validate
    os.environ[RETRY_BUDGET_ENV] = repr(float(seconds))


class Attempts:
    """The state of one retry loop: time left, the next wait, and what failed so far.

    ``progress()`` restarts the budget (bytes arrived); ``failed(why)`` records a failure and
    sleeps before the next try, or returns ``False`` when the budget is spent.
    """

    def __init__(self, policy: RetryPolicy):
        self.policy = policy
        self.started = time.monotonic()
        self.tries = 0
        self.failures: list[str] = []
        self.progress()

    def progress(self, at: float | None = None) -> None:
        """Bytes arrived (at ``at``, a ``time.monotonic()`` value; default: now): the budget restarts then."""
        self._deadline = (time.monotonic() if at is None else at) + self.policy.budget_s
        self._wait = self.policy.first_wait_s

    def remaining(self) -> float:
        return self._deadline - time.monotonic()

    def timeouts(self) -> tuple[float, float]:
        """(connect, read) timeouts for the next request: the policy's, cut to the time left."""
        left = max(self.remaining(), _MIN_TIMEOUT_S)
        return min(self.policy.connect_timeout_s, left), min(self.policy.read_timeout_s, left)

    def failed(self, why: str) -> bool:
        """Record a failed try; sleep and return ``True`` if another try fits in the budget."""
        self.tries += 1
        self.failures.append(why)
        left = self.remaining()
        if left <= 0:
            return False
        time.sleep(min(self._wait * random.uniform(0.5, 1.0), left))
        self._wait = min(self._wait * 2, self.policy.max_wait_s)
        return self.remaining() > 0

    def summary(self) -> str:
        """What was tried: how many times, for how long, the first and the last failure."""
        elapsed = time.monotonic() - self.started
        head = f"{self.tries} {'try' if self.tries == 1 else 'tries'} in {elapsed:.1f} s (retry budget {self.policy.budget_s:g} s without progress)"
        if not self.failures:
            return head
        if len(self.failures) == 1 or self.failures[0] == self.failures[-1]:
            return f"{head}; {self.failures[-1]}"
        return f"{head}; first: {self.failures[0]}; last: {self.failures[-1]}"
