"""Object-store URLs (``s3://``, ``gs://``, ``az://``), their settings, and the stores built from them.

A URL names a bucket (Azure: a container) and a key: ``s3://bucket/train/shard-000.tar``.
Everything else comes from each cloud's standard environment, read by obstore in the
process that builds the store: ``AWS_*`` (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_REGION``, ``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP``, ...), ``GOOGLE_*``
(``GOOGLE_SERVICE_ACCOUNT``, ``GOOGLE_APPLICATION_CREDENTIALS``, ...), ``AZURE_*``
(``AZURE_STORAGE_ACCOUNT_NAME``, ``AZURE_STORAGE_ACCOUNT_KEY``, ...), and instance metadata;
and here, as the official clients read them, ``AZURE_STORAGE_CONNECTION_STRING`` and
``STORAGE_EMULATOR_HOST`` (:mod:`.cloud_env`).

:class:`StoreSettings` overrides that in code, for every URL under a prefix
(:func:`set_store_settings`): an endpoint (an S3-compatible server such as AIStore's
``/s3``), path-style addressing, a region, and where the credentials are, never the
credentials themselves: it names environment variables, or a ``module:function`` that
returns an obstore credential provider. Settings therefore pickle, print and log without a
secret, and reach DataLoader workers started by fork or by spawn through the environment
variable ``WDS_STORE_SETTINGS`` (JSON, written by :func:`set_store_settings`).

One pipeline's own settings (``ShardLister(urls, store=StoreSettings(...))``) go down
another way, with no global state: its URLs carry them (:class:`StoreUrl`, made by
:func:`with_stores`) to the calls that open, stamp and list them, where
:func:`settings_for` reads them ahead of the process's. Two pipelines naming one bucket
with different settings each reach their own server, in one process and in workers.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import ShardOpenError
from ..limits import Limits
from . import cloud_env

SCHEMES = ("s3", "gs", "az")
SETTINGS_ENV = "WDS_STORE_SETTINGS"
_INSTALL = "pip install 'wds-datapipes[cloud]'"
# Option names whose values are secrets: they never go into StoreSettings.options.
# Customer-provided encryption keys too: S3's SSE-C ``aws_sse_customer_key_base64``, Azure's
# ``azure_storage_encryption_key``.
_SECRET_NAME = re.compile(r"secret|password|token|(^|_)key$|key_base64|customer_key|sas|credential", re.IGNORECASE)
# Options (and the variables obstore reads) that encrypt objects with a key the client sends
# on every request: a presigned URL cannot carry it (see customer_keyed).
_CUSTOMER_KEY_OPTION = re.compile(r"sse_customer_key|encryption_key", re.IGNORECASE)
_CUSTOMER_KEY_ENV = {"s3": ("AWS_SSE_CUSTOMER_KEY_BASE64",), "gs": (),
                     "az": ("AZURE_STORAGE_ENCRYPTION_KEY", "AZURE_ENCRYPTION_KEY")}
_ENDPOINT_ENV = {"s3": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"), "gs": ("GOOGLE_BASE_URL",),
                 "az": ("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT")}
_ALLOW_HTTP_ENV = {"s3": "AWS_ALLOW_HTTP", "gs": "GOOGLE_ALLOW_HTTP", "az": "AZURE_ALLOW_HTTP"}
_DEFAULT_TIMEOUT = timedelta(days=1)  # a whole slow GET; stalls are caught by read_timeout


@dataclass(frozen=True)
class ObjectUrl:
    """``scheme://bucket/key`` taken apart (the key may be empty: a bucket, or a prefix)."""

    scheme: str
    bucket: str
    key: str

    @classmethod
    def parse(cls, url: str) -> ObjectUrl:
        """The parts of ``url``; a URL of another scheme or without a bucket raises ShardOpenError."""
        head, sep, rest = str(url).partition("://")
        scheme = head.lower()
        if not sep or scheme not in SCHEMES:
            raise ShardOpenError(url, f"not an object-store URL (schemes: {', '.join(SCHEMES)})")
        bucket, _, key = rest.partition("/")
        if not bucket:
            raise ShardOpenError(url, "the URL names no bucket (scheme://bucket/key)")
        return cls(scheme, bucket, key)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}"


@dataclass(frozen=True)
class StoreSettings:
    """How to reach the objects under a URL prefix, beyond the cloud's standard environment.

    Holds no secret (it is pickled to workers and shown in errors): credentials are named,
    never given.

    Attributes:
        endpoint: the server's URL, for S3-compatible servers (AIStore:
            ``http://HOST:PORT/s3``, MinIO, Ceph), GCS (its base URL) or Azure.
        region: the S3 region (AIStore accepts any; ``us-east-1``).
        path_style: S3 only: ``True`` asks ``endpoint/bucket/key`` (AIStore, MinIO),
            ``False`` ``bucket.endpoint/key``; None: obstore's default (path style unless
            ``AWS_VIRTUAL_HOSTED_STYLE_REQUEST`` says otherwise).
        allow_http: plain ``http://`` endpoints; None: allowed where ``endpoint`` is one.
        anonymous: unsigned requests (public buckets; servers with auth off).
        credentials_env: store option -> environment variable holding its value, read in
            each process that builds a store: ``{"access_key_id": "MY_KEY_ID",
            "secret_access_key": "MY_SECRET"}``.
        credential_provider: ``"module:function"``; ``function()`` returns an obstore
            credential provider (for instance ``obstore.auth.boto3.Boto3CredentialProvider``
            over a profile), called in each process that builds a store.
        options: further store options that are not secrets (``{"request_payer": "true"}``);
            a name that looks like a secret's is refused.
    """

    endpoint: str | None = None
    region: str | None = None
    path_style: bool | None = None
    allow_http: bool | None = None
    anonymous: bool = False
    credentials_env: tuple[tuple[str, str], ...] = ()
    credential_provider: str | None = None
    options: tuple[tuple[str, str], ...] = ()

    def __init__(self, endpoint: str | None = None, region: str | None = None, path_style: bool | None = None,
                 allow_http: bool | None = None, anonymous: bool = False,
                 credentials_env: dict[str, str] | tuple = (), credential_provider: str | None = None,
                 options: dict[str, str] | tuple = ()):
        values = {"endpoint": endpoint, "region": region, "path_style": path_style, "allow_http": allow_http,
                  "anonymous": bool(anonymous), "credential_provider": credential_provider,
                  "credentials_env": _pairs(credentials_env), "options": _pairs(options)}
        for name, value in values.items():
            object.__setattr__(self, name, value)
        if endpoint is not None and ("@" in endpoint.partition("://")[2].partition("/")[0] or "?" in endpoint):
            raise ValueError("StoreSettings.endpoint must not carry credentials (user:password@ or a query)")
        for name, _ in self.options:
            if looks_secret(name):
                raise ValueError(f"StoreSettings.options must not hold secrets ({name!r}): name the environment "
                                 "variable in credentials_env, or give a credential_provider")
        if credential_provider is not None and ":" not in credential_provider:
            raise ValueError(f"credential_provider is 'module:function', got {credential_provider!r}")

    def to_json(self) -> dict[str, Any]:
        """The settings as JSON values (what ``WDS_STORE_SETTINGS`` holds)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StoreSettings:
        """The settings from their JSON form (lists where the fields hold tuples)."""
        return cls(**{k: (tuple(map(tuple, v)) if isinstance(v, list) else v) for k, v in data.items()})


def looks_secret(option: str) -> bool:
    """Whether a store option's name says its value is a secret (a key, a token, a password, a SAS)."""
    return _SECRET_NAME.search(option) is not None


def _pairs(value: dict[str, str] | tuple) -> tuple[tuple[str, str], ...]:
    items = value.items() if isinstance(value, dict) else value
    return tuple(sorted((str(k), str(v)) for k, v in items))


_settings: dict[str, StoreSettings] = {}
_loaded_env: str | None = None


def set_store_settings(prefix: str, settings: StoreSettings | None) -> None:
    """Use ``settings`` for every URL that starts with ``prefix`` (``"s3://"``, ``"s3://bucket"``,
    ``"s3://bucket/train/"``; the longest prefix wins); None removes them. Written to
    ``$WDS_STORE_SETTINGS`` too, so that worker processes started later (fork or spawn) use
    them. Stores built before are not rebuilt: set these before the pipeline first reads."""
    _check_prefix(prefix)
    _sync_from_env()
    if settings is None:
        _settings.pop(prefix, None)
    else:
        _settings[prefix] = settings
    global _loaded_env
    _loaded_env = json.dumps({p: s.to_json() for p, s in sorted(_settings.items())})
    if _settings:
        os.environ[SETTINGS_ENV] = _loaded_env
    else:
        os.environ.pop(SETTINGS_ENV, None)


def settings_for(url: str) -> StoreSettings:
    """The settings for ``url``: its pipeline's own (a :class:`StoreUrl`'s, longest prefix),
    else those of the longest prefix set for the process, else the defaults."""
    own = url.stores.settings_for(url) if isinstance(url, StoreUrl) else None
    if own is not None:
        return own
    _sync_from_env()
    best = max((p for p in _settings if str(url).startswith(p)), key=len, default=None)
    return _settings[best] if best is not None else StoreSettings()


def object_identity(url: str) -> str:
    """What names the object ``url`` reads, for the shard cache's key: the URL, and after it
    the endpoint where its settings (its pipeline's or the process's) name one: one bucket
    name on two servers is two objects. An endpoint holds no secret (StoreSettings refuses
    ``user:password@`` and queries). Where no settings name one, the endpoint the cloud's
    environment sets (``AWS_ENDPOINT_URL`` ..., :func:`_env_endpoint`: the one obstore
    uses), shorn of any user, password or query. Any other URL: its text."""
    text = str.__str__(url)
    if text.partition("://")[0].lower() not in SCHEMES:
        return text
    settings = settings_for(url)
    endpoint = settings.endpoint or _env_endpoint(text.partition("://")[0].lower())
    where = [f"at {endpoint}"] if endpoint else []
    # options name the account or endpoint too (Azure's account_name, an endpoint option): two
    # accounts' c/k are two objects. Options hold no secret (StoreSettings refuses those names).
    where += [f"{name}={value}" for name, value in settings.options
              if any(word in name.lower() for word in ("account", "endpoint", "bucket", "container", "project"))]
    return " ".join([text, *where])


def customer_keyed(scheme: str, settings: StoreSettings) -> bool:
    """Whether ``scheme``'s store sends a customer-provided encryption key with each request
    (S3 SSE-C, Azure CPK): named in ``settings.credentials_env`` (the key is a secret:
    :class:`StoreSettings` refuses it in ``options``) or set in the environment obstore
    reads. Such objects are never read by a presigned URL: the key's headers cannot ride in
    one, and S3 answers 400 (Azure 409) to a GET without them."""
    if any(_CUSTOMER_KEY_OPTION.search(name) for name, _ in (*settings.credentials_env, *settings.options)):
        return True
    if any(value.lower() == "sse-c" for _, value in settings.options):  # aws_server_side_encryption
        return True
    return any(os.environ.get(variable) for variable in _CUSTOMER_KEY_ENV.get(scheme, ()))


def _env_endpoint(scheme: str) -> str:
    """The endpoint ``scheme``'s environment sets for obstore (the first of its variables, as
    ``build_store`` reads them), without a ``user:password@`` or a query; "" where none.
    For ``az://``, the account too (two accounts' container/key are two objects). Google's
    emulator host, and an Azure connection string's endpoint and account, where they are
    read (:func:`_environment_options`)."""
    endpoint = next((os.environ[v] for v in _ENDPOINT_ENV[scheme] if os.environ.get(v)), "")
    account = next((os.environ[v] for v in _ACCOUNT_ENV if os.environ.get(v)), "") if scheme == "az" else ""
    if scheme == "gs":
        endpoint = cloud_env.gcs_emulator(os.environ) or endpoint
    if scheme == "az":
        try:
            connection = cloud_env.azure_connection(os.environ)
        except cloud_env.ConfigError:  # refused where the store is built, naming what is wrong
            connection = None
        if connection:
            endpoint, account = connection["endpoint"], connection["account_name"]
    if endpoint:
        parts = urlsplit(endpoint)
        endpoint = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))
    if scheme == "az":
        endpoint = " ".join(part for part in (endpoint, account and f"account={account}") if part)
    return endpoint


_ACCOUNT_ENV = ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT")


# -- settings given to one pipeline in code

@dataclass(frozen=True)
class PipelineStores:
    """Settings one pipeline was given in code (``ShardLister(urls, store=...)``, ``ExactEpochs``,
    ``MixedEpochs``, ``build_index``): ``entries`` of (URL prefix, StoreSettings). For the URLs
    under one of its prefixes (the longest wins) they replace the process's
    :func:`set_store_settings` whole; other URLs keep those. Picklable, and holds no secret."""

    entries: tuple[tuple[str, StoreSettings], ...]

    @classmethod
    def of(cls, store: StoreArg) -> PipelineStores | None:
        """``store`` as a pipe's argument takes it: a StoreSettings (for every object-store URL
        of the pipeline), ``{prefix: StoreSettings}`` (``"s3://"``, ``"s3://bucket"``, ...), or None."""
        if store is None or isinstance(store, PipelineStores):
            return store
        if isinstance(store, StoreSettings):
            return cls((("", store),))
        if not isinstance(store, Mapping):
            raise TypeError(f"store= takes a StoreSettings or {{prefix: StoreSettings}}, got {type(store).__name__}")
        for prefix, settings in store.items():
            _check_prefix(prefix)
            if not isinstance(settings, StoreSettings):
                raise TypeError(f"store={{{prefix!r}: ...}} takes a StoreSettings, got {type(settings).__name__}")
        return cls(tuple(sorted(store.items())))

    def settings_for(self, url: str) -> StoreSettings | None:
        """The settings of the longest of its prefixes ``url`` starts with; None where none does."""
        text = str.__str__(url)
        best = max((e for e in self.entries if text.startswith(e[0])), key=lambda e: len(e[0]), default=None)
        return None if best is None else best[1]


# What a pipe's ``store=`` argument takes (see :meth:`PipelineStores.of`).
StoreArg = StoreSettings | Mapping[str, StoreSettings] | PipelineStores | None


class StoreUrl(str):
    """An object-store URL that carries its pipeline's :class:`PipelineStores` to the calls that
    open, stamp and list it: the settings go down with the URL through every pipe between
    the lister and ``load_tar`` (shuffles, splits, maps that pass it on), and pickle with it."""

    stores: PipelineStores

    def __new__(cls, url: str, stores: PipelineStores):
        self = super().__new__(cls, url)
        self.stores = stores
        return self

    def __reduce__(self) -> tuple:
        return StoreUrl, (str.__str__(self), self.stores)


def with_stores(url: str, stores: PipelineStores | None) -> str:
    """``url`` carrying ``stores`` (a :class:`StoreUrl`) where it is an object-store URL and
    ``stores`` is given; otherwise ``url`` as it is. Only a plain ``str`` (or a StoreUrl) is
    wrapped: a path found on disk (``LocalPath``) stays a path, whatever its text."""
    if stores is None or type(url) not in (str, StoreUrl) or url.partition("://")[0].lower() not in SCHEMES:
        return url
    return StoreUrl(str.__str__(url), stores)


def stores_of(url: str) -> PipelineStores | None:
    """The pipeline settings ``url`` carries, if any (to pass on to the URLs made from it)."""
    return url.stores if isinstance(url, StoreUrl) else None


def _check_prefix(prefix: str) -> None:
    scheme, sep, _ = str(prefix).partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise ValueError(f"a settings prefix starts with {', '.join(s + '://' for s in SCHEMES)}: got {prefix!r}")


def _sync_from_env() -> None:
    """Reads ``$WDS_STORE_SETTINGS`` when it changed (a spawned worker's first look)."""
    global _loaded_env
    raw = os.environ.get(SETTINGS_ENV)
    if raw == _loaded_env:
        return
    _settings.clear()
    if raw:
        try:
            _settings.update({p: StoreSettings.from_json(s) for p, s in json.loads(raw).items()})
        except (ValueError, TypeError) as exn:
            raise ValueError(f"${SETTINGS_ENV} is not what set_store_settings writes: {exn}") from None
    _loaded_env = raw


def obstore_module():
    """obstore, imported; a clear ImportError naming the extra where it is missing."""
    try:
        return importlib.import_module("obstore")
    except ImportError as exn:
        raise ImportError(f"s3://, gs:// and az:// URLs need obstore: {_INSTALL}") from exn


def build_store(scheme: str, bucket: str, settings: StoreSettings, limits: Limits):
    """A new obstore store for ``bucket``: the environment's configuration, then ``settings``.

    obstore's own retries are kept few and short (``Limits.http_retries``, within
    ``http_timeout``): the resuming stream above keeps the budget for reads."""
    obstore_module()
    store_module = importlib.import_module("obstore.store")
    config: dict[str, Any] = dict(_environment_options(scheme, settings))
    config.update(settings.options)
    for option, variable in settings.credentials_env:
        value = os.environ.get(variable)
        if value is None:
            raise ShardOpenError(f"{scheme}://{bucket}", f"missing credentials: ${variable} (for {option}) is not set")
        config[option] = value
    if settings.endpoint is not None:
        config["base_url" if scheme == "gs" else "endpoint"] = settings.endpoint
    if scheme == "s3" and settings.region is not None:
        config["region"] = settings.region
    if scheme == "s3" and settings.path_style is not None:
        config["virtual_hosted_style_request"] = not settings.path_style
    if settings.anonymous:
        config["skip_signature"] = True
    allow_http = settings.allow_http
    if allow_http is None:  # client options given replace obstore's reading of *_ALLOW_HTTP: read it here
        endpoint = (settings.endpoint or config.get("endpoint") or config.get("base_url")
                    or next((os.environ[v] for v in _ENDPOINT_ENV[scheme] if v in os.environ), ""))
        allow_http = endpoint.startswith("http://") or os.environ.get(_ALLOW_HTTP_ENV[scheme], "").lower() in (
            "1", "true", "yes")
    client: dict[str, Any] = {"timeout": _DEFAULT_TIMEOUT, "connect_timeout": timedelta(seconds=5)}
    if limits.http_timeout:
        client["read_timeout"] = timedelta(seconds=limits.http_timeout)
    if allow_http:
        client["allow_http"] = True
    retry = {"max_retries": min(2, limits.http_retries),
             "retry_timeout": timedelta(seconds=max(1.0, min(limits.http_timeout or 30.0, 30.0))),
             "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=2)}}
    provider = _provider(settings.credential_provider) or config.pop("credential_provider", None)
    cls = {"s3": store_module.S3Store, "gs": store_module.GCSStore, "az": store_module.AzureStore}[scheme]
    extra = {"credential_provider": provider} if provider is not None else {}
    return cls(bucket, config=config, client_options=client, retry_config=retry, **extra)


# The store options that say where a store is, not who calls it: any other option in code (but a
# customer's encryption key) names credentials (``account_key``, ``sas_key``, ``client_id``,
# ``use_azure_cli``, ``service_account_path``, ...) or, for gs, a base URL, and so comes before
# what the environment's variables say. (An unsigned gs store still goes to the emulator.)
_PLACE_OPTIONS = {"az": frozenset({"account_name", "endpoint", "use_emulator", "use_fabric_endpoint", "container_name",
                                   "disable_tagging"}),
                  "gs": frozenset({"bucket", "bucket_name", "skip_signature"})}


def _environment_options(scheme: str, settings: StoreSettings) -> dict[str, Any]:
    """The store options the cloud's usual variables give that obstore does not read itself
    (:mod:`.cloud_env`): an Azure connection string, Google's storage emulator host. Settings
    in code that name the account, the endpoint or the credentials come first: then neither
    is read. Raises cloud_env.ConfigError for a connection string that cannot be used."""
    named = {name for name, _ in (*settings.options, *settings.credentials_env)}
    in_code = bool(settings.credential_provider  # credentials, or a base URL (not a customer's encryption key)
                   or {n for n in named - _PLACE_OPTIONS.get(scheme, frozenset()) if not _CUSTOMER_KEY_OPTION.search(n)})
    if scheme == "az" and not named & {"account_name", "use_emulator"}:
        options = cloud_env.azure_connection(os.environ) or {}
        if in_code or settings.anonymous:  # the credentials named in code, alone
            options = {k: v for k, v in options.items() if k in ("account_name", "endpoint")}
        return options
    if scheme == "gs" and settings.endpoint is None and not in_code and (emulator := cloud_env.gcs_emulator(os.environ)):
        return {"base_url": emulator, "credential_provider": cloud_env.no_token}
    return {}


def unsigned(scheme: str, settings: StoreSettings) -> bool:
    """Whether ``scheme``'s store for ``settings`` sends unsigned requests (anonymous, or
    Google's storage emulator): it cannot presign a URL, so none is asked of it."""
    return settings.anonymous or (scheme == "gs" and "base_url" in _environment_options(scheme, settings))


def gcs_base_url(settings: StoreSettings) -> str:
    """Where a ``gs://`` store for ``settings`` sends its requests: the settings' endpoint, the
    emulator host, ``$GOOGLE_BASE_URL``, else Google's."""
    return (settings.endpoint or _environment_options("gs", settings).get("base_url")
            or os.environ.get("GOOGLE_BASE_URL") or "https://storage.googleapis.com").rstrip("/")


def _provider(spec: str | None):
    if spec is None:
        return None
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)()


_stores: dict[tuple, Any] = {}
# The variables a store reads where it is built: a store is built again when they change.
_ENV_PREFIXES = {"s3": ("AWS_",), "gs": ("GOOGLE_", "STORAGE_EMULATOR"), "az": ("AZURE_", "AZURITE_")}


def store_for(scheme: str, bucket: str, settings: StoreSettings, limits: Limits):
    """The store of this process for (bucket, settings, timeouts, the cloud's environment
    variables): one per process id, so a forked child never uses its parent's (a store is
    built where it is used); the variables are kept as a hash, never their values."""
    prefixes = _ENV_PREFIXES[scheme]  # the names scanned, then only their values read: a third of the cost
    environment = tuple(sorted((k, os.environ[k]) for k in os.environ if k.startswith(prefixes)))
    key = (os.getpid(), scheme, bucket, settings, limits.http_timeout, limits.http_retries, hash(environment))
    store = _stores.get(key)
    if store is None:
        if any(k[0] != key[0] for k in _stores):
            _stores.clear()  # the parent's stores, copied by a fork: never used here
        store = _stores[key] = build_store(scheme, bucket, settings, limits)
    return store
