"""The ``ais`` back end record: open, stamp, list and put of ``ais://`` objects, in one place.

Registered by importing :mod:`aisio`, and lazily through the ``wds_datapipes.backends``
entry point (``ais = "aisio.backend:BACKEND"``), so DataLoader workers find ``ais://``
with no import in user code.
"""

from __future__ import annotations

import os

from wds_datapipes.limits import Limits
from wds_datapipes.storage.backend import Backend

from .listing import list_ais_urls
from .opener import ais_source_stamp, open_ais_url
from .upload import upload_file


def put_ais(path: str | os.PathLike, url: str, limits: Limits | None = None) -> str | None:
    """Upload the local file ``path`` as the object ``url`` (:func:`aisio.upload.upload_file`);
    returns the object's version as the cluster then says it."""
    upload_file(path, url)
    stamp = ais_source_stamp(url, limits)
    return stamp[1] if stamp else None


BACKEND = Backend("ais", open_ais_url, stamp=ais_source_stamp, list=list_ais_urls, put=put_ais)
