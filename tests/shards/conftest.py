"""What the shard cache's tests share: no proxy between them and their local servers, and
the cache off again after each."""

from __future__ import annotations

import pytest

import wds_datapipes as wd


@pytest.fixture
def no_cache_left_on(monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    yield
    wd.set_cache(None)
