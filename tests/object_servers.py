"""Real object-store servers for the tests: Azurite (Azure Blob), fake-gcs-server (GCS) and the
S3 API of the local AIStore cluster, each behind one small record, :class:`ObjectServer`.

Installing (``python tests/object_servers.py install``, which ``make test-main`` runs): each
server is kept in the cache folder of :mod:`aisio.cluster` (``$WDS_DATAPIPES_CACHE`` or
``~/.cache/wds-datapipes``) and installed only when missing:

- fake-gcs-server: ``GOBIN=<cache>/bin go install github.com/fsouza/fake-gcs-server@v1.56.1``
  (a few minutes once; a 50 MB binary);
- Azurite: ``npm install azurite@3.37.0`` into ``<cache>/azurite`` (Node 20 or newer; ~1 min once).

Starting: :func:`start_azurite` and :func:`start_fake_gcs` are context managers that run the
server on a free port of 127.0.0.1 with a temp data folder, wait for it to answer (bounded;
a :class:`ServerError` with the tail of its log when it does not), and stop it on exit (its
whole process group, then check that nothing of it is left). :func:`ais_s3` turns on the
AIStore cluster's S3-Reverse-Proxy feature and describes its ``/s3`` API.

Raw puts and bucket creation here use nothing but ``urllib`` (and a small SharedKey signer
for Azure), so that the clients under test are checked against an independent writer.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import hmac
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

FAKE_GCS_MODULE = "github.com/fsouza/fake-gcs-server"
FAKE_GCS_VERSION = "v1.56.1"
AZURITE_VERSION = "3.37.0"
AZURE_ACCOUNT = "devstoreaccount1"
# The emulator's well-known account key (published by Microsoft for Azurite; not a secret).
AZURE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
S3_REVERSE_PROXY = 1 << 13  # AIStore's "S3-Reverse-Proxy" feature bit (the REST API takes the bitmask)
START_TIMEOUT_S = 120.0  # Node loading Azurite takes ~2 s on a quiet machine, ~30 s on a loaded 2-core one


class ServerError(RuntimeError):
    """A test server could not be installed or started (the message says why, with its log tail)."""


class ServerUnavailable(ServerError):
    """What a server needs is not on this machine (no Go, no Node): tests skip, except in CI."""


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


def install() -> dict[str, Path]:
    """Installs what is missing; returns where each server is."""
    return {"fake-gcs-server": fake_gcs_binary(), "azurite": azurite_blob_script()}


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
        raise ServerError(f"{method} {url}: {exn.code} {exn.read()[:300]!r}") from None


# ---------------------------------------------------------------- a server process


class _Process:
    """A server in its own process group, its output in a log file, stopped whole."""

    def __init__(self, name: str, argv: list[str], workdir: Path):
        self.name = name
        self.log_path = workdir / f"{name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=workdir, start_new_session=True)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return _tail(self.log_path.read_text(errors="replace"), lines)
        except OSError:
            return "(no log)"

    def wait_ready(self, probe: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"{self.name} exited with status {self.proc.returncode} before answering; "
                                  f"its log ends:\n{self.log_tail()}")
            if probe():
                return
            time.sleep(0.05)
        self.stop()
        raise ServerError(f"{self.name} did not answer within {timeout:.0f} s; its log ends:\n{self.log_tail()}")

    def stop(self, grace: float = 10.0) -> None:
        """Ends the whole process group (SIGTERM, then SIGKILL after ``grace`` s) and checks none of it is left."""
        group = self.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
            self.proc.wait(grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)  # any child left behind by the leader
        self._log.close()
        left = group_members(group)
        if left:
            raise ServerError(f"{self.name}: processes {left} of its group outlived it")


def group_members(group: int) -> list[int]:
    """The live (not zombie) processes of process group ``group``, read from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != b"Z":
            found.append(int(entry))
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    """Whether an HTTP server answers at ``url`` (any status)."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join((text or "").strip().splitlines()[-lines:]) or "(empty)"


# ---------------------------------------------------------------- fake-gcs-server


@contextlib.contextmanager
def start_fake_gcs(timeout: float = START_TIMEOUT_S) -> Iterator[ObjectServer]:
    """fake-gcs-server on a free port (``-scheme http``, a temp data folder), stopped on exit.

    Its endpoint is a relay in front of it that adds the XML-API upload it lacks (:class:`GcsXmlPut`).
    """
    from fault_proxy import FaultProxy

    binary = fake_gcs_binary()
    with tempfile.TemporaryDirectory(prefix="fake-gcs-") as tmp:
        port = _free_port()
        (Path(tmp) / "data").mkdir()
        endpoint = f"http://127.0.0.1:{port}"
        argv = [str(binary), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-data",
                str(Path(tmp) / "data"), "-public-host", "127.0.0.1", "-log-level", "warn"]
        # -public-host without a port: path-style requests (GET/DELETE /BUCKET/KEY) are taken
        # from any port of 127.0.0.1, a fault proxy's included (else the Host names a bucket).
        server = _Process("fake-gcs-server", argv, Path(tmp))
        try:
            server.wait_ready(lambda: _answers(f"{endpoint}/storage/v1/b"), timeout)
            account = Path(tmp) / "service-account.json"
            account.write_text(json.dumps({"disable_oauth": True, "client_email": "", "private_key": "",
                                           "private_key_id": ""}))
            with FaultProxy(endpoint, translate=GcsXmlPut()) as shim:
                yield ObjectServer("gs", shim.url, gcs_env(shim.url, account), _gcs_create, _gcs_put,
                                   server.log_tail, shim.url, server.proc.pid)
        finally:
            server.stop()


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
    script = azurite_blob_script()
    node = shutil.which("node")
    if node is None:
        raise ServerUnavailable("Node is not on PATH: Azurite cannot run")
    with tempfile.TemporaryDirectory(prefix="azurite-") as tmp:
        port = _free_port()
        endpoint = f"http://127.0.0.1:{port}"
        argv = [node, str(script), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
                str(Path(tmp) / "data"), "--skipApiVersionCheck", "--silent", "--disableProductStyleUrl",
                "--disableTelemetry"]
        server = _Process("azurite-blob", argv, Path(tmp))
        try:
            server.wait_ready(lambda: _answers(f"{endpoint}/{AZURE_ACCOUNT}?comp=list"), timeout)
            yield ObjectServer("az", endpoint, azure_env(endpoint), _az_create, _az_put, server.log_tail, endpoint,
                               server.proc.pid)
        finally:
            server.stop()


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
    for name, where in install().items():
        print(f"{name}: {where}")
