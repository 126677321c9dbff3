"""ETL server classes for the tests, written as for a cluster: each would run there unchanged."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator

from aistore.sdk.etl.webserver.http_multi_threaded_server import HTTPMultiThreadedServer


class AddToClass(HTTPMultiThreadedServer):
    """Adds ``etl_args["add"]`` to the label in every ``.cls`` member of a shard; the rest passes through."""

    def transform(self, data: bytes, path: str, etl_args: str) -> bytes:
        add = json.loads(etl_args or "{}").get("add", 0)
        out = io.BytesIO()
        with tarfile.open(fileobj=io.BytesIO(data)) as src, tarfile.open(fileobj=out, mode="w") as dst:
            for member in src:
                payload = src.extractfile(member).read() if member.isfile() else None
                if member.name.endswith(".cls"):
                    payload = str(int(payload) + add).encode()
                    member.size = len(payload)
                dst.addfile(member, io.BytesIO(payload) if payload is not None else None)
        return out.getvalue()


class Passthrough(HTTPMultiThreadedServer):
    """A streaming ETL (``transform_stream``): the object's bytes, in 64 KiB chunks."""

    def transform_stream(self, reader, path: str, etl_args: str) -> Iterator[bytes]:
        while chunk := reader.read(1 << 16):
            yield chunk


class EchoRequest(HTTPMultiThreadedServer):
    """Answers with the path and arguments it was given: what a target tells the server."""

    def transform(self, data: bytes, path: str, etl_args: str) -> bytes:
        return json.dumps({"path": path, "etl_args": etl_args, "size": len(data)}).encode()


class Failing(HTTPMultiThreadedServer):
    """A transform that raises."""

    def transform(self, data: bytes, path: str, etl_args: str) -> bytes:
        raise RuntimeError("model weights not found")
