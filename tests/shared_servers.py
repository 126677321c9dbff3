"""The servers of one test run, each started once and shared by all the run's processes.

A run of pytest is one process, or, with pytest-xdist (``-n N``), a controller and N workers.
The controller makes a folder for the run (:func:`pytest_configure`) and hands its path to
each worker (:func:`pytest_configure_node`). The first process that needs a server starts it
while holding the run's lock of that server, and writes a record beside the lock (endpoint,
process group, log); the other processes wait on the lock, read the record and use the same
server. The server outlives the worker that started it (its own session, the log file its
own). The controller stops every recorded server at the end of the run
(:func:`pytest_sessionfinish`), once its workers have finished, and removes the folder; a
server that does not stop whole fails the run and is named in the summary.

The servers: the emulators of :data:`object_servers.EMULATORS` (each process reaches them
through :func:`emulator`) and the AIStore cluster (:func:`ais_cluster`). A server that could
not be had is recorded too, so that every process of the run meets the same error without
trying again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from object_servers import EMULATORS, START_TIMEOUT_S, ObjectServer
from server_process import ServerError, ServerUnavailable, log_tail, stop_group

from aisio.cluster import ClusterError, LocalCluster
from aisio.cluster.config import CACHE_ENV
from aisio.cluster.config import cache_dir as cluster_cache_dir

FOLDER = pytest.StashKey[Path]()
PROBLEMS = pytest.StashKey[list]()
WORKER_KEY = "wds_test_run_folder"
# How long a process waits for another one of its run to start a server: a start is bounded
# (START_TIMEOUT_S; the cluster's health wait), but building aisnode with Go on first use takes minutes.
LOCK_TIMEOUT_S = 1800.0


def run_folder(config: pytest.Config) -> Path:
    """The folder of this test run's servers (the controller's, also in each worker)."""
    workerinput = getattr(config, "workerinput", None)
    return Path(workerinput[WORKER_KEY]) if workerinput is not None else config.stash[FOLDER]


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the run's own process: the controller, or the only one
        config.stash[FOLDER] = Path(tempfile.mkdtemp(prefix="wds-test-run-"))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """pytest-xdist: each worker gets the run's folder."""
    node.workerinput[WORKER_KEY] = str(node.config.stash[FOLDER])


@contextlib.contextmanager
def _locked(folder: Path, name: str) -> Iterator[dict]:
    """The run's record of server ``name`` (empty when none was started), under the run's lock of
    it; what the block leaves in the record is saved for the other processes."""
    with open(folder / f"{name}.lock", "a") as lock:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ServerError(f"another process of this test run held the lock of {name} for "
                                      f"{LOCK_TIMEOUT_S:.0f} s (starting it)") from None
                time.sleep(0.1)
        path = folder / f"{name}.json"
        record = json.loads(path.read_text()) if path.exists() else {}
        try:
            yield record
        finally:
            if record:
                partial = path.with_suffix(".partial")
                partial.write_text(json.dumps(record))
                partial.replace(path)  # the lock is released when the file closes


@contextlib.contextmanager
def emulator(config: pytest.Config, name: str) -> Iterator[ObjectServer]:
    """The run's emulator ``name`` (one of :data:`object_servers.EMULATORS`), started by the first
    process that needs it, as this process reaches it; raises its :class:`ServerError` (or
    :class:`ServerUnavailable`) where it could not be started."""
    folder = run_folder(config)
    launch, front = EMULATORS[name]
    with _locked(folder, name) as record:
        if not record:
            work = folder / name
            work.mkdir()
            try:
                server, endpoint = launch(work, START_TIMEOUT_S)
            except ServerError as exn:
                record.update(error=str(exn), unavailable=isinstance(exn, ServerUnavailable))
            else:
                server.detach()
                record.update(stop="group", endpoint=endpoint, group=server.proc.pid, work=str(work),
                              log=str(server.log_path))
        found = dict(record)
    if "error" in found:
        raise (ServerUnavailable if found["unavailable"] else ServerError)(found["error"])
    with front(found["endpoint"], Path(found["work"]), lambda: log_tail(Path(found["log"])),
               found["group"]) as server:
        yield server


def ais_cluster(config: pytest.Config, private: bool) -> dict:
    """The run's AIStore cluster: ``{"endpoint": ..., "cache": ...}``.

    The first process that needs it takes the local cluster of :mod:`aisio.cluster` that runs
    (left running at the end), or starts one (stopped at the end). With ``private`` (under
    CI) the cluster's state is kept in a cache folder of the run's (``cache``; the installed
    servers linked in from the real cache), so that a cluster left running by another run
    on the same machine, or started beside it, is never used, stopped or replaced; each
    process sets ``$WDS_DATAPIPES_CACHE`` to it while it uses the cluster. Raises the
    :class:`ClusterError` of a cluster that could not be started.
    """
    folder = run_folder(config)
    with _locked(folder, "aistore") as record:
        if not record:
            try:
                record.update(_take_cluster(folder, private))
            except ClusterError as exn:
                record["error"] = str(exn)
        found = dict(record)
    if "error" in found:
        raise ClusterError(found["error"])
    return found


def _take_cluster(folder: Path, private: bool) -> dict:
    cache = None
    if private:
        real, cache = cluster_cache_dir(), folder / "aistore-cache"
        cache.mkdir()
        for entry in real.iterdir() if real.is_dir() else ():
            if entry.name not in ("cluster", "runs"):
                (cache / entry.name).symlink_to(entry)
    with _cache_env(cache):
        cluster = LocalCluster.running()
        started = cluster is None
        if started:
            cluster = LocalCluster.start(verbose=False)
    return {"stop": "aistore", "endpoint": cluster.endpoint, "run_dir": cluster.run_dir, "started": started,
            "cache": str(cache) if cache else None}


@contextlib.contextmanager
def _cache_env(cache: Path | str | None) -> Iterator[None]:
    """``$WDS_DATAPIPES_CACHE`` set to ``cache`` inside the block (left as it is for ``None``)."""
    before = os.environ.get(CACHE_ENV)
    if cache is not None:
        os.environ[CACHE_ENV] = str(cache)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = before


def _stop(name: str, record: dict) -> None:
    if record.get("stop") == "group":
        stop_group(name, record["group"])
    elif record.get("stop") == "aistore" and record["started"]:
        with _cache_env(record["cache"]):
            cluster = LocalCluster.load()
        if cluster is None or cluster.run_dir != record["run_dir"]:
            raise ClusterError(f"the cluster this run started at {record['endpoint']} is no longer the one "
                               "recorded in its cache folder: not stopped")
        cluster.stop()


def stop_recorded(folder: Path) -> list[str]:
    """Stops every server recorded in a run's folder, then removes the folder; what went wrong, server by server."""
    problems = []
    for path in sorted(folder.glob("*.json")):
        try:
            _stop(path.stem, json.loads(path.read_text()))
        except (ServerError, ClusterError, OSError, ValueError) as exn:
            problems.append(f"{path.stem}: {exn}")
    shutil.rmtree(folder, ignore_errors=True)
    return problems


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """The controller (or the only process) stops the run's servers, its workers having finished."""
    folder = session.config.stash.get(FOLDER, None)
    if folder is None:
        return
    problems = stop_recorded(folder)
    if problems:
        session.config.stash[PROBLEMS] = problems
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    problems = config.stash.get(PROBLEMS, [])
    if problems:
        terminalreporter.section("test servers that did not stop cleanly")
        for problem in problems:
            terminalreporter.write_line(problem)
