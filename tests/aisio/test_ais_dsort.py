"""Shuffling samples across shards on the cluster with dSort."""

from __future__ import annotations

import re
import time
import uuid

import pytest
from aistore.sdk.dsort import Dsort

import aisio.dsort
from aisio import AISSourceLister, DsortError, dsort_shuffle
from aisio.client import get_client


@pytest.fixture
def out_bucket(ais_endpoint):
    name = f"dsort-{uuid.uuid4().hex[:10]}"
    yield name
    get_client().bucket(name).delete(missing_ok=True)


def test_dsort_output_holds_every_input_sample_whole_in_a_new_order(dataset, out_bucket):
    bucket, paths, samples = dataset
    outputs = dsort_shuffle(
        f"ais://{bucket}/train-{{000000..{len(paths) - 1:06d}}}.tar",
        f"ais://{out_bucket}/shuffled-{{0000..9999}}.tar",
        output_shard_size="300KiB",
        seed=11,
        timeout=120,
    )
    assert len(outputs) > 1 and outputs == sorted(outputs)
    assert all(u.startswith(f"ais://{out_bucket}/shuffled-") for u in outputs)
    got = list(AISSourceLister(outputs).load_tar().group_by_key())
    by_key = {s["__key__"]: {k: v for k, v in s.items() if k != "__url__"} for s in got}
    assert len(by_key) == len(got) == len(samples)  # no sample lost, split or repeated
    assert by_key == {s["__key__"]: s for s in samples}  # each whole: all its files, same bytes
    assert [s["__key__"] for s in got] != [s["__key__"] for s in samples]


def test_dsort_refuses_to_mix_with_existing_outputs_unless_told(dataset, out_bucket):
    bucket = dataset[0]
    args = (f"ais://{bucket}/train-{{000000..000001}}.tar", f"ais://{out_bucket}/s-{{000..999}}.tar")
    first = dsort_shuffle(*args, output_shard_size="1MiB", timeout=120)
    with pytest.raises(DsortError, match="already match"):
        dsort_shuffle(*args, output_shard_size="1MiB", timeout=120)
    again = dsort_shuffle(*args, output_shard_size="1MiB", timeout=120, overwrite=True)
    assert len(again) == len(first)
    assert sum(1 for _ in AISSourceLister(again).load_tar().group_by_key()) == 24


def test_dsort_takes_an_output_template_in_aistores_fmt_form(dataset, out_bucket):
    bucket, paths, samples = dataset
    outputs = dsort_shuffle(
        f"ais://{bucket}/train-{{000000..{len(paths) - 1:06d}}}.tar",
        f"ais://{out_bucket}/shuffled-shard-%d.tar",
        output_shard_size="300KiB",
        timeout=120,
    )
    assert len(outputs) > 1
    assert all(re.fullmatch(rf"ais://{out_bucket}/shuffled-shard-\d+\.tar", u) for u in outputs), outputs
    keys = sorted(s["__key__"] for s in AISSourceLister(outputs).load_tar().group_by_key())
    assert keys == sorted(s["__key__"] for s in samples)


def _follow_sees_unknown(monkeypatch, times: int | None) -> list[str]:
    """The first ``times`` follow queries (all when None) ask the cluster about a job id no
    target has, so the cluster itself answers 404 "does not exist"; returns the ids asked about."""
    real = Dsort.get_job_info
    asked: list[str] = []

    def follow(self):
        asked.append(self.dsort_id)
        if times is None or len(asked) <= times:
            return real(Dsort(self._client, "srt-unknownjob"))
        return real(self)

    monkeypatch.setattr(Dsort, "get_job_info", follow)
    return asked


def test_dsort_follow_rides_out_a_moment_when_no_target_knows_the_job(dataset, out_bucket, monkeypatch):
    # The proxy asks the targets of its current map; one new to the map knows nothing of the
    # job (AIStore's own note), so a "does not exist" within the grace period is waited out.
    bucket, paths, samples = dataset
    asked = _follow_sees_unknown(monkeypatch, times=3)
    outputs = dsort_shuffle(f"ais://{bucket}/train-{{000000..{len(paths) - 1:06d}}}.tar",
                            f"ais://{out_bucket}/s-{{0000..9999}}.tar", output_shard_size="300KiB", timeout=120)
    assert len(asked) > 3
    keys = sorted(s["__key__"] for s in AISSourceLister(outputs).load_tar().group_by_key())
    assert keys == sorted(s["__key__"] for s in samples)  # oracle: the uploaded samples


def test_dsort_follow_fails_clearly_when_no_target_knows_the_job_for_the_grace_period(dataset, out_bucket,
                                                                                     monkeypatch):
    bucket = dataset[0]
    _follow_sees_unknown(monkeypatch, times=None)
    monkeypatch.setattr(aisio.dsort, "UNKNOWN_GRACE_S", 1.0)
    started = time.monotonic()
    with pytest.raises(DsortError, match=r"dSort job srt-\S+ \(ais://.*\) started, but every target .* does not know") as info:
        dsort_shuffle(f"ais://{bucket}/train-{{000000..000001}}.tar", f"ais://{out_bucket}/s-{{000..999}}.tar",
                      output_shard_size="1MiB", timeout=120)
    assert 1.0 < time.monotonic() - started < 30, info.value
