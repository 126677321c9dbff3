"""How long aisio keeps trying: a budget in time, with backoff, per object and per listing page.

A node that dies takes the cluster tens of seconds to route around (its primary drops it
from the cluster map after missed keepalives: 28-38 s with AIStore's defaults). A read
or a listing page therefore retries until it has gone :attr:`RetryPolicy.budget_s`
seconds (default 60) without progress, waiting 0.1 s, 0.2 s, ... up to 2 s between
tries, every request's timeouts cut to the time left. ``$AISIO_RETRY_BUDGET`` sets the
budget for a process and the DataLoader workers it starts (:func:`set_retry_budget`).

The policy itself is the one every remote stream shares,
:mod:`wds_datapipes.storage.retry`; its names are kept here.
"""

from __future__ import annotations

import os

from wds_datapipes.storage.retry import DEFAULT_BUDGET_S, RETRY_BUDGET_ENV, Attempts, RetryPolicy

__all__ = ["DEFAULT_BUDGET_S", "RETRY_BUDGET_ENV", "Attempts", "RetryPolicy", "set_retry_budget"]


def set_retry_budget(seconds: float) -> None:
    """Set how long reads and listings retry without progress, for this process and the
    worker processes it starts later (``$AISIO_RETRY_BUDGET``)."""
    RetryPolicy(budget_s=float(seconds))  # validate
    os.environ[RETRY_BUDGET_ENV] = repr(float(seconds))
