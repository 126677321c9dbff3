"""Installing the aisnode binary: built once with Go, kept in the cache folder."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .config import ClusterError, cache_dir

AISTORE_MODULE = "github.com/NVIDIA/aistore"
AISTORE_VERSION = "v1.5.0"
GO_VERSION = "1.26"
BUILD_TAGS = "dsort"

logger = logging.getLogger("aisio.cluster")


def aisnode_path() -> Path:
    """Where the node binary is kept between runs: ``<cache>/bin/aisnode``."""
    return cache_dir() / "bin" / "aisnode"


def ensure_aisnode() -> Path:
    """The path of the aisnode binary, building it with Go first when it is missing.

    It runs ``go install -tags dsort github.com/NVIDIA/aistore/cmd/aisnode@v1.5.0``. Where
    that fails (a Go module proxy that serves the version but refuses the version list makes
    ``go install``'s deprecation lookup fatal), it builds the same package from a throw-away
    wrapper module that requires ``github.com/NVIDIA/aistore v1.5.0``. Either takes minutes.
    Progress is logged to the ``aisio.cluster`` logger.
    """
    binary = aisnode_path()
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    go = shutil.which("go")
    if go is None:
        raise ClusterError(
            f"aisnode is not installed at {binary} and Go is not on PATH: install Go "
            f">= {GO_VERSION} (https://go.dev/dl) or copy an aisnode binary built with "
            f"'-tags {BUILD_TAGS}' there"
        )
    binary.parent.mkdir(parents=True, exist_ok=True)
    pkg = f"{AISTORE_MODULE}/cmd/aisnode"
    env = dict(os.environ, GOBIN=str(binary.parent))
    cmd = [go, "install", "-tags", BUILD_TAGS, f"{pkg}@{AISTORE_VERSION}"]
    logger.info("installing aisnode: %s (GOBIN=%s; takes minutes)", " ".join(cmd), binary.parent)
    first = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True)
    if first.returncode == 0 and binary.is_file():
        logger.info("installed %s", binary)
        return binary
    logger.info("go install failed (%s); building from a wrapper module instead", _last_lines(first.stderr, 3))
    with tempfile.TemporaryDirectory(prefix="aisbuild-") as tmp:
        Path(tmp, "go.mod").write_text(
            f"module aisbuild\n\ngo {GO_VERSION}\n\nrequire {AISTORE_MODULE} {AISTORE_VERSION}\n"
        )
        partial = binary.with_name(binary.name + ".partial")
        cmd = [go, "build", "-mod=mod", "-tags", BUILD_TAGS, "-o", str(partial), pkg]
        logger.info("in %s: %s", tmp, " ".join(cmd))
        second = subprocess.run(cmd, check=False, cwd=tmp, env=env, capture_output=True, text=True)
        if second.returncode != 0 or not partial.is_file():
            raise ClusterError(
                "cannot build aisnode:\n  go install: "
                + _last_lines(first.stderr, 10)
                + "\n  wrapper-module build: "
                + _last_lines(second.stderr, 20)
            )
        partial.chmod(partial.stat().st_mode | 0o111)
        partial.replace(binary)
    logger.info("built %s", binary)
    return binary


def _last_lines(text: str, n: int) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return "\n    ".join(lines[-n:]) or "(no output)"
