"""What the object-store tests share (not in conftest.py: a module named ``conftest`` is a
different one in each test folder, so tests and credential providers import this by name)."""

from __future__ import annotations

import io
import random
import tarfile
from urllib.parse import unquote

import pytest
import webdataset as wds

from wds_datapipes.errors import ShardReadError
from wds_datapipes.shards.openers import open_shard, open_source
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


def tar_of(members) -> bytes:
    """A ustar archive of (name, bytes) members, written by ``tarfile`` (the tests' oracle writer)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def check_a_change_mid_read_is_a_read_error(store, fault_proxy, monkeypatch, limits) -> None:
    """The first answer of ``obj.tar`` is cut; before the resumed request reaches the server, the
    object is written again: the read fails with a ShardReadError saying it changed, naming it."""
    bucket = store.new_bucket()
    store.put(bucket, "obj.tar", random.Random(4).randbytes(1_000_000))

    def schedule(request):
        if request.method != "GET" or "obj.tar" not in unquote(request.path):  # GCS sends obj%2Etar
            return "ok"
        if request.number == 0:
            return "cut"
        store.put(bucket, "obj.tar", random.Random(5).randbytes(1_000_000))
        return "ok"

    through, _ = fault_proxy(store, schedule)
    configured(through, monkeypatch)
    with pytest.raises(ShardReadError, match="changed") as caught, \
            open_shard(through.url(bucket, "obj.tar"), 0, limits) as stream:
        stream.read()
    assert "obj.tar" in str(caught.value)


def read_object(url: str) -> bytes:
    """The object's bytes, read whole through our opener (the settings in force for ``url``)."""
    stream = open_source(url)
    try:
        return stream.read()
    finally:
        stream.close()
