"""What the clouds' usual environment says beyond the variables obstore reads itself.

Two variables that users of the official SDKs and of the emulators already have set, and
that obstore does not read:

- ``AZURE_STORAGE_CONNECTION_STRING`` (the Azure SDKs, the Azure CLI, Azurite's docs):
  ``Key=Value`` pairs separated by ``;``, read as the Azure SDKs read them (names in any
  case; ``AccountName``, ``AccountKey``, ``SharedAccessSignature``, ``BlobEndpoint``,
  ``DefaultEndpointsProtocol``, ``EndpointSuffix``, ``UseDevelopmentStorage=true``), and
  turned into the options of obstore's ``AzureStore`` (:func:`azure_connection`).
- ``STORAGE_EMULATOR_HOST`` (Google's client libraries, fake-gcs-server's README): every
  ``gs://`` request goes to that host, unauthenticated, as Google's clients do
  (:func:`gcs_emulator`).

Pure functions of an environment mapping (no I/O). A connection string holds a secret (an
account key, a SAS): no message made here shows any of its values, only the names of its
parts and their places.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from urllib.parse import urlsplit

CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"
EMULATOR_HOST_ENV = "STORAGE_EMULATOR_HOST"
# The variables of obstore's own that name an Azure account (or its emulator, which has one):
# where one is set, the connection string is not read (what worked before keeps working).
AZURE_ACCOUNT_ENV = ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_USE_EMULATOR")
# Azurite's published account and key (the same in every copy of it: not a secret, though
# it is never shown either) and its default blob address; obstore's emulator setting reads
# AZURITE_BLOB_STORAGE_URL for another address, and so does UseDevelopmentStorage=true here.
DEV_ACCOUNT = "devstoreaccount1"
DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
DEV_BLOB_URL_ENV = "AZURITE_BLOB_STORAGE_URL"
_DEV_BLOB_URL = "http://127.0.0.1:10000"
_DEV_BLOB_PORT = 10000
_SUFFIX = "core.windows.net"


class ConfigError(ValueError):
    """The environment's settings for a store cannot be used; the message names the variable
    and what is wrong or missing, never a value it holds."""


def azure_connection(environ: Mapping[str, str]) -> dict[str, str] | None:
    """The ``AzureStore`` options that ``$AZURE_STORAGE_CONNECTION_STRING`` gives, or None
    where it is unset, or where obstore's own variables name the account
    (:data:`AZURE_ACCOUNT_ENV`: those and the rest of ``AZURE_*`` are then read as before).
    Raises :class:`ConfigError` for a string that cannot be used."""
    text = environ.get(CONNECTION_STRING_ENV, "")
    if not text.strip() or any(environ.get(name) for name in AZURE_ACCOUNT_ENV):
        return None
    return parse_connection_string(text, environ.get(DEV_BLOB_URL_ENV) or _DEV_BLOB_URL)


def parse_connection_string(text: str, dev_blob_url: str = _DEV_BLOB_URL) -> dict[str, str]:
    """An Azure Storage connection string as ``AzureStore`` options: ``account_name``,
    ``endpoint`` (the blob service's), and the credential: ``account_key``, else
    ``sas_key``, else ``skip_signature`` (no credential: the SDKs then send anonymous
    requests), with ``credential_type`` naming which, so no other ``AZURE_*`` credential
    variable is mixed in. The rules are the Azure SDKs':

    - pairs are ``Name=Value`` separated by ``;`` (empty parts ignored), names in any case,
      a value may hold ``=``;
    - ``BlobEndpoint`` is the endpoint; else ``DefaultEndpointsProtocol`` (https) ``://``
      account ``.blob.`` ``EndpointSuffix`` (core.windows.net);
    - the account is ``AccountName``; else, beside a ``BlobEndpoint``, the endpoint's first
      host label (``acct.blob.core.windows.net``), or its first path segment where the host
      is an address or localhost (``http://127.0.0.1:10000/devstoreaccount1``);
    - ``UseDevelopmentStorage=true`` is Azurite at ``dev_blob_url`` (or at
      ``DevelopmentStorageProxyUri``'s host, port 10000) with its published account and key.
    """
    pairs = _pairs(text)
    if pairs.get("usedevelopmentstorage", "").lower() == "true":
        proxy = pairs.get("developmentstorageproxyuri")
        if proxy:
            parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
            base = f"{parts.scheme}://{parts.hostname}:{_DEV_BLOB_PORT}"
        else:
            base = dev_blob_url.rstrip("/")
        return {"account_name": DEV_ACCOUNT, "endpoint": f"{base}/{DEV_ACCOUNT}", "account_key": DEV_KEY,
                "credential_type": "access_key"}
    account = pairs.get("accountname", "")
    endpoint = pairs.get("blobendpoint", "").rstrip("/")
    if endpoint and "://" not in endpoint:
        raise ConfigError(f"${CONNECTION_STRING_ENV}: BlobEndpoint is not a URL (http:// or https://)")
    if not endpoint and account:
        protocol = pairs.get("defaultendpointsprotocol", "https").lower()
        if protocol not in ("http", "https"):
            raise ConfigError(f"${CONNECTION_STRING_ENV}: DefaultEndpointsProtocol must be http or https")
        endpoint = f"{protocol}://{account}.blob.{pairs.get('endpointsuffix', _SUFFIX).strip('.')}"
    if not account and endpoint:
        account = _account_of(endpoint)
    if not account:
        raise ConfigError(f"${CONNECTION_STRING_ENV} names no storage account: it needs AccountName=... "
                          "(or a BlobEndpoint=https://ACCOUNT.blob.core.windows.net)")
    options = {"account_name": account, "endpoint": endpoint}
    if pairs.get("accountkey"):
        options.update(account_key=pairs["accountkey"], credential_type="access_key")
    elif pairs.get("sharedaccesssignature"):
        options.update(sas_key=pairs["sharedaccesssignature"].lstrip("?"), credential_type="sas_token")
    else:
        options["skip_signature"] = "true"
    return options


def _pairs(text: str) -> dict[str, str]:
    """The ``Name=Value`` pairs of a connection string, names lower-cased; a part without
    ``=`` is refused by its place (never its text: it may be a key)."""
    parts = [part for part in text.split(";") if part.strip()]
    pairs = {}
    for place, part in enumerate(parts, 1):
        name, sep, value = part.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"${CONNECTION_STRING_ENV} is malformed: part {place} of {len(parts)} is not "
                              "Name=Value (the string is Name=Value pairs separated by ';')")
        pairs[name.strip().lower()] = value.strip()
    return pairs


def _account_of(endpoint: str) -> str:
    """The account a blob endpoint names: its first path segment where the host is an address
    or localhost (Azurite's path style), else its host's first label."""
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    try:
        ipaddress.ip_address(host)
        path_style = True
    except ValueError:
        path_style = host == "localhost"
    if path_style:
        return parts.path.strip("/").partition("/")[0]
    return host.partition(".")[0]


def gcs_emulator(environ: Mapping[str, str]) -> str | None:
    """The base URL ``$STORAGE_EMULATOR_HOST`` names (``http://`` added where it names no
    scheme, as Google's clients do), or None where it is unset."""
    host = environ.get(EMULATOR_HOST_ENV, "").strip()
    if not host:
        return None
    return (host if "://" in host else f"http://{host}").rstrip("/")


def no_token() -> dict:
    """A GCS credential provider giving an empty token: no credential is looked up and none
    is sent, so the emulator's requests are unauthenticated, as Google's clients send them
    (obstore's ``skip_signature`` is not enough: an upload still asks the metadata server
    for a token)."""
    return {"token": "", "expires_at": None}
