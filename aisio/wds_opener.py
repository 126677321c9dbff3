"""``ais://`` URLs in plain ``webdataset`` pipelines: our opener in webdataset's URL table.

Importing :mod:`aisio` calls :func:`register_with_webdataset`, after which
``webdataset.WebDataset("ais://bucket/train-{000..099}.tar")`` reads through
:func:`aisio.open_ais_url` (resumes, retries, errors naming the node; and the shard cache,
where :func:`wds_datapipes.set_cache` turns it on) instead of
webdataset's default for ``ais://``, a subprocess running the ``ais`` CLI; and
``webdataset.ShardWriter("ais://bucket/train-%06d.tar")`` / ``TarWriter`` upload each shard
when it closes, without that CLI.
"""

from __future__ import annotations

import importlib
import io

from wds_datapipes.shards.openers import open_shard
from wds_datapipes.shards.wds_gopen import UploadOnClose

_READ_BUFFER = 1 << 20  # tarfile reads 10 KiB at a time: buffer the raw stream


def gopen_ais(url: str, mode: str = "rb", bufsize: int = 8192, **kw) -> io.IOBase:
    """webdataset's ``gopen`` handler for ``ais://`` URLs: a buffered stream to read (through the
    shard cache where it is on, as our readers do), or a file that uploads itself on
    ``close()`` to write."""
    if mode == "rb":
        return io.BufferedReader(open_shard(url), buffer_size=_READ_BUFFER)
    if mode == "wb":
        return UploadOnClose(url)
    raise ValueError(f"{url}: cannot open in mode {mode!r} (rb or wb)")


def register_with_webdataset() -> bool:
    """Make webdataset open ``ais://`` URLs with ``gopen_ais``; ``False`` without webdataset."""
    try:
        gopen = importlib.import_module("webdataset.gopen")  # the module (the package exports a function of that name)
    except ImportError:
        return False
    gopen.gopen_schemes["ais"] = gopen_ais
    return True
