"""The ``ais`` opener: ``ais://bucket/object`` URLs as sequential streams, from any byte.

The core's opener for the ``ais`` scheme (registered by importing :mod:`aisio`, or
lazily through the ``wds_datapipes.openers`` entry point). A plain object is read by
:class:`~aisio.streams.AISObjectStream`; one with ``etl_local=`` through the ETL class
run in this process (:mod:`aisio.local_etl`).
"""

from __future__ import annotations

import io

from .client import AISUrl
from .local_etl import open_transformed
from .streams import AISObjectStream


def open_ais_url(url: str, start: int = 0) -> io.RawIOBase:
    """Open ``ais://bucket/object[?etl_name=..&etl_args=..[&etl_local=module:Class]]`` for
    sequential reading from byte ``start`` (the ``ais`` opener).

    The cluster is ``$AIS_ENDPOINT``. Failures raise
    :class:`~wds_datapipes.errors.ShardOpenError` naming the bucket, object or ETL, the node
    and its answer; a stream that breaks mid-object resumes from its position. With
    ``etl_local``, this process runs the ETL class on the object (:mod:`aisio.local_etl`)
    and ``start`` counts in its output.

    Example:
        >>> with open_ais_url("ais://train/shard-000000.tar") as stream: head = stream.read(512)
        >>> with open_ais_url("ais://train/shard-000000.tar", start=1 << 20) as stream: ...
    """
    if "etl_local=" in url and AISUrl.parse(url).etl_local:
        return open_transformed(url, start)
    return AISObjectStream(url, start)
