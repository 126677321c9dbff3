"""Our back ends in plain ``webdataset`` pipelines: our opener in webdataset's URL table.

After :func:`register_with_webdataset`, ``webdataset.WebDataset("s3://bucket/train-{000..099}.tar")``
reads through :func:`~wds_datapipes.shards.openers.open_shard` (Range starts, resumes,
errors naming the object, and the shard cache where :func:`wds_datapipes.set_cache` turns
it on) instead of a subprocess (webdataset 1.0.2 opens ``gs://`` with ``gsutil cat`` and
has no handler for ``s3://`` or ``az://``); and ``webdataset.ShardWriter("s3://bucket/train-%06d.tar")``
uploads each shard when it closes, through the back end's ``put``.

One pipeline's own object-store settings (as ``ShardLister(urls, store=...)`` takes them)
reach webdataset on the URLs themselves, since its URL table is global: :func:`store_urls`
gives the list of URLs to hand to ``WebDataset`` (a list passes through webdataset's
shard list, shuffles, node and worker splits and DataLoader pickles as it is, each URL a
:class:`~wds_datapipes.storage.cloud_settings.StoreUrl`, whereas a brace pattern given to
webdataset is expanded by ``braceexpand`` into plain strings, which fall back to the
process's settings); :class:`StoreOpener` is ``ShardWriter``'s ``opener`` that does the same
for each shard it names.
"""

from __future__ import annotations

import importlib
import io
import os
import tempfile
from collections.abc import Iterable

from ..storage.cloud_settings import PipelineStores, StoreArg, with_stores
from .listing import expand_url_spec
from .openers import backend_for, open_shard

_READ_BUFFER = 1 << 20  # tarfile reads 10 KiB at a time: buffer the raw stream
OBJECT_SCHEMES = ("s3", "gs", "az")


class UploadOnClose(io.BufferedWriter):
    """A local temporary file that becomes the object ``url`` when closed (the back end's ``put``)."""

    def __init__(self, url: str):
        self.put = backend_for(url).put
        if self.put is None:
            raise ValueError(f"{url}: its back end cannot write objects")
        fd, self._path = tempfile.mkstemp(prefix="wds-upload-", suffix=".part")
        super().__init__(io.FileIO(fd, "wb"), buffer_size=_READ_BUFFER)
        self.url = url

    def close(self) -> None:
        if self.closed:
            return
        try:
            super().close()
            self.put(self._path, self.url)
        finally:
            if os.path.exists(self._path):
                os.unlink(self._path)


def gopen_backend(url: str, mode: str = "rb", bufsize: int = 8192, **kw) -> io.IOBase:
    """webdataset's ``gopen`` handler: a buffered stream to read, or a file that uploads itself on close."""
    if mode == "rb":
        return io.BufferedReader(open_shard(url), buffer_size=_READ_BUFFER)
    if mode == "wb":
        return UploadOnClose(url)
    raise ValueError(f"{url}: cannot open in mode {mode!r} (rb or wb)")


def register_with_webdataset(schemes: tuple[str, ...] = OBJECT_SCHEMES) -> bool:
    """Make webdataset open URLs of ``schemes`` with ``gopen_backend``; ``False`` without webdataset."""
    try:
        gopen = importlib.import_module("webdataset.gopen")  # the module (the package exports a function of that name)
    except ImportError:
        return False
    for scheme in schemes:
        gopen.gopen_schemes[scheme] = gopen_backend
    return True


def store_urls(urls: str | Iterable[str], store: StoreArg) -> list[str]:
    """The shard URLs ``urls`` names, for ``webdataset.WebDataset``, each ``s3://``, ``gs://``
    and ``az://`` one carrying ``store`` (a StoreSettings, or ``{prefix: StoreSettings}``):
    read through :func:`gopen_backend`, it reaches the server those settings name, ahead of
    the process's. ``urls``: a spec (braces and ``::`` expanded, ``${NAME}`` read from
    ``$WDS_NAME``, as webdataset expands them; no listing) or a list of them."""
    stores = PipelineStores.of(store)
    specs = [urls] if isinstance(urls, str) else list(urls)
    return [with_stores(url, stores) for spec in specs for url in expand_url_spec(spec)]


class StoreOpener:
    """``webdataset.ShardWriter(pattern, opener=StoreOpener(store))``: each shard's name
    (``pattern % n``, a plain string) becomes a URL carrying ``store``, which ``TarWriter``
    opens through webdataset's ``gopen`` and so :func:`gopen_backend`: the upload goes to the
    server the settings name. Picklable; holds no secret."""

    def __init__(self, store: StoreArg):
        self.stores = PipelineStores.of(store)

    def __call__(self, name: str) -> str:
        """``name`` carrying the settings (TarWriter opens a name it is given, and closes it)."""
        return with_stores(name, self.stores)
