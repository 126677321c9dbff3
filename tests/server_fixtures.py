"""The session's real servers as pytest fixtures, for every test folder (``tests/conftest.py``
imports them): the AIStore cluster (``ais_endpoint``), its S3 API (``s3_server``), Azurite
(``azure_server``), fake-gcs-server (``gcs_server``), all three in turn (``object_server``),
and a fault-injecting proxy in front of any of them (``fault_proxy``).

Each object-store fixture yields an :class:`object_servers.ObjectServer`: ``endpoint``,
``env`` (the standard variables boto3 / obstore / the SDKs read), ``new_bucket()``,
``put(bucket, key, data)``, ``url(bucket, key)``, ``through(proxy)``. A server starts once
per test run, on first use by any of its processes (pytest-xdist workers share it), and is
stopped at the run's end (no process of it left): :mod:`shared_servers`.

Where a server cannot exist on this machine (no aisnode and no Go, no Node, no Go for
fake-gcs-server) its tests skip with the reason; under CI (``CI`` set) they fail instead.
A server that is there but does not start is an error, with the tail of its log.
"""

from __future__ import annotations

import contextlib
import os
import urllib.error
import urllib.request

import pytest
from fault_proxy import FaultProxy, Schedule, no_faults
from object_servers import ObjectServer, ServerUnavailable, ais_s3, delete_s3_bucket
from shared_servers import ais_cluster, emulator

from aisio.client import ENDPOINT_ENV
from aisio.cluster import ClusterError
from aisio.cluster.config import CACHE_ENV

IN_CI = bool(os.environ.get("CI"))


def pytest_collection_modifyitems(items):
    for item in items:
        if "ais_endpoint" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ais)


def cannot_have(reason: str):
    """Skip: the server cannot exist on this machine; fail under CI, where it must."""
    if IN_CI:
        pytest.fail(f"a test server must run in CI: {reason}", pytrace=False)
    pytest.skip(reason)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v1/health", timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="session")
def ais_endpoint(request):
    """The endpoint of a healthy AIStore cluster; ``$AIS_ENDPOINT`` points at it for the session.

    With ``AIS_ENDPOINT`` set, that cluster. Otherwise the local cluster of :mod:`aisio.cluster`
    (1 proxy + 2 targets on 127.0.0.1, aisnode built first if missing): one already started
    with ``python -m aisio.cluster start`` is used and left running, else one is started for
    the test run and stopped at its end. It is one cluster for the whole run, shared by its
    pytest-xdist workers (:func:`shared_servers.ais_cluster`). Under CI the run always starts
    its own, its state in a cache folder of the run's (``$WDS_DATAPIPES_CACHE`` points there
    while the cluster is in use, for worker processes and example scripts): a cluster left
    running by another run on the same machine, or started beside it, is never used,
    stopped or replaced.
    """
    given = os.environ.get(ENDPOINT_ENV)
    if given:
        if not _healthy(given):
            pytest.fail(f"AIS_ENDPOINT={given} does not answer GET /v1/health with 200", pytrace=False)
        yield given.rstrip("/")
        return
    try:
        cluster = ais_cluster(request.config, private=IN_CI)
    except ClusterError as exn:
        cannot_have(f"no local AIStore cluster: {exn}")
    with pytest.MonkeyPatch.context() as env:
        if cluster["cache"]:
            env.setenv(CACHE_ENV, cluster["cache"])
        env.setenv(ENDPOINT_ENV, cluster["endpoint"])  # worker processes started later inherit it
        yield cluster["endpoint"]


@pytest.fixture(scope="session")
def s3_server(ais_endpoint):
    """The AIStore cluster's S3 API (``<ais_endpoint>/s3``, path style, any key accepted), with
    the cluster's S3-Reverse-Proxy feature turned on: the proxy node relays object bytes
    itself instead of answering 307 redirects to a target, which unpatched clients (boto3,
    obstore's PUT) do not follow. The feature stays on (it changes nothing for ``ais://``).
    The buckets made with ``new_bucket()`` are destroyed at the end of the session."""
    server = ais_s3(ais_endpoint)
    yield server
    for bucket in server.created:
        delete_s3_bucket(ais_endpoint, bucket)


@contextlib.contextmanager
def _started(start):
    try:
        with start() as server:
            yield server
    except ServerUnavailable as exn:
        cannot_have(str(exn))


@pytest.fixture(scope="session")
def azure_server(request):
    """Azurite's blob service (account ``devstoreaccount1``, the emulator's well-known key): one
    for the test run, shared by its pytest-xdist workers."""
    with _started(lambda: emulator(request.config, "azurite")) as server:
        yield server


@pytest.fixture(scope="session")
def gcs_server(request):
    """fake-gcs-server over plain HTTP (no auth: clients skip signing): one for the test run,
    shared by its pytest-xdist workers, each reaching it through a relay of its own."""
    with _started(lambda: emulator(request.config, "fake-gcs-server")) as server:
        yield server


@pytest.fixture(params=["s3", "gs", "az"])
def object_server(request) -> ObjectServer:
    """Each object store in turn (the test runs once per scheme)."""
    return request.getfixturevalue({"s3": "s3_server", "gs": "gcs_server", "az": "azure_server"}[request.param])


@pytest.fixture
def fault_proxy():
    """A factory: ``fault_proxy(server, schedule, **options)`` starts a :class:`fault_proxy.FaultProxy`
    in front of ``server`` (an ObjectServer, or a base URL) and returns ``(server as seen
    through it, the proxy)``; every proxy is stopped after the test."""
    with contextlib.ExitStack() as stack:

        def make(server: ObjectServer | str, schedule: Schedule = no_faults, **options):
            origin = server if isinstance(server, str) else server.origin
            proxy = stack.enter_context(FaultProxy(origin, schedule, **options))
            return (proxy.url if isinstance(server, str) else server.through(proxy)), proxy

        yield make
