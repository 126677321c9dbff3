"""AIStore clients that fail fast, and parsing of ``ais://`` URLs.

The cluster is the one ``$AIS_ENDPOINT`` names (the SDK's and CLI's convention), so
DataLoader workers, which inherit the environment, reach the same cluster as the main
process. :func:`set_endpoint` sets it from Python.

The SDK's default retries wait minutes on an unreachable cluster or a failing node (7
network attempts with waits up to 30 s, 5 HTTP retries with backoff up to 48 s). The
clients made here retry a few times within seconds, and never retry 4xx/5xx answers that
will not change (404 missing, 501 not supported).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from urllib.parse import parse_qs, urlencode

from aistore.sdk import Client
from aistore.sdk.etl import ETLConfig
from aistore.sdk.retry_config import RetryConfig
from requests.exceptions import ChunkedEncodingError, ConnectionError, ConnectTimeout, ReadTimeout
from tenacity import (
    Retrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)
from urllib3.exceptions import TimeoutError as Urllib3TimeoutError
from urllib3.util.retry import Retry

ENDPOINT_ENV = "AIS_ENDPOINT"
DEFAULT_ENDPOINT = "http://localhost:8080"
_URL_PARAMS = frozenset(("etl_name", "etl_args", "etl_local"))

logger = logging.getLogger("aisio")


def endpoint() -> str:
    """The cluster endpoint: ``$AIS_ENDPOINT``, else ``http://localhost:8080``."""
    return os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT


def set_endpoint(url: str) -> None:
    """Point this process, and worker processes it starts later, at the cluster ``url``."""
    os.environ[ENDPOINT_ENV] = url.rstrip("/")


def fast_retry_config(attempts: int = 3) -> RetryConfig:
    """Retries that give up within seconds: ``attempts`` tries on network errors, with
    waits of at most 2 s, and 2 quick HTTP retries on 429/502/503/504 only."""
    return RetryConfig(
        http_retry=Retry(
            total=2,
            backoff_factor=0.25,
            status_forcelist=[429, 502, 503, 504],
            connect=0,
            read=0,
        ),
        network_retry=Retrying(
            wait=wait_random_exponential(multiplier=0.2, max=2),
            stop=stop_after_attempt(attempts),
            retry=retry_if_exception_type(
                (ConnectTimeout, ReadTimeout, ChunkedEncodingError, ConnectionError, Urllib3TimeoutError)
            ),
            before_sleep=before_sleep_log(logger, logging.WARNING),
            reraise=True,
        ),
    )


_CLIENTS: dict[tuple[int, str], Client] = {}


def get_client(url: str | None = None) -> Client:
    """A client for ``url`` (default: :func:`endpoint`) with :func:`fast_retry_config`.

    One per process and endpoint: clients are made where they are used, never pickled
    (a pickled SDK client loses its retry policy), so each DataLoader worker has its own.
    """
    url = (url or endpoint()).rstrip("/")
    key = (os.getpid(), url)
    client = _CLIENTS.get(key)
    if client is None:
        client = Client(url, retry_config=fast_retry_config(), timeout=(3.0, 30.0))
        _CLIENTS[key] = client
    return client


@dataclass(frozen=True)
class AISUrl:
    """A parsed ``ais://bucket/object?etl_name=NAME&etl_args=ARGS&etl_local=MODULE:CLASS`` URL.

    ``object`` may be empty (a bucket, or a bucket and a prefix, for listing). The query
    is optional and recognised only when it holds nothing but ``etl_name``, ``etl_args``
    and ``etl_local``; any other ``?`` is part of the object name. ``etl_local`` names the
    ETL server class whose transform the reader runs itself (see :mod:`aisio.local_etl`);
    without it, the cluster runs the ETL ``etl_name``.
    """

    bucket: str
    object: str = ""
    etl_name: str | None = None
    etl_args: str | None = None
    etl_local: str | None = None

    @classmethod
    def parse(cls, url: str) -> AISUrl:
        """The parts of an ``ais://`` URL; raises ValueError for another scheme, no bucket, or ETL
        arguments without ``etl_name``."""
        if not url.startswith("ais://"):
            raise ValueError(f"not an ais:// URL: {url!r}")
        rest = url[len("ais://"):]
        etl_name = etl_args = etl_local = None
        head, sep, query = rest.rpartition("?")
        if sep:
            params = parse_qs(query, keep_blank_values=True)
            if params and set(params) <= _URL_PARAMS and all(len(v) == 1 for v in params.values()):
                rest = head
                etl_name = params.get("etl_name", [None])[0] or None
                etl_args = params.get("etl_args", [None])[0]
                etl_local = params.get("etl_local", [None])[0] or None
        bucket, _, obj = rest.partition("/")
        if not bucket:
            raise ValueError(f"no bucket in {url!r}")
        if (etl_args is not None or etl_local is not None) and etl_name is None:
            raise ValueError(f"etl_args or etl_local without etl_name in {url!r}")
        return cls(bucket, obj, etl_name, etl_args, etl_local)

    def with_object(self, name: str) -> AISUrl:
        """The same bucket and ETL, object ``name``."""
        return AISUrl(self.bucket, name, self.etl_name, self.etl_args, self.etl_local)

    def with_etl(self, name: str | None, args: str | dict | None = None, local: str | None = None) -> AISUrl:
        """The same object through ETL ``name`` (None: none), with its ``args`` (a dict becomes
        compact JSON) and ``local`` server class."""
        if isinstance(args, dict):
            args = json.dumps(args, separators=(",", ":"), sort_keys=True)
        return AISUrl(self.bucket, self.object, name, args if name else None, local if name else None)

    @property
    def etl(self) -> ETLConfig | None:
        """The ETL for the cluster to run (``None`` when there is none, or the reader runs it)."""
        return ETLConfig(self.etl_name, self.etl_args) if self.etl_name and not self.etl_local else None

    @property
    def plain(self) -> str:
        """``ais://bucket/object`` without the ETL query."""
        return f"ais://{self.bucket}/{self.object}"

    def __str__(self) -> str:
        if not self.etl_name:
            return self.plain
        params = {"etl_name": self.etl_name}
        if self.etl_args is not None:
            params["etl_args"] = self.etl_args
        if self.etl_local is not None:
            params["etl_local"] = self.etl_local
        return f"{self.plain}?{urlencode(params)}"
