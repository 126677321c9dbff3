"""Failures counted where they happen, each with a handler that skips it: a shard the server does
not have (opening: per stage, source and scheme), a shard cut short (tar), a JPEG that does not
decode (decode) and a transform that raises (transform). Oracle: the faults the test planted, one
of each, and the samples that come out (all the others)."""

from __future__ import annotations

import io
import os
import tarfile

import numpy as np
from PIL import Image
from shard_server import ShardServer
from stats_data import fork_loader

import wds_datapipes as wd


def _jpeg(seed: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(out, "JPEG")
    return out.getvalue()


def _shard(path: str, keys: list[str], broken_jpeg: str | None = None, first_label: int = 0) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for n, key in enumerate(keys):
            label = str(first_label + n).encode()
            for suffix, data in (("jpg", b"not a jpeg" if key == broken_jpeg else _jpeg(n)), ("cls", label)):
                info = tarfile.TarInfo(f"{key}.{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def _label(value: int) -> int:
    if value == 105:
        raise ValueError("label 105 is planted to fail")
    return value


def test_each_failure_is_counted_at_its_stage_source_and_scheme(tmp_path, stats_on):
    folder = tmp_path / "data"
    folder.mkdir()
    _shard(str(folder / "s-000.tar"), [f"a{n}" for n in range(8)], broken_jpeg="a3")  # a3: decode fails
    _shard(str(folder / "s-002.tar"), [f"c{n}" for n in range(8)], first_label=100)  # c5: the transform fails
    whole = folder / "s-003.tar"
    _shard(str(whole), [f"d{n}" for n in range(8)])
    with tarfile.open(whole) as tar:
        cut = tar.getmember("d2.jpg").offset_data + 100
    whole.write_bytes(whole.read_bytes()[:cut])  # cut inside d2's jpg: d0 comes out, not d1 (its last member may be missing)
    # s-001.tar is missing: its opening fails (HTTP 404)
    with ShardServer(str(folder)) as server:
        spec = server.url("s-{000..003}.tar")
        dp = (wd.ShardLister(spec).load_tar(handler=wd.warn_and_continue).group_by_key()
              .decode("pil", handler=wd.warn_and_continue)
              .map_fields({"cls": _label}, handler=wd.warn_and_continue))
        keys = sorted(s["__key__"] for s in wd.stats.watch(fork_loader(dp)))
    expected = sorted([f"a{n}" for n in range(8) if n != 3] + [f"c{n}" for n in range(8) if n != 5] + ["d0"])
    assert keys == expected
    s = wd.stats.snapshot()
    assert (s.stages["open"].errors, s.sources[spec].errors, s.schemes["http"].errors) == (1, 1, 1)
    assert s.stages["tar"].errors == 1 and s.stages["read"].errors == 0
    assert s.stages["decode"].errors == 1 and s.stages["transform"].errors == 1
    source = s.sources[spec]  # the 3 shards there were, read whole (the cut one to its cut)
    assert source.objects == 3 and source.bytes == sum(os.path.getsize(p) for p in folder.iterdir())
    # each stage's items are what reached it: 17 grouped (d0 the cut shard's only one), 16 decoded
    assert source.samples == s.stages["tar"].items == s.stages["decode"].items == 17
    assert s.stages["transform"].items == 16 == len(keys) + 1
