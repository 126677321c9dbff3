"""The ``ais`` opener: ``ais://bucket/object`` URLs as sequential streams, from any byte.

The core's opener for the ``ais`` scheme (registered by importing :mod:`aisio`, or
lazily through the ``wds_datapipes.openers`` entry point). A plain object is read by
:class:`~aisio.streams.AISObjectStream`; one with ``etl_local=`` through the ETL class
run in this process (:mod:`aisio.local_etl`).
"""

from __future__ import annotations

import io
from urllib.parse import quote

from . import rest
from .client import AISUrl, endpoint
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


def ais_source_stamp(url: str, limits=None) -> tuple[int | None, str | None] | None:
    """(size, version) of an object as the cluster says now (a HEAD request), for the shard cache;
    None for a URL with an ETL (its output has no version to ask for)."""
    aurl = AISUrl.parse(url)
    if aurl.etl_name or not aurl.object:
        return None
    path = f"/v1/objects/{quote(aurl.bucket, safe='')}/{quote(aurl.object, safe='/')}?provider=ais"
    reply = rest.request("HEAD", f"{endpoint()}{path}")
    with reply:
        if reply.status != 200:
            raise OSError(f"HEAD {aurl.plain}: HTTP {reply.status}")
        headers = reply.headers
    size = headers.get("Ais-Size") or headers.get("Content-Length")
    identity = (headers.get("Ais-Version"), headers.get("Ais-Checksum-Value"))
    version = None if identity == (None, None) else "/".join(part or "" for part in identity)
    return (int(size) if size and size.isdigit() else None), version


open_ais_url.source_stamp = ais_source_stamp  # the shard cache asks the opener whether its copy is current
