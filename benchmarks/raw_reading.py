"""What bench_pipeline's sections 1 and 5 read raw samples with, beside our pipes: the tar
files read whole (the ceiling of any reader), the floor of reading by member places (a bare
loop, and the same yielding dicts from a minimal pipe), the index with member places they
read by, LitData's copy of the same samples, and section 5's shuffled readers."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

import webdataset as wds

import wds_datapipes as wd
from wds_datapipes.epochs import places as member_places
from wds_datapipes.pipe_base import Pipe
from wds_datapipes.shards.openers import local_path

try:  # make bench installs it (the [bench] extra)
    import litdata
    from litdata.streaming.writer import BinaryWriter
except ImportError:
    litdata = None


def read_whole(files: list[str], total: int):
    """Every tar file read whole into one reused buffer: the ceiling of any reader (it
    yields ``total``, the samples of all the files, for the rate)."""
    buffer = bytearray(1 << 20)
    view = memoryview(buffer)
    for path in files:
        with open(path, "rb", buffering=0) as stream:
            while stream.readinto(view):
                pass
    yield from range(total)


def bare_places(index_path: str, dicts: bool):
    """The floor of reading by member places: per shard one ``pread`` per megabyte and a
    memoryview slice per member, no checks; ``dicts``: a dict per sample too (key, url,
    fields, pad flag), yielded by a minimal pipe on our base class (torch's iterator hook
    included), which no DataPipe that yields samples read this way can go below."""
    index = wd.ShardIndex.load(index_path)

    def samples():
        for shard, info in enumerate(index.shards):
            span = index.places.span(shard, 0, info.nsamples)
            url = index.url(shard)
            fd = os.open(local_path(url), os.O_RDONLY)
            view, base, end, sample, current = b"", 0, 0, None, -1
            keys = iter(span.keys)
            for field, offset, size, number in zip(span.suffixes, span.rows["data"].tolist(),
                                                   span.rows["size"].tolist(), span.rows["sample"].tolist()):
                if offset + size > base + end:
                    base, view = offset, memoryview(os.pread(fd, 1 << 20, offset))
                    end = len(view)
                if dicts:
                    if number != current:
                        if sample is not None:
                            yield sample
                        current, sample = number, {"__key__": next(keys), "__url__": url, "__pad__": False}
                    sample[field] = view[offset - base : offset - base + size]
                else:
                    view[offset - base : offset - base + size]
            if sample is not None:
                yield sample
                sample = None
            os.close(fd)
        if not dicts:
            yield from range(sum(index.sizes))

    return _BarePipe(samples) if dicts else samples()


class _BarePipe(Pipe):
    def __init__(self, samples: Callable[[], Iterable]):
        self.samples = samples

    def __iter__(self):
        yield from self.samples()


def places_index(files: list[str], path: str) -> str:
    """An index of ``files`` with member places (written again when a shard is newer, or its
    places are in an older format)."""
    if not os.path.exists(path) or any(os.path.getmtime(f) > os.path.getmtime(path) for f in files) \
            or not _places_current(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        wd.ShardIndex.from_scans(wd.build_index(files, places=True), relative_to=path).save(path)
    return path


def _places_current(path: str) -> bool:
    try:
        places = wd.ShardIndex.load(path).places
    except wd.WdsError:  # its places files are gone or unreadable: index again
        return False
    return places is not None and places.format == member_places.FORMAT


def exact_epochs(index: str, shuffle: bool, views: bool = False):
    return wd.ExactEpochs(index, batch_size=1, shuffle=shuffle, rank=0, world_size=1, views=views)


def litdata_copy(files: list[str], folder: str) -> str:
    """The samples of ``files`` written once in LitData's own chunk format (64 MB chunks)."""
    if not os.path.exists(os.path.join(folder, "index.json")):
        writer = BinaryWriter(folder, chunk_bytes="64MB")
        for i, sample in enumerate(wd.ShardLister(files).load_tar().group_by_key()):
            writer.add_item(i, {k: v for k, v in sample.items() if not k.startswith("__")})
        writer.done()
        writer.merge()
    return folder


def raw_paths(label: str, files: list[str], index: str, total: int, litdata_folder: str | None) -> dict[str, Callable]:
    """Section 1's makers for one member size, in the order its table prints them."""
    makes = {
        f"ours, {label}: list_shards().load_tar().group_by_key()":
            lambda: wd.ShardLister(files).load_tar().group_by_key(),
        f"ours, {label}: ExactEpochs(index with member places)": lambda: exact_epochs(index, shuffle=False),
        f"ours, {label}: ExactEpochs(index with member places, views=True)":
            lambda: exact_epochs(index, shuffle=False, views=True),
        f"webdataset, {label}: WebDataset(shardshuffle=False)": lambda: wds.WebDataset(files, shardshuffle=False),
    }
    if litdata_folder is not None:
        makes[f"litdata, {label}: StreamingDataset (its own chunk format)"] = \
            lambda: litdata.StreamingDataset(litdata_folder)
    makes[f"bare loop by member places: a read per MB, a view per member (no dicts), {label}"] = \
        lambda: bare_places(index, dicts=False)
    makes[f"bare loop by member places in a minimal pipe, a dict per sample, {label}"] = \
        lambda: bare_places(index, dicts=True)
    makes[f"reading the tar files whole, {label}"] = lambda: read_whole(files, total)
    return makes


def shuffled_paths(photos: list[str], index: str) -> dict[str, Callable]:
    """Section 5's makers: shuffled raw photos (and ExactEpochs in order beside its shuffle)."""
    return {
        "ours, load_tar().group_by_key().shuffle_samples(1000)":
            lambda: wd.ShardLister(photos).load_tar().group_by_key().shuffle_samples(1000),
        "ours, ExactEpochs(index with member places, shuffle=True)": lambda: exact_epochs(index, shuffle=True),
        "ours, ExactEpochs(index with member places, in order)": lambda: exact_epochs(index, shuffle=False),
        "webdataset, WebDataset(shardshuffle=False).shuffle(1000)":
            lambda: wds.WebDataset(photos, shardshuffle=False).shuffle(1000),
    }
