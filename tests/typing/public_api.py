"""The public API as a user's type checker sees it: ``make lint`` runs mypy over this file.

Not run (its paths do not exist): each line calls public names the way the README and the
guides do, and ``assert_type`` pins what a name returns, so a public signature that loses its
annotations (becoming ``Any``) or changes its types fails the lint, as it would fail a user's
type check. The package's own bodies are checked apart ([tool.mypy] in pyproject.toml).
"""

from __future__ import annotations

from typing import Any, BinaryIO

import torch
from typing_extensions import assert_type

import aisio
import wds_datapipes as wd
from wds_datapipes.writing import WriteReport, write_shards

URLS = "data/train-{000000..000099}.tar"


def reading() -> None:
    lister = wd.ShardLister(URLS, shuffle=True, seed=0)
    assert_type(lister, wd.ShardLister)
    pipe = lister.load_tar().group_by_key().decode("torchrgb8").to_tuple("jpg", "cls")
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=2)
    for _ in loader:
        pass
    assert_type(wd.TarLoader(lister), wd.TarLoader)
    assert_type(wd.WebDatasetGrouper(wd.TarLoader(lister), handler=wd.warn_and_continue), wd.WebDatasetGrouper)
    assert_type(wd.split_key("a/b.c.jpg"), "tuple[str, str] | None")
    stream = wd.open_shard("data/train-000000.tar")
    assert_type(stream, BinaryIO)
    stream.close()


def decoding_and_batches(samples: wd.WebDatasetGrouper) -> None:
    crop = wd.RandomResizedCrop(224, seed=0)
    assert_type(wd.CenterCrop(224, resize=256), wd.CenterCrop)
    batches = wd.BatchDecoder(samples, "torchrgb8", batch_size=64, transform=crop)
    assert_type(batches, wd.BatchDecoder)
    assert_type(wd.Decoder(samples, "torchrgb8", wd.AudioSpec(sample_rate=16000), wd.VideoSpec(num_frames=8)),
                wd.Decoder)
    assert_type(wd.Batcher(wd.Shuffler(samples, bufsize=100), 32, collate_fn=wd.collate), wd.Batcher)
    assert_type(wd.TupleMaker(samples, "jpg", "cls"), wd.TupleMaker)
    assert_type(wd.KeyRenamer(samples, {"jpg": "image"}), wd.KeyRenamer)
    assert_type(wd.FieldMapper(samples, {"cls": int}), wd.FieldMapper)
    assert_type(wd.RandomMix([samples, samples], weights=[0.7, 0.3], seed=1), "wd.RandomMix[dict]")


def exact_epochs() -> None:
    index = wd.ShardIndex.load("data/index.json")
    assert_type(index, wd.ShardIndex)
    assert_type(wd.build_index([URLS], jobs=4), "list[wd.epochs.index.ShardScan]")
    assert_type(wd.scan_shard("data/train-000000.tar").nsamples, int)
    epochs = wd.ExactEpochs(index, batch_size=64, seed=0)
    epochs.set_epoch(1)
    state = epochs.state_dict()
    epochs.load_state_dict(state)
    mixed = wd.MixedEpochs({"a": "a/index.json", "b": "b/index.json"}, batch_size=32, weights={"a": 0.5, "b": 0.5})
    assert_type(mixed, wd.MixedEpochs)
    assert_type(wd.PlanSettings(seed=1, batch_size=4), wd.PlanSettings)
    assert_type(wd.EpochState(epoch=0, batches=3), wd.EpochState)
    assert_type(wd.Topology(rank=0, world=2), wd.Topology)


def settings_and_errors() -> None:
    assert_type(wd.set_limits(max_member_bytes=1 << 20), wd.Limits)
    assert_type(wd.get_limits(), wd.Limits)
    assert_type(wd.set_cache("/tmp/cache", "10GB"), "wd.CacheSettings | None")
    assert_type(wd.get_cache(), "wd.CacheSettings | None")
    assert_type(wd.cache_stats(), wd.CacheStats)
    assert_type(wd.verify_cache(), "list[str]")
    assert_type(wd.keep_freed_memory(), bool)
    assert_type(wd.register_with_webdataset(), bool)
    assert_type(wd.ignore_and_continue(ValueError()), bool)
    assert_type(wd.reraise_exception(ValueError()), bool)
    error: wd.WdsError = wd.ShardOpenError("data/a.tar", "gone")
    for kind in (wd.ShardReadError, wd.ShardFormatError, wd.DecodeError, wd.SampleError, wd.NoShardsError,
                 wd.IndexMismatchError, wd.CacheDirectoryError):
        assert issubclass(kind, wd.WdsError)
    raise error


def writing() -> None:
    report = write_shards([{"__key__": "a", "txt": "hello"}], "out/train-%06d.tar", maxcount=1000)
    assert_type(report, WriteReport)
    aisio.set_endpoint("http://localhost:8080")
    assert_type(aisio.list_objects("bucket", prefix="train-"), "list[str]")
    assert_type(aisio.upload_file("out/train-000000.tar", "ais://bucket/train-000000.tar"), str)
    assert_type(aisio.AISSourceLister(bucket="bucket", prefix="train-").load_tar(), Any)
