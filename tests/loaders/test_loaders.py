"""Opening shards by URL scheme (load_tar), and the same pipeline under DataLoader2 and DataLoader."""

from __future__ import annotations

import functools
import http.server
import os
import pickle
import tarfile
import threading
import warnings
from pathlib import Path

import pytest
import torch
from stack import DataLoader2, needs_dataloader2
from torch.utils.data import DataLoader

import wds_datapipes as wd
from wds_datapipes import (
    NoShardsError,
    SampleError,
    ShardFormatError,
    ShardLister,
    ShardOpenError,
    register_opener,
    warn_and_continue,
)
from wds_datapipes.shards import openers as openers_module


def _members(urls, **options) -> list[tuple[str, str, bytes]]:
    return list(ShardLister(urls).load_tar(**options))


def _without_urls(members) -> list[tuple[str, bytes]]:
    return [(name, data) for _, name, data in members]


# ---------------------------------------------------------------- opening shards (load_tar)


def test_pipe_url_streams_a_commands_output(make_shards):
    (shard,) = make_shards(1, 4)
    members = _members([f"pipe:cat {shard}"])
    assert {url for url, _, _ in members} == {f"pipe:cat {shard}"}
    assert _without_urls(members) == _without_urls(_members([shard]))
    assert len(members) == 8


def test_pipe_url_can_stop_early_without_error(make_shards):
    (shard,) = make_shards(1, 300)
    dp = ShardLister([f"pipe:cat {shard}"]).load_tar().group_by_key()
    first = next(iter(dp))  # the rest of the pipe is closed unread: SIGPIPE is not a failure
    assert first["__key__"] == "s-000-000"
    assert len(list(dp)) == 300


@pytest.mark.parametrize("command", ["false", "exit 3", "cat /no/such/file 2>/dev/null"])
def test_failing_pipe_command_raises_shard_open_error(command):
    with pytest.raises(ShardOpenError, match="command exited with status") as caught:
        _members([f"pipe:{command}"])
    assert caught.value.url == f"pipe:{command}"


def test_failing_pipe_command_goes_to_the_handler(make_shards):
    (shard,) = make_shards(1, 2)
    with pytest.warns(UserWarning, match="command exited"):
        members = _members(["pipe:false", shard], handler=warn_and_continue)
    assert _without_urls(members) == _without_urls(_members([shard]))


def test_missing_local_file_raises_shard_open_error_naming_the_path(tmp_path):
    missing = str(tmp_path / "missing-000.tar")
    with pytest.raises(ShardOpenError) as caught:
        _members([missing])
    assert missing in str(caught.value)
    assert caught.value.url == missing


def test_missing_shard_with_warn_and_continue_goes_on_with_the_next(make_shards, tmp_path):
    shards = make_shards(2, 3)
    missing = str(tmp_path / "missing.tar")
    with pytest.warns(UserWarning, match="missing.tar"):
        members = _members([shards[0], missing, shards[1]], handler=warn_and_continue)
    assert members == _members(shards)


def test_truncated_shard_with_warn_and_continue_keeps_what_was_read(make_shards, tmp_path):
    shards = make_shards(2, 3)
    cut = tmp_path / "cut.tar"
    with tarfile.open(shards[0]) as tar:
        fourth = tar.getmembers()[3]
    data = Path(shards[0]).read_bytes()
    cut.write_bytes(data[: fourth.offset + 100])  # inside the fourth member's header
    with pytest.raises(ShardFormatError):
        _members([str(cut), shards[1]])
    with pytest.warns(UserWarning, match="cut.tar"):
        members = _members([str(cut), shards[1]], handler=warn_and_continue)
    head = [m for m in members if m[0] == str(cut)]
    assert len(head) == 3
    assert _without_urls(head) == _without_urls(_members([shards[0]]))[: len(head)]
    assert [m for m in members if m[0] != str(cut)] == _members([shards[1]])


def test_unknown_scheme_raises_shard_open_error_naming_the_scheme():
    with pytest.raises(ShardOpenError, match="nosuchscheme") as caught:
        _members(["nosuchscheme://bucket/shard-0.tar"])
    assert "no opener" in str(caught.value)


def test_file_urls_read_the_local_file(make_shards):
    shards = make_shards(2, 3)
    members = _members([f"file://{s}" for s in shards])
    assert [url for url, _, _ in members] == [f"file://{s}" for s in shards for _ in range(6)]
    assert _without_urls(members) == _without_urls(_members(shards))


@pytest.fixture
def http_root(tmp_path, monkeypatch):
    """Serves ``tmp_path`` on 127.0.0.1 (a free port) from a thread; yields the base URL."""
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_http_url_streams_the_same_samples(make_shards, http_root):
    shards = make_shards(2, 4, gz=True) + make_shards(1, 3, prefix="p")
    urls = [f"{http_root}/{os.path.basename(s)}" for s in shards]
    over_http = list(ShardLister(urls).load_tar().group_by_key())
    local = list(ShardLister(shards).load_tar().group_by_key())
    assert [s["__url__"] for s in over_http] == [urls[shards.index(s["__url__"])] for s in local]
    assert [{**s, "__url__": None} for s in over_http] == [{**s, "__url__": None} for s in local]


def test_http_error_raises_shard_open_error_with_the_status(http_root):
    url = f"{http_root}/missing.tar"
    with pytest.raises(ShardOpenError, match="HTTP 404") as caught:
        _members([url])
    assert caught.value.url == url


def test_registered_opener_handles_its_scheme(make_shards, monkeypatch):
    monkeypatch.setattr(openers_module, "_BACKENDS", dict(openers_module._BACKENDS))
    shards = make_shards(2, 2)
    opened = []

    def open_myscheme(url: str):
        opened.append(url)
        return open(shards[int(url.rsplit("/", 1)[1])], "rb")

    register_opener("MyScheme", open_myscheme)  # schemes are case-insensitive
    urls = ["myscheme://store/0", "MYSCHEME://store/1"]
    members = _members(urls)
    assert opened == urls
    assert _without_urls(members) == _without_urls(_members(shards))
    assert [url for url, _, _ in members] == [u for u in urls for _ in range(4)]


def test_opener_errors_become_shard_open_errors(monkeypatch):
    monkeypatch.setattr(openers_module, "_BACKENDS", dict(openers_module._BACKENDS))

    def refuse(url: str):
        raise PermissionError(13, "denied")

    register_opener("locked", refuse)
    with pytest.raises(ShardOpenError, match="PermissionError") as caught:
        _members(["locked://x/0.tar"])
    assert caught.value.url == "locked://x/0.tar"


# ---------------------------------------------------------------- loaders: helpers (module level: they pickle)


def _tag_pid(sample: dict) -> dict:
    return {**sample, "pid": os.getpid()}


def _keys(loader) -> list[str]:
    return [sample["__key__"] for sample in loader]


def _pipeline(urls, seed: int | None = None):
    lister = ShardLister(urls, shuffle=True, seed=seed)
    return lister.load_tar().group_by_key().shuffle_samples(bufsize=20, seed=seed)


def _dl2_epochs(dp, seed: int = 123, epochs: int = 2) -> list[list[str]]:
    loader = DataLoader2(dp, reading_service=wd.MultiProcessingReadingService(num_workers=2))
    loader.seed(seed)
    try:
        return [_keys(loader) for _ in range(epochs)]
    finally:
        loader.shutdown()


def _dl_epochs(dp, seed: int = 5, epochs: int = 2) -> list[list[str]]:
    loader = DataLoader(dp, num_workers=2, batch_size=None, generator=torch.Generator().manual_seed(seed))
    return [_keys(loader) for _ in range(epochs)]


LOADERS = [pytest.param(_dl2_epochs, id="DataLoader2", marks=needs_dataloader2), pytest.param(_dl_epochs, id="DataLoader")]


@pytest.fixture
def six_shards(make_shards) -> list[str]:
    return make_shards(6, 10)


def _all_keys(n_shards: int = 6, n_samples: int = 10) -> list[str]:
    return [f"s-{s:03d}-{i:03d}" for s in range(n_shards) for i in range(n_samples)]


# ---------------------------------------------------------------- loaders: every sample once, new order per epoch


@pytest.mark.parametrize("run", LOADERS)
def test_loader_gives_every_sample_once_per_epoch_in_a_new_order(six_shards, run):
    first, second = run(_pipeline(six_shards))
    assert sorted(first) == sorted(second) == _all_keys()
    assert first != second


@pytest.mark.parametrize("run", LOADERS)
def test_loader_runs_with_the_same_seeds_repeat_the_order(six_shards, run):
    # Seeded pipelines: the same user seed and loader seed give the same epochs.
    assert run(_pipeline(six_shards, seed=7)) == run(_pipeline(six_shards, seed=7))
    # The same pipeline object run again (what a loader built twice in one process sees).
    dp = _pipeline(six_shards)
    assert run(dp) == run(dp)


@pytest.mark.parametrize("run", LOADERS)
def test_loader_runs_with_different_seeds_differ(six_shards, run):
    dp = _pipeline(six_shards, seed=7)
    assert run(dp, 1)[0] != run(dp, 2)[0]


@pytest.mark.parametrize("run", LOADERS)
def test_loader_seed_alone_repeats_the_order_across_runs(six_shards, run):
    assert run(_pipeline(six_shards)) == run(_pipeline(six_shards))


@pytest.mark.parametrize("run", LOADERS)
def test_loader_seed_alone_repeats_the_shard_order_across_runs(six_shards, run):
    dp_first = ShardLister(six_shards, shuffle=True).load_tar().group_by_key()
    dp_second = ShardLister(six_shards, shuffle=True).load_tar().group_by_key()
    first, second = run(dp_first), run(dp_second)
    assert first == second
    assert sorted(first[0]) == _all_keys()


def test_direct_iteration_repeats_with_seeds_and_changes_per_epoch(six_shards):
    first, second = _pipeline(six_shards, seed=7), _pipeline(six_shards, seed=7)
    epoch1, epoch2 = _keys(first), _keys(first)
    assert [epoch1, epoch2] == [_keys(second), _keys(second)]
    assert sorted(epoch1) == sorted(epoch2) == _all_keys()
    assert epoch1 != epoch2
    assert _keys(_pipeline(six_shards, seed=8)) != epoch1


# ---------------------------------------------------------------- loaders: whole shards per worker


def _pids_by_url(samples) -> dict[str, set[int]]:
    pids: dict[str, set[int]] = {}
    for sample in samples:
        pids.setdefault(sample["__url__"], set()).add(sample["pid"])
    return pids


@needs_dataloader2
def test_dataloader2_workers_read_whole_distinct_shards(six_shards):
    dp = ShardLister(six_shards).load_tar().group_by_key().map(_tag_pid)
    loader = DataLoader2(dp, reading_service=wd.MultiProcessingReadingService(num_workers=2))
    try:
        samples = list(loader)
    finally:
        loader.shutdown()
    assert sorted(s["__key__"] for s in samples) == _all_keys()
    pids = _pids_by_url(samples)
    assert set(pids) == set(six_shards)
    assert all(len(p) == 1 for p in pids.values())
    assert len(set().union(*pids.values()) - {os.getpid()}) == 2  # two workers, not the main process


def test_dataloader_workers_read_whole_distinct_shards(six_shards):
    dp = ShardLister(six_shards, shuffle=True).load_tar().group_by_key().map(_tag_pid)
    samples = list(DataLoader(dp, num_workers=2, batch_size=None))
    assert sorted(s["__key__"] for s in samples) == _all_keys()
    pids = _pids_by_url(samples)
    assert all(len(p) == 1 for p in pids.values())
    assert len(set().union(*pids.values()) - {os.getpid()}) == 2


# ---------------------------------------------------------------- loaders: more workers than shards


def _dl2_list(dp) -> list[dict]:
    loader = DataLoader2(dp, reading_service=wd.MultiProcessingReadingService(num_workers=2))
    try:
        return list(loader)
    finally:
        loader.shutdown()


def _dl_list(dp) -> list[dict]:
    iterator = iter(DataLoader(dp, num_workers=2, batch_size=None))
    try:
        return list(iterator)
    finally:
        # At once: after a worker error the iterator sits in a traceback cycle, and the
        # garbage collector's later shutdown of it waits out worker join timeouts (~10 s).
        iterator._shutdown_workers()


LISTS = [pytest.param(_dl2_list, id="DataLoader2", marks=needs_dataloader2), pytest.param(_dl_list, id="DataLoader")]


@pytest.mark.parametrize("collect", LISTS)
def test_worker_without_a_shard_raises_no_shards_error(make_shards, collect):
    dp = ShardLister(make_shards(1, 4)).load_tar().group_by_key()
    with pytest.raises(NoShardsError, match="allow_empty"):
        collect(dp)


@pytest.mark.parametrize("collect", LISTS)
def test_worker_without_a_shard_yields_nothing_with_allow_empty(make_shards, collect):
    dp = ShardLister(make_shards(1, 4), allow_empty=True).load_tar().group_by_key()
    assert sorted(s["__key__"] for s in collect(dp)) == _all_keys(1, 4)


def _uneven_shards(make_shards, tmp_path) -> list[str]:
    """Shards of 1, 12, 0, 5 and 2 samples: workers run out at different times."""
    sizes = [1, 12, 0, 5, 2]
    return [make_shards(1, n, prefix=f"u{i}")[0] for i, n in enumerate(sizes)]


@needs_dataloader2
@pytest.mark.parametrize("num_workers", [2, 3])
def test_dataloader2_reads_uneven_shards_completely_every_epoch(make_shards, tmp_path, num_workers):
    # torchdata 0.8's own worker loop fails here (pytorch/data#1310); wds_datapipes' reading service fixes it.
    shards = _uneven_shards(make_shards, tmp_path)
    expected = sorted(s["__key__"] for s in ShardLister(shards).load_tar().group_by_key())
    assert len(expected) == 20
    dp = ShardLister(shards, shuffle=True, allow_empty=True).load_tar().group_by_key()
    loader = DataLoader2(dp, reading_service=wd.MultiProcessingReadingService(num_workers=num_workers))
    loader.seed(1)
    try:
        epochs = [_keys(loader) for _ in range(3)]
    finally:
        loader.shutdown()
    assert all(sorted(epoch) == expected for epoch in epochs)


# ---------------------------------------------------------------- errors crossing process boundaries


@pytest.mark.parametrize(
    "error",
    [
        ShardOpenError("u.tar", "gone"),
        ShardFormatError("u.tar", "m.jpg", 1024, "truncated"),
        SampleError("u.tar", "k", "bad", member="k.jpg"),
    ],
    ids=["ShardOpenError", "ShardFormatError", "SampleError"],
)
def test_errors_pickle_with_their_fields(error):
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is type(error)
    assert str(clone) == str(error)
    assert vars(clone) == vars(error)


@pytest.mark.parametrize("collect", LISTS)
def test_shard_open_error_keeps_its_type_through_workers(tmp_path, collect):
    missing = [str(tmp_path / f"missing-{i}.tar") for i in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ShardOpenError):
            collect(ShardLister(missing).load_tar())


# ---------------------------------------------------------------- a shard pipeline's checkpoint


def _stateful(shards: list[str], workers: int, generator: torch.Generator | None):
    from torchdata.stateful_dataloader import StatefulDataLoader

    dp = (wd.ShardLister(shards, shuffle=True).load_tar().group_by_key().shuffle_samples(7)
          .to_tuple("__key__").batch_samples(4, collate_fn=list))
    return StatefulDataLoader(dp, batch_size=None, num_workers=workers, generator=generator)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("seeded", [True, False], ids=["generator", "global-rng"])
def test_a_shard_pipeline_resumes_exactly_under_stateful_dataloader(sized_shards, workers, seeded):
    shards = sized_shards([9, 14, 5, 11, 3])

    def loader():
        return _stateful(shards, workers, torch.Generator().manual_seed(0) if seeded else None)

    torch.manual_seed(1)
    whole = loader()
    epochs = [list(whole), list(whole)]
    torch.manual_seed(1)
    stopped = loader()
    batches = iter(stopped)
    head = [next(batches) for _ in range(3)]
    state = pickle.loads(pickle.dumps(stopped.state_dict()))
    del batches
    torch.manual_seed(2)  # the resumed process's global RNG is another: the state carries the seeds used
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + list(resumed) == epochs[0]  # the rest of the epoch, with the seeds it began with
    later = list(resumed)
    if seeded:  # the next epochs' seeds come from the loader's generator, as in the whole run
        assert later == epochs[1]
    assert sorted(k for batch in later for (k,) in batch) == sorted(k for batch in epochs[0] for (k,) in batch) == sorted(
        k for batch in epochs[1] for (k,) in batch)
