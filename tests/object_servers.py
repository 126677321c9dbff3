"""Real object-store servers for the tests: Azurite (Azure Blob), fake-gcs-server (GCS) and the
S3 API of the local AIStore cluster, each behind one small record, :class:`ObjectServer`.

Installing (``python tests/object_servers.py install``, which ``make servers`` runs with any
Python 3, beside the virtual environments' installs): each server is kept in the cache folder
of :mod:`aisio.cluster` (``$WDS_DATAPIPES_CACHE`` or ``~/.cache/wds-datapipes``) and installed
only when missing:

- aisnode: :func:`aisio.cluster.build.ensure_aisnode` (Go; minutes once);
- fake-gcs-server: ``GOBIN=<cache>/bin go install github.com/fsouza/fake-gcs-server@v1.56.1``
  (a few minutes once; a 50 MB binary);
- Azurite: ``npm install azurite@3.37.0`` into ``<cache>/azurite`` (Node 20 or newer; ~1 min once).

Starting: :func:`start_azurite` and :func:`start_fake_gcs` are context managers that run the
server on a free port of 127.0.0.1 with a temp data folder, wait for it to answer (bounded;
a :class:`ServerError` with the tail of its log when it does not), and stop it on exit (its
whole process group, then check that nothing of it is left; :mod:`server_process`). The test
session shares one of each among its processes instead (:mod:`shared_servers`), from
:data:`EMULATORS`: how each is launched into a work folder, and how a process reaches it. :func:`ais_s3` turns on the
AIStore cluster's S3-Reverse-Proxy feature and describes its ``/s3`` API.

Raw puts and bucket creation here use nothing but ``urllib`` (and a small SharedKey signer
for Azure), so that the clients under test are checked against an independent writer.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import datetime
import hashlib
import hmac
import importlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import types
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from server_process import (  # noqa: F401 (re-exported: the fixtures and their tests import them from here)
    ServerError,
    ServerUnavailable,
    _Process,
    group_members,
    launch,
)
from server_process import tail as _tail

FAKE_GCS_MODULE = "github.com/fsouza/fake-gcs-server"
FAKE_GCS_VERSION = "v1.56.1"
AZURITE_VERSION = "3.37.0"
AZURE_ACCOUNT = "devstoreaccount1"
# The emulator's well-known account key (published by Microsoft for Azurite; not a secret).
AZURE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
S3_REVERSE_PROXY = 1 << 13  # AIStore's "S3-Reverse-Proxy" feature bit (the REST API takes the bitmask)
START_TIMEOUT_S = 120.0  # Node loading Azurite takes ~2 s on a quiet machine, ~30 s on a loaded 2-core one


def cache_dir() -> Path:
    """``$WDS_DATAPIPES_CACHE`` or ``~/.cache/wds-datapipes``: the rule of ``aisio.cluster.config.cache_dir``,
    restated here because importing aisio imports the whole library (seconds), which ``install``
    does not need (tests/storage/test_object_servers.py checks that the two agree)."""
    env = os.environ.get("WDS_DATAPIPES_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "wds-datapipes"


# ---------------------------------------------------------------- installing


def fake_gcs_binary() -> Path:
    """The fake-gcs-server binary, built with Go into ``<cache>/bin`` first when it is missing."""
    binary = cache_dir() / "bin" / "fake-gcs-server"
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    go = shutil.which("go")
    if go is None:
        raise ServerUnavailable(f"fake-gcs-server is not installed at {binary} and Go is not on PATH")
    binary.parent.mkdir(parents=True, exist_ok=True)
    cmd = [go, "install", f"{FAKE_GCS_MODULE}@{FAKE_GCS_VERSION}"]
    done = subprocess.run(cmd, env=dict(os.environ, GOBIN=str(binary.parent)), capture_output=True, text=True,
                          check=False)
    if done.returncode != 0 or not binary.is_file():
        raise ServerError(f"cannot install fake-gcs-server ({' '.join(cmd)}):\n{_tail(done.stderr)}")
    return binary


def azurite_blob_script() -> Path:
    """Azurite's blob server script, installed with npm into ``<cache>/azurite`` first when it is missing."""
    home = cache_dir() / "azurite"
    script = home / "node_modules" / "azurite" / "dist" / "src" / "blob" / "main.js"
    installed = home / "node_modules" / "azurite" / "package.json"
    if script.is_file() and installed.is_file() and json.loads(installed.read_text())["version"] == AZURITE_VERSION:
        return script
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise ServerUnavailable(f"Azurite is not installed in {home} and Node/npm is not on PATH")
    home.mkdir(parents=True, exist_ok=True)
    cmd = [npm, "install", "--prefix", str(home), "--no-audit", "--no-fund", "--loglevel=error",
           f"azurite@{AZURITE_VERSION}"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not script.is_file():
        raise ServerError(f"cannot install Azurite ({' '.join(cmd)}):\n{_tail(done.stderr)}")
    return script


def aisnode_binary() -> Path:
    """The aisnode binary, built with Go first when it is missing (:func:`aisio.cluster.build.ensure_aisnode`,
    loaded without importing :mod:`aisio`, which imports the whole library: this runs before
    and beside the virtual environment's install)."""
    package = "_aisio_cluster_alone"
    if package not in sys.modules:
        sys.modules[package] = types.ModuleType(package)
        sys.modules[package].__path__ = [str(Path(__file__).resolve().parents[1] / "aisio" / "cluster")]
    return importlib.import_module(f"{package}.build").ensure_aisnode()


def install() -> dict[str, Path]:
    """Installs what is missing, Azurite (npm) beside the two Go builds (each of which uses
    every core); returns where each server is."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        azurite = pool.submit(azurite_blob_script)
        built = {"aisnode": aisnode_binary(), "fake-gcs-server": fake_gcs_binary()}
        return {**built, "azurite": azurite.result()}


# ---------------------------------------------------------------- the record the fixtures yield


@dataclass
class ObjectServer:
    """One object store the tests can use.

    ``scheme`` is the URL scheme of its objects (``s3``, ``gs``, ``az``); ``endpoint`` the
    HTTP endpoint clients talk to; ``env`` the standard environment variables (endpoint,
    credentials) that boto3 / obstore / the official SDKs read to reach it; ``new_bucket()``
    makes a fresh, empty bucket (container) and returns its name; ``put(bucket, key, data)``
    writes raw bytes as an object; ``log_tail()`` the end of the server's log.
    ``through(proxy)`` is the same store reached through a :class:`fault_proxy.FaultProxy`.
    """

    scheme: str
    endpoint: str
    env: dict[str, str]
    _create: Callable[[str, str], None] = field(repr=False)
    _put: Callable[[str, str, str, bytes], None] = field(repr=False)
    log_tail: Callable[[], str] = field(repr=False, default=lambda: "")
    origin: str = ""  # the server's own base URL (endpoint is a proxy's after through())
    pid: int | None = None  # the server's process (and process group), where the fixture started one
    created: list[str] = field(default_factory=list)  # the buckets new_bucket made (shared with through()'s)

    def new_bucket(self, prefix: str = "test") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self._create(self.endpoint, name)
        self.created.append(name)
        return name

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self._put(self.endpoint, bucket, key, data)

    def url(self, bucket: str, key: str = "") -> str:
        """``scheme://bucket/key``."""
        return f"{self.scheme}://{bucket}/{key}"

    def through(self, proxy) -> ObjectServer:
        """This store as seen through ``proxy`` (anything with a ``url``): endpoint and env point at it."""
        base = self.origin or _base(self.endpoint)
        swap = lambda value: value.replace(base, proxy.url)
        return replace(self, endpoint=swap(self.endpoint), env={k: swap(v) for k, v in self.env.items()},
                       origin=base)

    @contextlib.contextmanager
    def environ(self) -> Iterator[dict[str, str]]:
        """``env`` set in ``os.environ`` inside ``with`` (and what was there before put back after)."""
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            yield self.env
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _base(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _http(method: str, url: str, data: bytes | None = None, headers: dict[str, str] | None = None,
          ok: tuple[int, ...] = (200, 201, 204)) -> bytes:
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.read()
    except urllib.error.HTTPError as exn:
        if exn.code in ok:
            return exn.read()
        if exn.code in (307, 308) and exn.headers.get("Location"):  # urllib follows no PUT; AIStore redirects it
            return _http(method, urllib.parse.urljoin(url, exn.headers["Location"]), data, headers, ok)
        raise ServerError(f"{method} {url}: {exn.code} {exn.read()[:300]!r}") from None


# ---------------------------------------------------------------- fake-gcs-server


@contextlib.contextmanager
def start_fake_gcs(timeout: float = START_TIMEOUT_S) -> Iterator[ObjectServer]:
    """fake-gcs-server on a free port (``-scheme http``, a temp data folder), stopped on exit.

    Its endpoint is a relay in front of it that adds the XML-API upload it lacks (:class:`GcsXmlPut`).
    """
    with _own("fake-gcs-server", timeout) as server:
        yield server


def launch_fake_gcs(workdir: Path, timeout: float = START_TIMEOUT_S) -> tuple[_Process, str]:
    """fake-gcs-server on a free port with its data in ``workdir``; its process and endpoint."""
    binary = fake_gcs_binary()
    (workdir / "data").mkdir()
    # -public-host without a port: path-style requests (GET/DELETE /BUCKET/KEY) are taken
    # from any port of 127.0.0.1, a fault proxy's included (else the Host names a bucket).
    return launch("fake-gcs-server", workdir, timeout, "/storage/v1/b",
                  lambda port: [str(binary), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-data",
                                str(workdir / "data"), "-public-host", "127.0.0.1", "-log-level", "warn"])


@contextlib.contextmanager
def gcs_front(endpoint: str, workdir: Path, log: Callable[[], str], pid: int) -> Iterator[ObjectServer]:
    """The ObjectServer of the fake-gcs-server at ``endpoint``, reached through a relay of this
    process that adds the XML-API upload (:class:`GcsXmlPut`); the relay stops on exit."""
    from fault_proxy import FaultProxy

    account = workdir / "service-account.json"
    if not account.exists():
        account.write_text(json.dumps({"disable_oauth": True, "client_email": "", "private_key": "",
                                       "private_key_id": ""}))
    with FaultProxy(endpoint, translate=GcsXmlPut()) as shim:
        yield ObjectServer("gs", shim.url, gcs_env(shim.url, account), _gcs_create, _gcs_put, log, shim.url, pid)


class GcsXmlPut:
    """fake-gcs-server 1.56.1 has no XML-API upload (``PUT /BUCKET/KEY``, what obstore's GCSStore
    sends for a put; it answers 400 "invalid uploadType"): a :class:`fault_proxy.FaultProxy`
    with this ``translate`` sends such a PUT as the JSON API's media upload
    (``POST /upload/storage/v1/b/BUCKET/o?uploadType=media&name=KEY``) and answers as the XML
    API does (empty body, ``ETag``, ``x-goog-generation``). Multipart uploads (``?uploads``)
    are not translated."""

    def request(self, method: str, target: str, headers: list[tuple[str, str]], body: bytes):
        path, _, query = target.partition("?")
        parts = path.lstrip("/").split("/", 1)
        if method != "PUT" or query or len(parts) != 2 or parts[0] in ("upload", "storage", "_internal"):
            return None
        bucket, key = (urllib.parse.unquote(p) for p in parts)
        kept = [(n, v) for n, v in headers if n.lower() in ("host", "content-type")]
        name = urllib.parse.urlencode({"uploadType": "media", "name": key})
        return "POST", f"/upload/storage/v1/b/{urllib.parse.quote(bucket)}/o?{name}", kept, body

    def answer(self, status: int, headers: list[tuple[str, str]], body: bytes):
        if status != 200:
            return status, [(n, v) for n, v in headers if n.lower() == "content-type"], body
        meta = json.loads(body)
        return 200, [("ETag", f'"{meta["etag"]}"'), ("x-goog-generation", meta["generation"])], b""


def gcs_env(endpoint: str, account: Path) -> dict[str, str]:
    """obstore's GCSStore (GOOGLE_BASE_URL; a service-account file saying ``disable_oauth``, which
    object_store honours for every request, where GOOGLE_SKIP_SIGNATURE still fetches a token
    for a PUT) and the official SDKs (STORAGE_EMULATOR_HOST)."""
    return {"GOOGLE_BASE_URL": endpoint, "GOOGLE_SERVICE_ACCOUNT": str(account), "STORAGE_EMULATOR_HOST": endpoint,
            "GOOGLE_CLOUD_PROJECT": "test"}


def _gcs_create(endpoint: str, bucket: str) -> None:
    _http("POST", f"{endpoint}/storage/v1/b?project=test", json.dumps({"name": bucket}).encode(),
          {"Content-Type": "application/json"})


def _gcs_put(endpoint: str, bucket: str, key: str, data: bytes) -> None:
    query = urllib.parse.urlencode({"uploadType": "media", "name": key})
    _http("POST", f"{endpoint}/upload/storage/v1/b/{bucket}/o?{query}", data,
          {"Content-Type": "application/octet-stream"})


# ---------------------------------------------------------------- Azurite


@contextlib.contextmanager
def start_azurite(timeout: float = START_TIMEOUT_S) -> Iterator[ObjectServer]:
    """Azurite's blob service on a free port (a temp data folder, ``--skipApiVersionCheck``), stopped on exit."""
    with _own("azurite", timeout) as server:
        yield server


def launch_azurite(workdir: Path, timeout: float = START_TIMEOUT_S) -> tuple[_Process, str]:
    """Azurite's blob service on a free port with its data in ``workdir``; its process and endpoint."""
    script = azurite_blob_script()
    node = shutil.which("node")
    if node is None:
        raise ServerUnavailable("Node is not on PATH: Azurite cannot run")
    return launch("azurite-blob", workdir, timeout, f"/{AZURE_ACCOUNT}?comp=list",
                  lambda port: [node, str(script), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
                                str(workdir / "data"), "--skipApiVersionCheck", "--silent",
                                "--disableProductStyleUrl", "--disableTelemetry"])


@contextlib.contextmanager
def azurite_front(endpoint: str, workdir: Path, log: Callable[[], str], pid: int) -> Iterator[ObjectServer]:
    """The ObjectServer of the Azurite at ``endpoint``."""
    yield ObjectServer("az", endpoint, azure_env(endpoint), _az_create, _az_put, log, endpoint, pid)


def azure_env(endpoint: str) -> dict[str, str]:
    """obstore's AzureStore (account, key, endpoint, plain HTTP allowed) and the official SDKs
    (AZURE_STORAGE_CONNECTION_STRING)."""
    blob = f"{endpoint}/{AZURE_ACCOUNT}"
    return {
        "AZURE_STORAGE_ACCOUNT_NAME": AZURE_ACCOUNT,
        "AZURE_STORAGE_ACCOUNT_KEY": AZURE_KEY,
        "AZURE_STORAGE_ENDPOINT": blob,
        "AZURE_ALLOW_HTTP": "true",
        "AZURITE_BLOB_STORAGE_URL": endpoint,
        "AZURE_STORAGE_CONNECTION_STRING": (f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};"
                                            f"AccountKey={AZURE_KEY};BlobEndpoint={blob};"),
    }


def azure_shared_key(method: str, url: str, headers: dict[str, str], length: int) -> str:
    """The ``Authorization`` header of Azure Storage's SharedKey scheme for the emulator's account
    (the 2009-09-19+ string-to-sign: https://learn.microsoft.com/rest/api/storageservices/authorize-with-shared-key)."""
    parts = urllib.parse.urlsplit(url)
    lower = {k.lower(): v for k, v in headers.items()}
    standard = ["content-encoding", "content-language", "content-length", "content-md5", "content-type", "date",
                "if-modified-since", "if-match", "if-none-match", "if-unmodified-since", "range"]
    values = [lower.get(name, "") for name in standard]
    values[standard.index("content-length")] = str(length) if length else ""
    canonical_headers = "".join(f"{k}:{lower[k].strip()}\n" for k in sorted(lower) if k.startswith("x-ms-"))
    resource = f"/{AZURE_ACCOUNT}{parts.path}"
    for name, vals in sorted(urllib.parse.parse_qs(parts.query, keep_blank_values=True).items()):
        resource += f"\n{name.lower()}:{','.join(sorted(vals))}"
    to_sign = "\n".join([method, *values]) + "\n" + canonical_headers + resource
    digest = hmac.new(base64.b64decode(AZURE_KEY), to_sign.encode(), hashlib.sha256).digest()
    return f"SharedKey {AZURE_ACCOUNT}:{base64.b64encode(digest).decode()}"


def _az_request(method: str, url: str, data: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    headers = {"x-ms-version": "2021-08-06", "Content-Type": "application/octet-stream",  # else urllib adds one
               "x-ms-date": datetime.datetime.now(datetime.timezone.utc).strftime("%a, %d %b %Y %H:%M:%S GMT"),
               **(headers or {})}
    headers["Authorization"] = azure_shared_key(method, url, headers, len(data))
    return _http(method, url, data, headers)


def _az_create(endpoint: str, container: str) -> None:
    _az_request("PUT", f"{endpoint}/{AZURE_ACCOUNT}/{container}?restype=container")


def _az_put(endpoint: str, container: str, key: str, data: bytes) -> None:
    _az_request("PUT", f"{endpoint}/{AZURE_ACCOUNT}/{container}/{urllib.parse.quote(key)}", data,
                {"x-ms-blob-type": "BlockBlob"})


# ---------------------------------------------------------------- started here, or shared by a test run

# Each emulator: how it is launched (into a work folder) and how a process reaches it.
EMULATORS = {"fake-gcs-server": (launch_fake_gcs, gcs_front), "azurite": (launch_azurite, azurite_front)}


@contextlib.contextmanager
def _own(name: str, timeout: float) -> Iterator[ObjectServer]:
    """Emulator ``name`` started here, in a temp folder of its own, and stopped on exit."""
    start, front = EMULATORS[name]
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        server, endpoint = start(Path(tmp), timeout)
        try:
            with front(endpoint, Path(tmp), server.log_tail, server.proc.pid) as made:
                yield made
        finally:
            server.stop()


# ---------------------------------------------------------------- AIStore's S3 API


def s3_reverse_proxy(ais_endpoint: str, on: bool = True) -> int:
    """Turns the cluster's S3-Reverse-Proxy feature on (or off); returns the feature bitmask it had.

    With it on, the proxy node answers ``/s3`` object requests itself, relaying the bytes
    from the target, instead of redirecting the client to the target with a 307: unpatched
    clients (boto3 fails on the 307; obstore follows it for GET but not for PUT) need it.
    The REST call takes the bitmask (``features=8192``), not the feature's name.
    """
    before = int(json.loads(_http("GET", f"{ais_endpoint}/v1/daemon?what=config"))["features"])
    wanted = before | S3_REVERSE_PROXY if on else before & ~S3_REVERSE_PROXY
    if wanted != before:
        _http("PUT", f"{ais_endpoint}/v1/cluster/set-config?features={wanted}")
    return before


def ais_s3(ais_endpoint: str) -> ObjectServer:
    """The S3 API of the AIStore cluster at ``ais_endpoint`` (``/s3``, path style, auth off: any
    key is accepted), its S3-Reverse-Proxy feature turned on (see :func:`s3_reverse_proxy`)."""
    s3_reverse_proxy(ais_endpoint, on=True)
    endpoint = f"{ais_endpoint.rstrip('/')}/s3"
    return ObjectServer("s3", endpoint, s3_env(endpoint), _s3_create, _s3_put, origin=_base(endpoint))


def s3_env(endpoint: str) -> dict[str, str]:
    """boto3 (AWS_ENDPOINT_URL, keys, region) and obstore's S3Store (also AWS_ALLOW_HTTP, path style)."""
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false"}


def _s3_create(endpoint: str, bucket: str) -> None:
    _http("PUT", f"{endpoint}/{bucket}")


def _s3_put(endpoint: str, bucket: str, key: str, data: bytes) -> None:
    _http("PUT", f"{endpoint}/{bucket}/{urllib.parse.quote(key)}", data,
          {"Content-Type": "application/octet-stream"})


def delete_s3_bucket(ais_endpoint: str, bucket: str) -> None:
    """Removes a bucket and its objects, through AIStore's own API."""
    _http("DELETE", f"{ais_endpoint}/v1/buckets/{bucket}", json.dumps({"action": "destroy-bck"}).encode(),
          {"Content-Type": "application/json"}, ok=(200, 404))


if __name__ == "__main__":
    if sys.argv[1:] != ["install"]:
        sys.exit("usage: python tests/object_servers.py install")
    logging.basicConfig(level=logging.INFO, format="[install] %(message)s")  # the Go builds' progress
    for name, where in install().items():
        print(f"{name}: {where}")
