"""Uploading shards into a bucket as webdataset's ``ShardWriter`` closes them."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

from .client import AISUrl, endpoint, get_client
from .errors import UploadError, translating

__all__ = ["ShardUploader", "UploadError", "upload_file"]


def upload_file(path: str | os.PathLike, url: str, *, remove: bool = False) -> str:
    """Store the local file ``path`` as the object ``url`` (``ais://bucket/name``); returns ``url``.

    The upload counts as done when the cluster answered and the object's size equals the
    file's; only then, with ``remove=True``, is the local file deleted. Failures raise
    :class:`UploadError`.
    """
    path = os.fspath(path)
    aurl = AISUrl.parse(url)
    if not aurl.object or aurl.etl_name:
        raise ValueError(f"expected ais://bucket/object, got {url!r}")
    obj = get_client().bucket(aurl.bucket).object(aurl.object)
    size = os.path.getsize(path)
    with translating(partial(UploadError, path, url), aurl, endpoint()):
        obj.get_writer().put_file(path)
        stored = obj.head().size
    if stored != size:
        raise UploadError(path, url, f"the object has {stored} bytes, the file {size}")
    if remove:
        os.unlink(path)
    return url


class ShardUploader:
    """A ``ShardWriter(post=...)`` callback: uploads each closed shard, then removes the local file.

    Args:
        destination: ``ais://bucket`` or ``ais://bucket/prefix``; a shard file
            ``out/train-000003.tar`` becomes the object ``<prefix>train-000003.tar``.
        remove: delete each local file once its upload succeeded (a failed upload raises
            :class:`UploadError` and keeps the file).
        create_bucket: create the bucket on first use if it does not exist.

    ``uploaded`` lists the object URLs stored so far, in order.

    Example:
        >>> uploader = ShardUploader("ais://train/shard-")
        >>> with wds.ShardWriter("/tmp/out/%06d.tar", maxcount=1000, post=uploader) as sink: ...
    """

    def __init__(self, destination: str, *, remove: bool = True, create_bucket: bool = True):
        target = AISUrl.parse(destination)
        if target.etl_name:
            raise ValueError(f"an upload destination takes no ETL: {destination!r}")
        self.bucket = target.bucket
        self.prefix = target.object
        self.remove = remove
        self.create_bucket = create_bucket
        self.uploaded: list[str] = []
        self._bucket_ready = not create_bucket

    def __call__(self, path: str | os.PathLike) -> None:
        if not self._bucket_ready:
            where = f"ais://{self.bucket}"
            with translating(partial(UploadError, os.fspath(path), where), AISUrl(self.bucket), endpoint(),
                             doing=f"create bucket {where}"):
                get_client().bucket(self.bucket).create(exist_ok=True)
            self._bucket_ready = True
        url = f"ais://{self.bucket}/{self.prefix}{Path(path).name}"
        self.uploaded.append(upload_file(path, url, remove=self.remove))
