"""Mixtures over two gloo ranks on CPU, started as real processes, with an all_reduce per batch.

Each rank runs tests/epoch_job.py with ``--mix`` (MixedEpochs over three sources of uneven
shards) and 2 loader workers: a rank with fewer batches would leave the other waiting
forever in its all_reduce, so every run has a timeout and a hang fails the test.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from builders import write_index
from stack import needs_dataloader2
from test_distributed import _ranks, _single

SIZES = {"web": [100, 30, 71, 5], "books": [40, 25], "tiny": [17]}  # tiny: one shard, smaller than its share


@pytest.fixture
def mix(tmp_path, sized_shards):
    """Writes the sources and returns a function that writes a mixture spec file for epoch_job."""
    indexes = {name: write_index(sized_shards(sizes, prefix=name, folder=tmp_path / name),
                                 tmp_path / name / "index.json", places=name == "web")
               for name, sizes in SIZES.items()}

    def spec(name: str, **kwargs) -> str:
        path = tmp_path / f"{name}.mix.json"
        path.write_text(json.dumps({"sources": indexes, **kwargs}))
        return str(path)

    return spec


def _batches(epoch: list) -> list[tuple[list[str], list[bool], list[str]]]:
    return [tuple(batch) for batch in epoch]


def _per_source(*epochs: list) -> Counter:
    return Counter(source for epoch in epochs for _, _, sources in epoch for source in sources)


def _samples(*epochs: list) -> Counter:
    return Counter((source, key) for epoch in epochs for keys, _, sources in epoch for key, source in zip(keys, sources))


STRATIFIED = {"weights": {"web": 0.5, "books": 0.3, "tiny": 0.2}, "samples_per_epoch": 400, "batching": "stratified"}
LOADERS = [
    pytest.param("dataloader", "multiprocessing", id="DataLoader"),
    pytest.param("stateful", "multiprocessing", id="StatefulDataLoader"),
    pytest.param("dataloader2", "distributed", id="DataLoader2+DistributedReadingService", marks=needs_dataloader2),
]


@pytest.mark.parametrize(("loader", "reading"), LOADERS)
def test_two_ranks_get_equal_batches_exact_shares_and_stratified_batches(tmp_path, mix, loader, reading):
    ranks = _ranks(tmp_path, "strat", 2, "--mix", mix("strat", **STRATIFIED), "--loader", loader, "--reading", reading,
                   "--workers", "2", "--epochs", "2", "--dist")
    for epoch in range(2):
        batches = [_batches(rank["epochs"][epoch]) for rank in ranks]
        assert len(batches[0]) == len(batches[1]) == ranks[0]["batches_per_epoch"] == 25
        assert _per_source(*batches) == {"web": 200, "books": 120, "tiny": 80}
        for keys, _, sources in batches[0] + batches[1]:
            held = Counter(sources)
            assert len(keys) == 8 and all(abs(held[n] - 8 * w) < 1 for n, w in STRATIFIED["weights"].items())
            assert all(key.startswith(source) for key, source in zip(keys, sources))
        web = [key for keys, _, sources in batches[0] + batches[1] for key, s in zip(keys, sources) if s == "web"]
        assert len(web) == len(set(web))  # 200 of its 206 samples: each once
    assert ranks[0]["epochs"][0] != ranks[0]["epochs"][1]


@pytest.mark.parametrize(("name", "spec", "counts"), [
    ("zero", {"weights": {"web": 0.7, "books": 0.0, "tiny": 0.3}, "samples_per_epoch": 400}, {"web": 280, "tiny": 120}),
    ("repeat", {"repeat": {"tiny": 3.0}, "batching": "per_source"}, {"web": 192, "books": 64, "tiny": 48}),
])
def test_a_weight_of_zero_and_a_repeated_small_source_keep_their_counts(tmp_path, mix, name, spec, counts):
    ranks = _ranks(tmp_path, name, 2, "--mix", mix(name, **spec), "--loader", "dataloader", "--workers", "2",
                   "--epochs", "1", "--dist")
    batches = [_batches(rank["epochs"][0]) for rank in ranks]
    assert len(batches[0]) == len(batches[1])
    assert _per_source(*batches) == counts
    if spec.get("batching") == "per_source":
        assert all(len(set(sources)) == 1 for keys, _, sources in batches[0] + batches[1])
        tiny = Counter(key for keys, _, sources in batches[0] + batches[1] for key, s in zip(keys, sources)
                       if s == "tiny")
        assert len(tiny) == 17 and set(tiny.values()) <= {2, 3}  # its 17 samples in 3 passes, 48 of 51 kept


def test_two_ranks_of_two_workers_resume_on_one_rank_of_three_with_each_source_s_rest(tmp_path, mix):
    spec = mix("elastic", **STRATIFIED)
    whole = _ranks(tmp_path, "whole", 2, "--mix", spec, "--loader", "dataloader", "--workers", "2", "--epochs", "2",
                   "--dist")
    state = str(tmp_path / "state.json")
    head = _ranks(tmp_path, "head", 2, "--mix", spec, "--loader", "dataloader", "--workers", "2", "--epochs", "2",
                  "--dist", "--stop-after", "9", "--state-out", state)
    assert [rank["epochs"][0] for rank in head] == [rank["epochs"][0][:9] for rank in whole]
    options = ["--mix", spec, "--loader", "dataloader", "--workers", "3", "--epochs", "2"]
    tail = _single(tmp_path, "tail", *options, "--state-in", state)
    seen = _samples(*(rank["epochs"][0] for rank in head))
    rest = _samples(tail["epochs"][0])
    assert seen + rest == _samples(*(rank["epochs"][0] for rank in whole))  # each source's rest, exactly
    assert tail["epochs"][1] == _single(tmp_path, "plain", *options)["epochs"][1]


@pytest.mark.parametrize("stop_after", [4, 25])  # mid-epoch, at the epoch's end
def test_a_stateful_dataloader_checkpoint_resumes_in_a_new_process(tmp_path, mix, stop_after):
    spec = mix("resume", **{**STRATIFIED, "batching": "random"})
    options = ["--mix", spec, "--loader", "stateful", "--workers", "2", "--persistent", "1", "--epochs", "2"]
    whole = _single(tmp_path, "whole", *options)
    state = str(tmp_path / "state.json")
    head = _single(tmp_path, "head", *options, "--stop-after", str(stop_after), "--state-out", state)
    tail = _single(tmp_path, "tail", *options, "--state-in", state)
    assert head["epochs"][0] + tail["epochs"][0] == whole["epochs"][0]
    assert tail["epochs"][1] == whole["epochs"][1]
