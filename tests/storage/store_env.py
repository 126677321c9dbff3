"""An environment holding only the variables a test names, for the object-store back ends
(not in conftest.py: test modules import this by name)."""

from __future__ import annotations

import os

from wds_datapipes.storage import cloud_settings

# Every variable a store reads where it is built (obstore's, the SDKs', the emulators', the
# metadata servers' overrides), so that nothing from the machine or another test leaks in.
CLOUD_PREFIXES = ("AWS_", "GOOGLE_", "GCE_METADATA", "AZURE_", "AZURITE_", "STORAGE_EMULATOR_HOST")


def only(monkeypatch, **variables: str) -> None:
    """This process's cloud environment is ``variables`` alone (monkeypatched: put back after
    the test), with no store settings in code."""
    for name in list(os.environ):
        if name.startswith(CLOUD_PREFIXES):
            monkeypatch.delenv(name)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(cloud_settings.SETTINGS_ENV, raising=False)
    monkeypatch.setattr(cloud_settings, "_settings", {})
    monkeypatch.setattr(cloud_settings, "_loaded_env", None)
