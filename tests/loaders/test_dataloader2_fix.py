"""The DataLoader2 worker-loop fix: only where asked for, only on the torchdata it was written for."""

from __future__ import annotations

import subprocess
import sys
import time
import warnings

import pytest
from stack import needs_dataloader2

import wds_datapipes as wd
from wds_datapipes.loaders import dataloader2 as dataloader2_fix


def test_importing_the_library_imports_no_torchdata():
    code = ("import sys, wds_datapipes\n"
            "assert not [m for m in sys.modules if m.startswith('torchdata')], 'torchdata was imported'\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert "deprecated" not in run.stderr


@needs_dataloader2
def test_our_reading_service_uses_the_fixed_loop_and_leaves_torchdatas_alone(make_shards):
    from torchdata.dataloader2 import DataLoader2, communication

    original = communication.iter._IterateQueueDataPipes
    service = wd.MultiProcessingReadingService(num_workers=2)
    loader = DataLoader2(wd.ShardLister(make_shards(3, 2), allow_empty=True).load_tar(), reading_service=service)
    try:
        iterator = iter(loader)
        first = next(iterator)
        assert type(loader.reading_service._worker_consumer_datapipe).__name__ == "RoundRobinOverLiveWorkers"
        assert len([first, *iterator]) == 12
    finally:
        loader.shutdown()
    assert communication.iter._IterateQueueDataPipes is original


@needs_dataloader2
def test_our_reading_service_prefetches_through_its_requests_not_torchdatas_polling_threads(make_shards):
    from torchdata.dataloader2 import DataLoader2

    service = wd.MultiProcessingReadingService(2)
    assert (service.num_workers, service.worker_prefetch_cnt, service.main_prefetch_cnt) == (2, 0, 0)
    loader = DataLoader2(wd.ShardLister(make_shards(4, 8), allow_empty=True).load_tar().group_by_key(),
                         reading_service=service)
    try:
        keys = [sample["__key__"] for sample in loader]
        assert loader.reading_service._main_prefetch_datapipe is None
    finally:
        loader.shutdown()
    assert len(keys) == len(set(keys)) == 32
    assert wd.MultiProcessingReadingService(2, worker_prefetch_cnt=3).worker_prefetch_cnt == 3


@needs_dataloader2
def test_shutdown_stops_the_prefetch_thread_before_it_takes_the_workers_last_answers(make_shards):
    # torchdata's finalize takes each worker's outstanding answer off its queue; the prefetch
    # thread that runs the consumer loop must be gone by then, or the two race for the answer
    # and the loser waits forever (it hung ~1 in 40 stops right after an epoch's last batch).
    from torchdata.dataloader2 import DataLoader2

    service = wd.MultiProcessingReadingService(num_workers=2, main_prefetch_cnt=4)  # with its thread
    loader = DataLoader2(wd.ShardLister(make_shards(4, 8), allow_empty=True).load_tar(), reading_service=service)
    seen = {}
    try:
        iterator = iter(loader)
        items = [next(iterator) for _ in range(31)]  # stop before the last item: answers are in flight
        running = loader.reading_service  # DataLoader2 works on a copy of the service
        consumer, prefetcher = running._worker_consumer_datapipe, running._main_prefetch_datapipe
        original = consumer.request_terminate

        def request_terminate():
            seen["prefetch thread"] = prefetcher.thread
            seen["loop stopped"] = consumer._terminated
            original()

        consumer.request_terminate = request_terminate
    finally:
        loader.shutdown()
    assert len(items) == 31
    assert seen == {"prefetch thread": None, "loop stopped": True}


def _fail_on_shard_0_hang_on_shard_1(item):
    url = item[0]
    if url.endswith("-000.tar"):
        raise ValueError(f"bad sample in {url}")
    time.sleep(60)  # a worker stuck in a long retry
    return item


@needs_dataloader2
def test_a_workers_error_is_not_held_back_by_another_worker_that_does_not_answer(make_shards, caplog):
    # DataLoader2 shuts down before it raises a worker's error; torchdata's shutdown waited,
    # without a limit, for the answer the other worker still owed.
    from torchdata.dataloader2 import DataLoader2

    pipe = wd.ShardLister(make_shards(2, 2), allow_empty=True).load_tar().map(_fail_on_shard_0_hang_on_shard_1)
    loader = DataLoader2(pipe, reading_service=wd.MultiProcessingReadingService(num_workers=2))
    started = time.monotonic()
    try:
        with pytest.raises(ValueError, match="bad sample in"):
            list(loader)
        raised = time.monotonic() - started
    finally:
        loader.shutdown()
    assert raised < 15, f"the error came after {raised:.1f} s"
    assert "gave no answer within 1.0 s of the shutdown: stopped" in caplog.text


@needs_dataloader2
def test_install_and_uninstall_swap_the_loop_for_the_whole_process():
    from torchdata.dataloader2 import communication

    original = communication.iter._IterateQueueDataPipes
    try:
        assert dataloader2_fix.install()
        assert communication.iter._IterateQueueDataPipes.__name__ == "RoundRobinOverLiveWorkers"
    finally:
        dataloader2_fix.uninstall()
    assert communication.iter._IterateQueueDataPipes is original


@needs_dataloader2
def test_an_untested_torchdata_keeps_its_own_loop_with_a_warning(monkeypatch):
    import torchdata
    from torchdata.dataloader2 import communication

    monkeypatch.setattr(torchdata, "__version__", "0.9.0")
    dataloader2_fix._fixed_loop_class.cache_clear()
    try:
        with pytest.warns(UserWarning, match="written for torchdata"):
            assert dataloader2_fix._fixed_loop_class() is None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert not dataloader2_fix.install()
        assert communication.iter._IterateQueueDataPipes.__name__ == "_IterateQueueDataPipes"
    finally:
        dataloader2_fix._fixed_loop_class.cache_clear()


def test_without_dataloader2_the_service_says_what_to_use_instead(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchdata.dataloader2", None)  # as on torchdata >= 0.10
    dataloader2_fix.reading_service_class.cache_clear()
    try:
        with pytest.raises(ImportError, match="torchdata 0.10 removed it.*DataLoader or .*StatefulDataLoader"):
            wd.MultiProcessingReadingService  # noqa: B018
    finally:
        dataloader2_fix.reading_service_class.cache_clear()


@needs_dataloader2
def test_torchdata_s_own_reading_service_reads_uneven_shards_of_our_pipes_to_the_end(sized_shards):
    """As torchdata's docs and the AIStore blog teach: DataLoader2 + torchdata's own service."""
    from torchdata.dataloader2 import DataLoader2, MultiProcessingReadingService

    shards = sized_shards([50, 85, 61, 77, 52, 70])
    dp = wd.ShardLister(shards, shuffle=True, seed=0).load_tar().group_by_key()
    loader = DataLoader2(dp, reading_service=MultiProcessingReadingService(num_workers=2))
    try:
        for _ in range(2):
            keys = [sample["__key__"] for sample in loader]
            assert len(keys) == len(set(keys)) == 395  # every sample once, and no crash at the epoch's end
        assert type(loader.reading_service._worker_consumer_datapipe).__name__ == "RoundRobinOverLiveWorkers"
    finally:
        loader.shutdown()


@needs_dataloader2
def test_torchdata_s_own_reading_service_is_unchanged_for_pipes_that_are_not_ours():
    from torch.utils.data.datapipes.iter import IterableWrapper
    from torchdata.dataloader2 import DataLoader2, MultiProcessingReadingService, communication

    original = communication.iter._IterateQueueDataPipes
    loader = DataLoader2(IterableWrapper(range(40)).sharding_filter(),
                         reading_service=MultiProcessingReadingService(num_workers=2))
    try:
        assert sorted(loader) == list(range(40))
        assert type(loader.reading_service._worker_consumer_datapipe) is original
    finally:
        loader.shutdown()


def test_the_guard_waits_for_torchdata_to_be_imported():
    code = ("import sys, wds_datapipes\n"
            "assert 'torchdata.dataloader2.reading_service' not in sys.modules\n"
            "from torchdata.dataloader2 import MultiProcessingReadingService as M\n"
            "assert M.initialize._wds_guarded\n")
    run = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120,
                         check=False)
    if "No module named 'torchdata.dataloader2'" in run.stderr:
        pytest.skip("this torchdata has no DataLoader2")
    assert run.returncode == 0, run.stderr
