"""The shard cache's tests: remote shards served by tests/shards/shard_server.py, the cache off after each
(``no_cache_left_on``, in tests/conftest.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "shards"))  # shard_server, the one home of it
