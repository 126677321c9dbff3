"""The old SDK DataPipes' users: their argument names, and ais:// in plain webdataset pipelines."""

from __future__ import annotations

import importlib
import os
import warnings
from pathlib import Path

import pytest
import webdataset as wds
from ais_helpers import make_samples, reference_samples, strip_url
from aistore.sdk import Client

from aisio import AISFileLister, AISFileLoader, AISSourceLister
from aisio.client import ENDPOINT_ENV, get_client
from aisio.wds_opener import gopen_ais
from wds_datapipes import ShardOpenError


def _wds_samples(dataset) -> list[dict]:
    return [{k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"} for s in dataset]


def test_the_published_aistore_webdataset_workflow_runs_with_the_old_argument_names(dataset):
    bucket_name, paths, _ = dataset
    # As written for aistore.pytorch (SDK 1.x): a Client, its bucket, the old argument names.
    client = Client(os.environ[ENDPOINT_ENV])
    bucket = client.bucket(bucket_name)
    with pytest.warns(DeprecationWarning) as record:
        sources = AISSourceLister(ais_sources=[bucket], prefix="train-").map(lambda url: {"url": url}).shuffle()
    message = str(record[0].message)
    assert f"write AISSourceLister(['ais://{bucket_name}/train-'], suffixes=None)" in message
    assert Path(record[0].filename) == Path(__file__)  # it points at the caller's line
    # The workflow hands that pipe of {"url": ...} dicts to webdataset. webdataset >= 1.0's
    # WebDataset() takes URL strings only (SimpleShardList asserts str), so with it the same
    # pipe goes to DataPipeline, the stage WebDataset() is built from.
    dataset_ = wds.DataPipeline(sources, wds.tarfile_to_samples())
    got = sorted(_wds_samples(dataset_), key=lambda s: s["__key__"])
    assert got == sorted(reference_samples(paths), key=lambda s: s["__key__"])
    with pytest.warns(DeprecationWarning):  # URL strings: WebDataset() takes them as they are
        urls = AISSourceLister(ais_sources=[bucket], prefix="train-", shuffle=True)
    got = sorted(_wds_samples(wds.WebDataset(urls, shardshuffle=False, empty_check=False)), key=lambda s: s["__key__"])
    assert got == sorted(reference_samples(paths), key=lambda s: s["__key__"])


def test_old_lister_takes_the_sdks_objects_and_groups_and_positional_sources(dataset):
    bucket_name, _, _ = dataset
    bucket = get_client().bucket(bucket_name)
    names = ["train-000001.tar", "train-000004.tar"]
    with pytest.warns(DeprecationWarning, match="suffixes=None"):
        lister = AISSourceLister([bucket.object(names[0]), bucket.objects(obj_names=[names[1]])])
    assert list(lister) == [f"ais://{bucket_name}/{n}" for n in names]
    with pytest.warns(DeprecationWarning):
        missing = AISSourceLister(ais_sources=[bucket.object("train-999999.tar")])
    with pytest.raises(ShardOpenError, match=rf"'train-999999.tar' is not in bucket ais://{bucket_name}"):
        list(missing)
    with pytest.raises(TypeError, match="ais_sources takes the SDK's buckets"):
        AISSourceLister(ais_sources=[42])


def test_old_file_lister_and_loader_names_keep_working_with_a_warning(dataset):
    bucket_name, paths, _ = dataset
    from torch.utils.data.datapipes.iter import IterableWrapper  # on both stacks

    prefixes = IterableWrapper([f"ais://{bucket_name}/train-00000"])
    with pytest.warns(DeprecationWarning, match=r"aisio.set_endpoint"):
        lister = AISFileLister(source_datapipe=prefixes, url=os.environ[ENDPOINT_ENV])
    urls = list(lister)
    assert urls == [f"ais://{bucket_name}/{os.path.basename(p)}" for p in paths]
    with pytest.warns(DeprecationWarning):
        loader = AISFileLoader(source_datapipe=IterableWrapper(urls[:2]), url=os.environ[ENDPOINT_ENV])
    for (url, stream), path in zip(loader, paths[:2]):
        with stream:
            assert url.endswith(os.path.basename(path)) and stream.read() == Path(path).read_bytes()


def test_ais_urls_open_in_plain_webdataset_pipelines(dataset):
    bucket_name, paths, _ = dataset
    assert importlib.import_module("webdataset.gopen").gopen_schemes["ais"] is gopen_ais
    dataset_ = wds.WebDataset(f"ais://{bucket_name}/train-{{000000..000005}}.tar", shardshuffle=False,
                              empty_check=False)
    assert _wds_samples(dataset_) == reference_samples(paths)


def test_webdataset_shard_writer_uploads_to_ais_urls(ais_endpoint, bucket, tmp_path):
    samples = make_samples(12, seed=5)
    with wds.ShardWriter(f"ais://{bucket}/w-%06d.tar", maxcount=5, verbose=0) as sink:
        for sample in samples:
            sink.write(sample)
    assert list(AISSourceLister(f"ais://{bucket}/w-")) == [f"ais://{bucket}/w-{i:06d}.tar" for i in range(3)]
    got = list(AISSourceLister(f"ais://{bucket}/w-").load_tar().group_by_key())
    assert strip_url(got) == samples
    assert not [p for p in Path(os.environ.get("TMPDIR", "/tmp")).glob("aisio-upload-*.part")]


def test_old_spelling_warns_once_per_call_and_new_spelling_is_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AISSourceLister("ais://bkt/train-")  # the new spelling: no warning, no I/O
    with pytest.warns(DeprecationWarning, match=r"write AISSourceLister\(\['ais://bkt/x-'\], suffixes=None, "
                                                r"etl_name='resize'\)"):
        AISSourceLister(ais_sources=["bkt"], prefix="x-", etl_name="resize")
