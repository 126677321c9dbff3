"""One S3 client per process, timed reading whole objects: the worker side of
``bench_storage``'s client table (part 1).

    python -m benchmarks.storage_clients CLIENT ENDPOINT

Reads JSON requests from stdin, one a line: ``{"bucket": B, "keys": [K, ...]}``; reads every
object ``B/K`` in turn, streamed in 1 MiB pieces where the client streams, and answers one
JSON line ``{"seconds": S, "bytes": N}``. Only the standard library is imported at the top
(and ``benchmarks/__init__.py`` imports nothing), so that a venv holding just one client
(s3fs cannot share one with boto3 1.44: its aiobotocore pins an older botocore) can run
this module with the checkout on ``PYTHONPATH``. ENDPOINT is the AIStore proxy; the S3 API
is ``ENDPOINT/s3``, path style, any credentials (auth off).
"""

from __future__ import annotations

import http.client
import json
import sys
import time
import urllib.parse
from collections.abc import Callable

PIECE = 1 << 20
KEY, SECRET, REGION = "bench", "bench-secret", "us-east-1"


def _drain_reads(read: Callable[[int], bytes]) -> int:
    total = 0
    while chunk := read(PIECE):
        total += len(chunk)
    return total


def http_client(endpoint: str) -> Callable[[str, str], int]:
    """Plain http.client, one kept-alive connection (opened again where the server closed it
    while idle, as urllib3 does), unsigned GET of ``/s3/B/K``."""
    parts = urllib.parse.urlsplit(endpoint)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)

    def read(bucket: str, key: str) -> int:
        try:
            conn.request("GET", f"/s3/{bucket}/{urllib.parse.quote(key)}")
            resp = conn.getresponse()
        except (http.client.RemoteDisconnected, ConnectionError):  # the server closed an idle one: reconnect
            conn.close()
            conn.request("GET", f"/s3/{bucket}/{urllib.parse.quote(key)}")
            resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"GET {bucket}/{key}: {resp.status} {resp.read(200)!r}")
        return _drain_reads(resp.read)
    return read


def boto3_client(endpoint: str) -> Callable[[str, str], int]:
    """boto3 ``get_object``, the body streamed with ``iter_chunks``."""
    import boto3
    from botocore.config import Config

    s3 = boto3.client("s3", endpoint_url=f"{endpoint}/s3", aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                      region_name=REGION, config=Config(s3={"addressing_style": "path"}))

    def read(bucket: str, key: str) -> int:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
        return sum(len(c) for c in body.iter_chunks(PIECE))
    return read


def obstore_client(endpoint: str) -> Callable[[str, str], int]:
    """obstore ``get`` on an S3Store per bucket, streamed (``min_chunk_size`` 1 MiB)."""
    import obstore
    from obstore.store import S3Store

    stores: dict[str, S3Store] = {}

    def read(bucket: str, key: str) -> int:
        if bucket not in stores:
            stores[bucket] = S3Store(bucket, endpoint=f"{endpoint}/s3", virtual_hosted_style_request=False,
                                     region=REGION, access_key_id=KEY, secret_access_key=SECRET,
                                     client_options={"allow_http": True})
        return sum(len(c) for c in obstore.get(stores[bucket], key).stream(min_chunk_size=PIECE))
    return read


def s3fs_client(endpoint: str) -> Callable[[str, str], int]:
    """s3fs (fsspec) ``open(..., "rb")`` with its defaults, read in 1 MiB pieces."""
    import s3fs

    fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, endpoint_url=f"{endpoint}/s3",
                           client_kwargs={"region_name": REGION}, config_kwargs={"s3": {"addressing_style": "path"}})

    def read(bucket: str, key: str) -> int:
        with fs.open(f"{bucket}/{key}", "rb") as f:
            return _drain_reads(f.read)
    return read


def msc_client(endpoint: str) -> Callable[[str, str], int]:
    """NVIDIA multi-storage-client ``StorageClient.read`` (a whole object; its ``open`` goes
    through a local file), one profile per bucket. (Its ``rust_client`` option took 23 s per
    64 MB object against AIS's /s3 here, every time; not investigated, so not a row.)"""
    from multistorageclient import StorageClient, StorageClientConfig

    clients: dict[str, StorageClient] = {}

    def read(bucket: str, key: str) -> int:
        if bucket not in clients:
            options = {"base_path": bucket, "endpoint_url": f"{endpoint}/s3", "region_name": REGION,
                       "s3": {"addressing_style": "path"}}
            config = {"profiles": {"bench": {
                "storage_provider": {"type": "s3", "options": options},
                "credentials_provider": {"type": "S3Credentials",
                                         "options": {"access_key": KEY, "secret_key": SECRET}}}}}
            clients[bucket] = StorageClient(StorageClientConfig.from_dict(config, profile="bench"))
        return len(clients[bucket].read(key))
    return read


def ours_ais(endpoint: str) -> Callable[[str, str], int]:
    """Our ``ais://`` stream (aisio's reader of the native API), $AIS_ENDPOINT = ENDPOINT."""
    import os

    os.environ["AIS_ENDPOINT"] = endpoint
    from aisio import open_ais_url

    def read(bucket: str, key: str) -> int:
        with open_ais_url(f"ais://{bucket}/{key}") as stream:
            return _drain_reads(stream.read)
    return read


def ours_http(endpoint: str) -> Callable[[str, str], int]:
    """Our ``http://`` opener (wds_datapipes) on the same ``/s3/B/K`` URL."""
    from wds_datapipes.shards.openers import open_shard

    def read(bucket: str, key: str) -> int:
        with open_shard(f"{endpoint}/s3/{bucket}/{key}") as stream:
            return _drain_reads(stream.read)
    return read


CLIENTS: dict[str, Callable[[str], Callable[[str, str], int]]] = {
    "http.client": http_client,
    "ours, http://": ours_http,
    "ours, ais://": ours_ais,
    "obstore": obstore_client,
    "boto3": boto3_client,
    "s3fs": s3fs_client,
    "multi-storage-client": msc_client,
}


def main() -> None:
    name, endpoint = sys.argv[1], sys.argv[2]
    try:
        read = CLIENTS[name](endpoint)
    except Exception as exn:  # noqa: BLE001 - the parent reports why a client is missing
        print(json.dumps({"error": f"{type(exn).__name__}: {exn}"}), flush=True)
        return
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        started, total = time.perf_counter(), 0
        try:
            for key in request["keys"]:
                total += read(request["bucket"], key)
        except Exception as exn:  # noqa: BLE001
            print(json.dumps({"error": f"{type(exn).__name__}: {exn}"[:500]}), flush=True)
            continue
        print(json.dumps({"seconds": time.perf_counter() - started, "bytes": total}), flush=True)


if __name__ == "__main__":
    main()
