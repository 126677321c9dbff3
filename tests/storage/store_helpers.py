"""What the object-store tests share (not in conftest.py: a module named ``conftest`` is a
different one in each test folder, so tests and credential providers import this by name)."""

from __future__ import annotations

import io

import webdataset as wds

from wds_datapipes.storage import cloud_settings


def configured(server, monkeypatch):
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(cloud_settings.SETTINGS_ENV, raising=False)
    monkeypatch.setattr(cloud_settings, "_settings", {})
    monkeypatch.setattr(cloud_settings, "_loaded_env", None)
    return server


def shard_bytes(name: str, n: int, size: int = 1000) -> bytes:
    """A tar shard of ``n`` samples ``{name}-{i}`` (a ``cls`` and a ``bin`` of ``size`` bytes)."""
    out = io.BytesIO()
    with wds.TarWriter(out) as writer:
        for i in range(n):
            writer.write({"__key__": f"{name}-{i:04d}", "cls": str(i).encode(),
                          "bin": bytes((i + j) % 251 for j in range(size))})
    return out.getvalue()


def provided_credentials() -> object:
    """A credential provider for ``StoreSettings(credential_provider="store_helpers:provided_credentials")``:
    keys that AIStore's /s3 (auth off) accepts, given by a function, not by the environment."""
    return lambda: {"access_key_id": "from-provider", "secret_access_key": "provider-secret", "token": None,
                    "expires_at": None}
