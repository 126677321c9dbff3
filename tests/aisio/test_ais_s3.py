"""AIStore's S3 API with its S3-Reverse-Proxy feature OFF (a cluster of this module's own, as
AIStore ships it): object requests are answered with 307 redirects to a target. Unpatched
boto3 fails on them (why ``s3_server`` turns the feature on); boto3 with the aistore SDK's
``aistore.botocore_patch`` follows them, for every operation.

Oracle: the bytes written by ``object_servers``' plain-HTTP writer, read back by boto3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from object_servers import _http, _s3_create, _s3_put, s3_env

pytest.importorskip("boto3")
pytestmark = [pytest.mark.ais, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def s3_without_reverse_proxy(fault_cluster):
    """``<cluster>/s3`` of a cluster whose S3-Reverse-Proxy feature is off (checked), with a bucket."""
    features = int(json.loads(_http("GET", f"{fault_cluster.endpoint}/v1/daemon?what=config"))["features"])
    assert not features & (1 << 13), "a fresh cluster has the S3-Reverse-Proxy feature off"
    endpoint = f"{fault_cluster.endpoint}/s3"
    _s3_create(endpoint, "plain")
    _s3_put(endpoint, "plain", "raw.bin", bytes(range(256)) * 400)
    return endpoint


def test_unpatched_boto3_fails_on_the_redirect_without_the_reverse_proxy(s3_without_reverse_proxy):
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    s3 = boto3.client("s3", endpoint_url=s3_without_reverse_proxy, region_name="us-east-1",
                      aws_access_key_id="any", aws_secret_access_key="any",
                      config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
    with pytest.raises(ClientError, match="TemporaryRedirect"):
        s3.put_object(Bucket="plain", Key="k", Body=b"abc")


PATCHED = textwrap.dedent('''
    import sys
    import aistore.botocore_patch.botocore  # noqa: F401  (patches botocore to follow AIStore's redirects)
    import boto3
    from botocore.config import Config

    s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1", aws_access_key_id="any",
                      aws_secret_access_key="any", config=Config(s3={"addressing_style": "path"}))
    raw = bytes(range(256)) * 400
    assert s3.get_object(Bucket="plain", Key="raw.bin")["Body"].read() == raw
    assert s3.get_object(Bucket="plain", Key="raw.bin", Range="bytes=1000-1009")["Body"].read() == raw[1000:1010]
    s3.put_object(Bucket="plain", Key="boto.bin", Body=b"boto" * 5000)
    assert s3.get_object(Bucket="plain", Key="boto.bin")["Body"].read() == b"boto" * 5000
    assert s3.head_object(Bucket="plain", Key="boto.bin")["ContentLength"] == 20000
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="plain")["Contents"]] == ["boto.bin", "raw.bin"]
    s3.delete_object(Bucket="plain", Key="boto.bin")
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="plain")["Contents"]] == ["raw.bin"]
    print("ok")
''')


def test_boto3_with_the_aistore_botocore_patch_follows_the_redirects(s3_without_reverse_proxy):
    """In a process of its own: the patch changes botocore for the whole process."""
    pytest.importorskip("wrapt")  # what the patch needs (in the dev extra)
    done = subprocess.run([sys.executable, "-c", PATCHED, s3_without_reverse_proxy], capture_output=True,
                          text=True, timeout=240, env={**os.environ, **s3_env(s3_without_reverse_proxy)},
                          check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
