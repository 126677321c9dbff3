"""Object-store settings on the command line: ``--endpoint URL`` and ``--store-option KEY=VALUE``.

Every command that reads or writes shards (``create``, ``index``, ``verify``, ``inspect``)
takes the same two arguments, and they make one :class:`~.cloud_settings.StoreSettings`
for every ``s3://``, ``gs://`` and ``az://`` URL of that command (its sources, its shards,
its index), ahead of the process's settings and environment, as a pipeline's ``store=``:

- ``--endpoint URL``: the server (an S3-compatible one such as AIStore's ``/s3``, MinIO;
  GCS's base URL; Azure's blob endpoint). Plain ``http://`` is allowed where it says so.
- ``--store-option KEY=VALUE`` (repeatable): an obstore store option (``region=us-east-1``,
  ``virtual_hosted_style_request=false``, ``skip_signature=true``, ``account_name=...``).
  A KEY that names a secret (``secret_access_key``, ``account_key``, ``token``, ``sas_key``,
  ...) is accepted, but its VALUE never enters the settings: it moves into an environment
  variable of this process (``WDS_STORE_OPTION_<KEY>``, inherited by the command's worker
  processes) that the settings name, as ``credentials_env`` names one. So no message, log
  line, progress line or pickle can show it; the command line itself can (``ps``): the
  cloud's standard variables (``AWS_SECRET_ACCESS_KEY``, ...) are the safer place.

Errors about these arguments name the KEY, never the VALUE.
"""

from __future__ import annotations

import argparse
import os
import re

from .cloud_settings import StoreSettings, looks_secret

SECRET_ENV_PREFIX = "WDS_STORE_OPTION_"
_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_]*")  # an option's name: shown in errors (its value never)


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``--endpoint`` and ``--store-option`` to a command's parser (one group, one help text)."""
    group = parser.add_argument_group(
        "object stores (s3://, gs://, az://)",
        "settings for every object-store URL of this command, ahead of the environment's (AWS_*, GOOGLE_*, "
        "AZURE_*); a secret's value (secret_access_key=..., account_key=...) is never printed (the standard "
        "variables, e.g. AWS_SECRET_ACCESS_KEY, keep it off the command line)")
    group.add_argument("--endpoint", metavar="URL",
                       help="the store's server, e.g. http://HOST:PORT/s3 (AIStore), https://minio.example:9000")
    group.add_argument("--store-option", action="append", default=[], metavar="KEY=VALUE",
                       help="an obstore store option (repeatable): region=us-east-1, "
                       "virtual_hosted_style_request=false, skip_signature=true, access_key_id=..., "
                       "secret_access_key=...")


def store_of_arguments(args: argparse.Namespace) -> StoreSettings | None:
    """The settings ``--endpoint`` and ``--store-option`` give (None where neither is given).

    A secret option's value is put in ``$WDS_STORE_OPTION_<KEY>`` and named in
    ``credentials_env``. Raises ValueError naming a malformed option by its KEY only."""
    endpoint = getattr(args, "endpoint", None)
    given = getattr(args, "store_option", None) or []
    if endpoint is None and not given:
        return None
    options: dict[str, str] = {}
    credentials: dict[str, str] = {}
    for number, text in enumerate(given, 1):
        key, found, value = text.partition("=")
        key = key.strip()
        named = _KEY.fullmatch(key) is not None
        if not found or not named:
            shown = f" ({key!r})" if named else ""
            raise ValueError(f"--store-option number {number}{shown} is not KEY=VALUE (a KEY of letters, "
                             "digits and _; its value is not shown)")
        if key.lower() in ("endpoint", "base_url", "aws_endpoint", "aws_endpoint_url"):
            raise ValueError(f"--store-option {key}: give the server with --endpoint URL")
        if looks_secret(key):
            variable = SECRET_ENV_PREFIX + key.upper()
            os.environ[variable] = value
            credentials[key] = variable
        else:
            options[key] = value
    try:
        return StoreSettings(endpoint=endpoint, options=options, credentials_env=credentials)
    except ValueError as exn:  # an endpoint with user:password@ or a query: named, not shown
        raise ValueError(f"--endpoint: {exn}") from None


__all__ = ["SECRET_ENV_PREFIX", "add_store_arguments", "store_of_arguments"]
