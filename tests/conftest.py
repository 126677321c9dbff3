"""Shared fixtures for the core tests: shards written into the test's own temp dir."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import webdataset as wds

# The session's servers (AIStore, its S3 API, Azurite, fake-gcs-server) and the fault proxy, for every folder.
from server_fixtures import (  # noqa: F401
    ais_endpoint,
    azure_server,
    fault_proxy,
    gcs_server,
    object_server,
    pytest_collection_modifyitems,
    s3_server,
)

# One run's servers shared by its processes (pytest-xdist's controller and workers), stopped at its end.
from shared_servers import (  # noqa: F401
    pytest_configure,
    pytest_configure_node,
    pytest_sessionfinish,
    pytest_terminal_summary,
)


@pytest.fixture
def make_shards(tmp_path: Path) -> Callable[..., list[str]]:
    """Writes ``n_shards`` shards of ``n_samples`` samples each with webdataset's TarWriter.

    Keys are unique across shards (``<prefix>-<shard>-<sample>``); each sample has a
    ``cls`` (its global index) and a ``txt`` field. Returns the shard paths, in order.
    """

    def make(n_shards: int, n_samples: int, prefix: str = "s", gz: bool = False) -> list[str]:
        suffix = ".tar.gz" if gz else ".tar"
        paths = []
        for shard in range(n_shards):
            path = tmp_path / f"{prefix}-{shard:03d}{suffix}"
            with wds.TarWriter(str(path), compress=gz) as writer:
                for i in range(n_samples):
                    index = shard * n_samples + i
                    writer.write({
                        "__key__": f"{prefix}-{shard:03d}-{i:03d}",
                        "cls": str(index).encode(),
                        "txt": f"sample {index} of shard {shard}".encode(),
                    })
            paths.append(str(path))
        return paths

    return make



@pytest.fixture
def sized_shards(tmp_path: Path) -> Callable[..., list[str]]:
    """Writes one shard per entry of ``sizes`` (that many samples each), with keys unique
    across shards (``<prefix><shard>-<sample>``), a ``cls`` and a ``txt`` per sample."""

    def make(sizes, prefix: str = "u", gz: bool = False, folder: Path | None = None) -> list[str]:
        folder = folder or tmp_path
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for shard, n in enumerate(sizes):
            path = folder / f"{prefix}-{shard:03d}.tar{'.gz' if gz else ''}"
            with wds.TarWriter(str(path), compress=gz) as writer:
                for i in range(n):
                    writer.write({"__key__": f"{prefix}{shard}-{i:04d}", "cls": str(i).encode(),
                                  "txt": f"sample {i} of shard {shard} ".encode() * (1 + i % 7)})
            paths.append(str(path))
        return paths

    return make



@pytest.fixture
def no_cache_left_on(monkeypatch):
    """No proxy between a test and its local servers, and the shard cache off again after it
    (the cache's tests, and the HTTP tests that turn it on)."""
    import wds_datapipes as wd

    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    yield
    wd.set_cache(None)
