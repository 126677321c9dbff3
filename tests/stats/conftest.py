"""What the stats tests share: stats turned on for one test (and off after it), and no HTTP
proxy between the tests and their local servers. Shards and loaders: ``stats_data``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import wds_datapipes as wd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "shards"))  # shard_server, the one home of it


@pytest.fixture
def stats_on():
    """Stats on for the test (a run folder of its own), off and removed after it."""
    settings = wd.stats.enable(interval_s=0.2)
    try:
        yield settings
    finally:
        wd.stats.disable()


@pytest.fixture
def stall_log():
    """The stall watchdog's log records (``stall_log.Stalls``) while the test runs."""
    import logging

    from stall_log import Stalls

    logger = logging.getLogger("wds_datapipes.stats")
    handler = Stalls()
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
