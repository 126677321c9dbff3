"""TensorBoard scalars of the stats, read back from the event file by TensorBoard's own reader
(``EventAccumulator``: the independent oracle of what a user's TensorBoard shows)."""

from __future__ import annotations

import os

import pytest
from stats_data import fork_loader, write_shards
from tensorboard.backend.event_processing import event_accumulator  # the [tensorboard] extra, in [dev]
from torch.utils.tensorboard import SummaryWriter

import wds_datapipes as wd


def _read_back(folder) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the run's event files: tag -> [(step, value)], as TensorBoard loads them."""
    events = event_accumulator.EventAccumulator(str(folder), size_guidance={event_accumulator.SCALARS: 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_scalars_read_back_equal_the_snapshot_at_each_step(tmp_path, stats_on):
    """Oracles: TensorBoard's EventAccumulator reading the event file, the snapshot taken at
    the same steps, the shard files' sizes (os.stat) and the samples the loop received."""
    paths = write_shards(tmp_path / "data", 4, 25, size=300)
    dp = wd.ShardLister(paths).load_tar().group_by_key().map_fields({"cls": int}).batch_samples(5)
    writer = SummaryWriter(str(tmp_path / "runs"))
    taken = {}
    for epoch in range(2):
        samples = sum(len(batch["__key__"]) for batch in wd.stats.watch(fork_loader(dp)))
        assert samples == 100
        numbers = wd.stats.snapshot()
        taken[epoch] = numbers
        written = wd.stats.to_tensorboard(writer, step=epoch, numbers=numbers)
        assert len(written) > 40
    writer.close()
    scalars = _read_back(tmp_path / "runs")
    size = sum(os.path.getsize(p) for p in paths)
    assert scalars["wds_datapipes/stage_bytes/read"] == [(0, size), (1, 2 * size)]
    assert scalars["wds_datapipes/stage_items/tar"] == [(0, 100), (1, 200)]
    assert [v for _, v in scalars["wds_datapipes/scheme_objects/file"]] == [4, 8]
    for epoch, numbers in taken.items():
        for name, stage in numbers.stages.items():
            got = dict(scalars[f"wds_datapipes/stage_seconds/{name}"])[epoch]
            assert got == pytest.approx(stage.seconds, rel=1e-6)  # a float32 in the event file
        for label, source in numbers.sources.items():
            assert dict(scalars[f"wds_datapipes/source_samples/{label}"])[epoch] == source.samples
        wait = numbers.wait
        assert dict(scalars["wds_datapipes/wait/steps"])[epoch] == wait.steps
        assert dict(scalars["wds_datapipes/wait/readiness"])[epoch] == pytest.approx(wait.readiness, rel=1e-6)
        assert dict(scalars["wds_datapipes/wait/blocked_seconds"])[epoch] == pytest.approx(
            wait.blocked_seconds, rel=1e-6)
    assert {tag for tag in scalars if tag.startswith("wds_datapipes/worker_busy_seconds/")} == {
        "wds_datapipes/worker_busy_seconds/0.0", "wds_datapipes/worker_busy_seconds/0.1"}


def test_a_mixture_writes_realized_and_target_weights(tmp_path, stats_on):
    """Oracle: the samples' own ``__source__`` counted by the test, the weights given."""
    a = write_shards(tmp_path / "a", 2, 30, prefix="a")
    b = write_shards(tmp_path / "b", 2, 30, prefix="b", seed=1)
    mix = wd.RandomMix([wd.ShardLister(a).load_tar().group_by_key(), wd.ShardLister(b).load_tar().group_by_key()],
                       weights=[3, 1], seed=0)
    drawn = [sample["__url__"] for sample in mix]
    writer = SummaryWriter(str(tmp_path / "runs"))
    written = wd.stats.to_tensorboard(writer, step=7)
    writer.close()
    scalars = _read_back(tmp_path / "runs")
    realized = {tag: values for tag, values in scalars.items() if "/mixture_realized/" in tag}
    targets = {tag: values for tag, values in scalars.items() if "/mixture_target/" in tag}
    assert sorted(v for values in targets.values() for _, v in values) == [0.25, 0.75]
    from_a = sum(url.startswith(str(tmp_path / "a")) for url in drawn) / len(drawn)
    shares = sorted(v for values in realized.values() for _, v in values)
    assert shares == pytest.approx(sorted([from_a, 1 - from_a]), abs=1e-6)
    assert all(step == 7 for values in scalars.values() for step, _ in values)
    assert set(written) == set(scalars)


def test_stats_off_write_nothing(tmp_path):
    """Stats off: no scalar, no event written (oracle: the event file's scalars)."""
    writer = SummaryWriter(str(tmp_path / "runs"))
    assert wd.stats.to_tensorboard(writer, step=0) == {}
    writer.close()
    assert _read_back(tmp_path / "runs") == {}
