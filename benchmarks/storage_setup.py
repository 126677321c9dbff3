"""What bench_storage's parts share: its objects in the cluster (tar shards of random bytes,
put once), the S3 environment every client reads, whether our s3:// back end can run, each
scheme's URLs of the same objects, and indexes with member places over them."""

from __future__ import annotations

import io
import os
import random
import tarfile
import tempfile
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import wds_datapipes as wd
from aisio import get_client

SETS = ("2-4 MB", "64 MB")


def reverse_proxy_on(endpoint: str) -> None:
    """Turns on the cluster's S3-Reverse-Proxy feature (bit 13): S3 clients then get the
    object from the proxy instead of a 307 to the target."""
    request = urllib.request.Request(f"{endpoint}/v1/cluster/set-config?features=8192", method="PUT")
    with urllib.request.urlopen(request, timeout=30) as resp:
        resp.read()


def write_shard(path: str, rng: random.Random, target: int) -> None:
    """A tar of samples (``.bin`` of 16-48 kB random bytes + ``.cls``) of about ``target`` bytes."""
    with tarfile.open(path, "w") as tar:
        i, size = 0, 0
        while size < target:
            for ext, data in (("bin", rng.randbytes(rng.randint(16_000, 48_000))), ("cls", str(i % 10).encode())):
                info = tarfile.TarInfo(f"s{i:07d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                size += 512 + (len(data) + 511) // 512 * 512
            i += 1


def make_objects(folder: str, small: int, big: int, bucket_name: str, tiny_bucket: str,
                 big_size: int = 64 << 20) -> dict[str, list[str]]:
    """Writes the shards (reused between runs) and puts them in ``bucket_name``, and 100 objects
    of 1 KiB in ``tiny_bucket``; returns the keys by set ("2-4 MB", "64 MB", "1 KiB")."""
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(0)
    sets: dict[str, list[str]] = {label: [] for label in SETS}
    for label, count, size in (("2-4 MB", small, None), ("64 MB", big, big_size)):
        for i in range(count):
            name = f"{'small' if size is None else 'big'}-{i:04d}.tar"
            path = os.path.join(folder, name)
            target = size or rng.randint(2_000_000, 4_000_000)
            if not os.path.exists(path):
                write_shard(path + ".part", rng, target)
                os.replace(path + ".part", path)
            sets[label].append(name)
    client = get_client()
    bucket = client.bucket(bucket_name)
    bucket.create(exist_ok=True)
    names = [n for keys in sets.values() for n in keys]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda n: bucket.object(n).get_writer().put_file(os.path.join(folder, n)), names))
    tiny = client.bucket(tiny_bucket)
    tiny.create(exist_ok=True)
    sets["1 KiB"] = [f"tiny-{i:04d}" for i in range(100)]
    payload = os.urandom(1024)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda n: tiny.object(n).get_writer().put_content(payload), sets["1 KiB"]))
    return sets


def s3_environment(endpoint: str) -> None:
    """The standard AWS variables for AIStore's /s3 (auth off: any key), which our s3://
    back end, boto3 and the AWS CLI all read; DataLoader workers inherit them."""
    config = os.path.join(tempfile.mkdtemp(prefix="bench-storage-aws-"), "config")
    with open(config, "w") as f:  # the AWS CLI: path style (no bucket.host names on 127.0.0.1)
        f.write("[default]\nregion = us-east-1\ns3 =\n    addressing_style = path\n")
    os.environ.update(AWS_ENDPOINT_URL=f"{endpoint}/s3", AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench-secret",
                      AWS_REGION="us-east-1", AWS_DEFAULT_REGION="us-east-1", AWS_ALLOW_HTTP="true",
                      AWS_VIRTUAL_HOSTED_STYLE_REQUEST="false", AWS_CONFIG_FILE=config)


def s3_missing() -> str:
    """Why our s3:// rows cannot run here, or "" where they can."""
    from wds_datapipes.shards.openers import backend_for, register_backend

    try:
        backend_for("s3://bucket/key.tar")
        return ""
    except wd.ShardOpenError:  # no s3 entry point: an editable install older than the back end?
        pass
    try:
        from wds_datapipes.storage.object_store import S3

        register_backend(S3)  # forked DataLoader workers inherit the registry
        backend_for("s3://bucket/key.tar")
    except Exception as exn:  # noqa: BLE001 - any failure means: no back end
        return f"back end not available ({type(exn).__name__}: {str(exn)[:100]})"
    return ""


def s3_ready(endpoint: str) -> str:
    """The S3 environment set; why our s3:// rows cannot run, or "" where they can."""
    s3_environment(endpoint)
    return s3_missing()


def urls_by_scheme(endpoint: str, bucket: str, names: list[str], s3: bool = True) -> dict[str, list[str]]:
    """The same objects' URLs: http:// (the /s3 API), ais://, and s3:// where ``s3``."""
    urls = {"http": [f"{endpoint}/s3/{bucket}/{n}" for n in names], "ais": [f"ais://{bucket}/{n}" for n in names]}
    if s3:
        urls["s3"] = [f"s3://{bucket}/{n}" for n in names]
    return urls


def place_indexes(work: str, label: str, urls_by_reader: dict[str, list[str]]) -> dict[str, str]:
    """{reader: the path of an index with member places of its URLs}, saved under ``work``."""
    indexes = {}
    for reader, urls in urls_by_reader.items():
        path = os.path.join(work, f"{reader.replace('/', '_')}-{label.replace(' ', '')}.json")
        wd.ShardIndex.from_scans(wd.build_index(urls, places=True)).save(path)
        indexes[reader] = path
    return indexes
