"""A fix for torchdata 0.8's DataLoader2 when its workers yield different numbers of items.

``MultiProcessingReadingService`` reads its workers round-robin in the main process
(``_IterateQueueDataPipes``). Once one worker is exhausted, torchdata's loop can send the
next request to that finished worker and then wait on a live one that was never asked:
"Can not expect any response without submitted request", or a hang (upstream issues
meta-pytorch/data#1228 and #1310, closed as DataPipes are no longer maintained). With
shards of unequal sizes, the usual case, every multi-worker epoch can hit it; so can
exact epochs, whose workers' shares differ by up to one batch.

:class:`MultiProcessingReadingService` here is torchdata's, except that the consumer it
builds keeps one request in flight per live worker, takes each worker's answers in turn,
and drops a worker from the rotation once it is exhausted. Only loaders built with it get
the fixed loop: nothing of torchdata changes for the rest of the process, and importing
``wds_datapipes`` imports no torchdata at all. The loop is used only with the torchdata
versions it was written and tested for (0.7.0, 0.7.1, 0.8.0) and whose private attributes
it finds; elsewhere it warns once and leaves torchdata's loop in place.

:func:`install` puts the loop in place for every ``MultiProcessingReadingService`` of
the process (for code that builds torchdata's own); :func:`uninstall` takes it out.

Built with torchdata's own ``MultiProcessingReadingService``, as torchdata's docs teach, a
DataLoader2 over our pipes gets the fixed loop too: :func:`guard_torchdata` (run when
``wds_datapipes`` is imported, or when torchdata's reading service module is imported
later) wraps that class's ``initialize`` so that a graph holding a pipe of ours is set up
with the fixed loop; a graph without one is set up exactly as before.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import logging
import queue
import sys
import time
import warnings

logger = logging.getLogger("wds_datapipes")

SUPPORTED_TORCHDATA = ("0.7.0", "0.7.1", "0.8.0")
# The private parts of torchdata's loop that the replacement relies on.
_LOOP_ATTRIBUTES = ("_num_processes", "res_buffers", "_limit", "_request_cnt", "_terminated", "datapipes")
_WAIT_SECONDS = 0.05  # a blocking wait for a worker's answer wakes this often to see a termination
_ANSWER_GRACE_S = 1.0  # at shutdown, how long an answer still owed is waited for


def _quiet_import_dataloader2():
    """torchdata.dataloader2, imported without its deprecation banner (it is said once, in our docs)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"(?s).*'datapipes', 'dataloader2' modules are deprecated")
        try:
            from torchdata import dataloader2
            from torchdata.dataloader2 import communication, reading_service
        except ImportError as exn:
            raise ImportError(f"MultiProcessingReadingService is DataLoader2's, which torchdata {_torchdata_version()} "
                              "does not have (torchdata 0.10 removed it): use torch.utils.data.DataLoader or "
                              "torchdata.stateful_dataloader.StatefulDataLoader, or torchdata<=0.9") from exn
    return dataloader2, communication, reading_service


def _torchdata_version() -> str:
    try:
        from importlib.metadata import version

        return version("torchdata")
    except Exception:  # noqa: BLE001 - only for a message
        return "(not installed)"


@functools.cache
def _fixed_loop_class() -> type | None:
    """The replacement consumer class, or None where it does not fit this torchdata."""
    import torchdata

    version = torchdata.__version__.split("+")[0]
    _, communication, _ = _quiet_import_dataloader2()
    original = communication.iter._IterateQueueDataPipes
    if version not in SUPPORTED_TORCHDATA:
        warnings.warn(f"wds_datapipes' DataLoader2 worker loop was written for torchdata {SUPPORTED_TORCHDATA}, "
                      f"not {torchdata.__version__}: torchdata's own loop is used", stacklevel=3)
        return None

    class RoundRobinOverLiveWorkers(original):
        """torchdata's consumer of worker queues, taking turns only among live workers."""

        def __iter__(self):
            for worker in range(self._num_processes):
                self._request(worker)
            live = list(range(self._num_processes))
            turn = 0
            while live and not self._terminated:
                turn %= len(live)
                worker = live[turn]
                response = self._receive(worker)
                if response is None:  # terminated, or the request limit left this worker idle
                    if self._terminated or not any(self._has_answer_coming(w) for w in live):
                        return
                    turn += 1
                    continue
                if isinstance(response, communication.messages.InvalidStateResponse):
                    raise communication.iter.InvalidStateResetRequired
                if isinstance(response, communication.messages.TerminateResponse):
                    raise communication.iter.TerminateRequired
                if isinstance(response, communication.messages.WorkerExceptionResponse):
                    response.exc.reraise()
                if isinstance(response, communication.messages.StopIterationResponse):
                    del live[turn]  # the next live worker moves into this turn
                    continue
                self._request(worker)
                turn += 1
                yield response.value

        def _request(self, worker: int) -> None:
            """Ask ``worker`` for its next item, unless one is asked or held already, or the limit is hit."""
            protocol = self.datapipes[worker].protocol
            if self.res_buffers[worker] or not protocol.can_take_request():
                return
            if self._limit is not None and self._request_cnt >= self._limit:
                return
            protocol.request_next()
            self._request_cnt += 1

        def _receive(self, worker: int):
            """``worker``'s next answer as soon as it comes; None if none is coming or on termination.

            It blocks on the worker's queue (torchdata's loop polls every 1 ms instead), waking
            every ``_WAIT_SECONDS`` to notice a termination.
            """
            if self.res_buffers[worker]:
                return self.res_buffers[worker].popleft()
            protocol = self.datapipes[worker].protocol
            if not protocol.waiting_for_response():
                return None
            while not self._terminated:
                try:
                    return protocol.get_response_next(block=True, timeout=_WAIT_SECONDS)
                except communication.protocol.EmptyQueue:
                    continue
            return None

        def _has_answer_coming(self, worker: int) -> bool:
            return bool(self.res_buffers[worker]) or self.datapipes[worker].protocol.waiting_for_response()

    RoundRobinOverLiveWorkers.__qualname__ = RoundRobinOverLiveWorkers.__name__  # pickled by name:
    RoundRobinOverLiveWorkers.__module__ = __name__  # see __getattr__ below
    RoundRobinOverLiveWorkers.original = original
    return RoundRobinOverLiveWorkers


def _check_instance(consumer: object) -> None:
    missing = [name for name in _LOOP_ATTRIBUTES if not hasattr(consumer, name)]
    if missing:
        raise RuntimeError(f"torchdata's worker loop lacks {missing}: the DataLoader2 fix does not fit this torchdata")


@contextlib.contextmanager
def _fixed_loop():
    """Within the block, DataLoader2 builds its worker consumer from the fixed loop."""
    loop = _fixed_loop_class()
    if loop is None:
        yield
        return
    _, communication, _ = _quiet_import_dataloader2()
    saved = communication.iter._IterateQueueDataPipes
    communication.iter._IterateQueueDataPipes = loop
    try:
        yield
    finally:
        communication.iter._IterateQueueDataPipes = saved


@functools.cache
def reading_service_class() -> type:
    """``MultiProcessingReadingService`` with the fixed worker loop (torchdata is imported here)."""
    _, _, reading_service = _quiet_import_dataloader2()

    class MultiProcessingReadingService(reading_service.MultiProcessingReadingService):
        """torchdata's ``MultiProcessingReadingService`` whose main process takes turns only among
        live workers, so workers may yield different numbers of items (wds_datapipes.loaders.dataloader2).

        ``worker_prefetch_cnt`` and ``main_prefetch_cnt`` default to 0, not torchdata's 10:
        the consumer loop keeps a request in flight at every worker, so each worker makes its
        next item while the main process takes the last one, and torchdata's prefetchers
        would add threads that poll every 0.1 ms. On 2 cores, with batches of 64 224x224
        crops, the defaults ran at 54-78% of the 2-thread decoding ceiling and 0/0 at 78-96%
        (``make bench``; DataLoader: 75-94% in the same runs).
        """

        def __init__(self, num_workers: int = 0, multiprocessing_context: str | None = None,
                     worker_prefetch_cnt: int = 0, main_prefetch_cnt: int = 0, **options):
            super().__init__(num_workers, multiprocessing_context, worker_prefetch_cnt=worker_prefetch_cnt,
                             main_prefetch_cnt=main_prefetch_cnt, **options)

        def initialize(self, datapipe):
            """Starts the workers on ``datapipe`` (torchdata's), with the fixed worker loop."""
            with _fixed_loop():
                end = super().initialize(datapipe)
            if self._worker_consumer_datapipe is not None and _fixed_loop_class() is not None:
                _check_instance(self._worker_consumer_datapipe)
            return end

        def finalize(self) -> None:
            """Stops the workers (torchdata's), without the hang of its own finalize (below)."""
            # torchdata's finalize reads each worker's last answer off its queue while the
            # main-process prefetch thread may still be reading the same queue for the
            # consumer loop: whichever gets the answer, the other waits forever (a hang
            # ~1 run in 40 when a loop stops right after an epoch's last batch). So the
            # loop is told to stop and the prefetch thread is joined first.
            if not getattr(self, "_finalized", False):
                consumer = getattr(self, "_worker_consumer_datapipe", None)
                if consumer is not None:
                    consumer._terminated = True  # the loop returns at its next wake
                prefetcher = getattr(self, "_main_prefetch_datapipe", None)
                if prefetcher is not None:
                    prefetcher.shutdown()  # joins the prefetch thread
                if consumer is not None:
                    self._stop_silent_workers(consumer)
            super().finalize()

        def _stop_silent_workers(self, consumer) -> None:
            # torchdata's finalize then waits, without a limit, for every answer still owed.
            # DataLoader2 shuts down before it raises a worker's error, so a second worker
            # busy retrying a dead source (AIStore: up to the retry budget) delayed the
            # error by that long. An answer not there within _ANSWER_GRACE_S (one grace for
            # all workers) is not waited for: its worker is stopped.
            deadline = time.monotonic() + _ANSWER_GRACE_S
            processes = [process for process, _, _ in getattr(self, "_worker_processes", [])]
            for datapipe, process in zip(consumer.datapipes, processes):
                protocol = datapipe.protocol
                if not protocol.waiting_for_response():
                    continue
                try:
                    left = max(deadline - time.monotonic(), 0.0)
                    protocol.request_served(protocol.response_queue.get(timeout=left))
                except queue.Empty:
                    logger.warning("DataLoader2 worker %s gave no answer within %.1f s of the shutdown: stopped",
                                   process.name, _ANSWER_GRACE_S)
                    process.terminate()
                    protocol.request_served()

    MultiProcessingReadingService.__module__ = "wds_datapipes"
    MultiProcessingReadingService.__qualname__ = "MultiProcessingReadingService"
    return MultiProcessingReadingService


OUR_PACKAGES = ("wds_datapipes", "aisio")
READING_SERVICE_MODULE = "torchdata.dataloader2.reading_service"


def holds_our_pipes(datapipe) -> bool:
    """Whether a pipe of this library (or of aisio) is in ``datapipe``'s graph."""
    from ..torch_datapipes import traverse_dps

    def walk(graph: dict) -> bool:
        return any(type(node).__module__.split(".")[0] in OUR_PACKAGES or walk(children)
                   for node, children in graph.values())

    try:
        return walk(traverse_dps(datapipe))
    except Exception:  # noqa: BLE001 - a graph torch cannot walk: treated as not ours
        return False


def guard_torchdata() -> None:
    """Wraps torchdata's ``MultiProcessingReadingService.initialize`` (once) to set up a graph of
    our pipes with the fixed loop. Only where torchdata's reading service module is imported
    already; :class:`_ReadingServiceWatcher` calls it when that module is imported later."""
    module = sys.modules.get(READING_SERVICE_MODULE)
    service = getattr(module, "MultiProcessingReadingService", None)
    if service is None or getattr(service.initialize, "_wds_guarded", False):
        return
    original = service.initialize

    @functools.wraps(original)
    def initialize(self, datapipe):
        if not holds_our_pipes(datapipe) or _fixed_loop_class() is None:
            return original(self, datapipe)
        with _fixed_loop():  # our pipes' workers yield different numbers of items: torchdata's loop fails
            return original(self, datapipe)

    initialize._wds_guarded = True
    service.initialize = initialize


class _ReadingServiceWatcher(importlib.abc.MetaPathFinder):
    """Runs :func:`guard_torchdata` once torchdata's reading service module has been imported."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != READING_SERVICE_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _GuardingLoader(spec.loader)
                return spec
        return None


class _GuardingLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        guard_torchdata()


def watch_torchdata() -> None:
    """Guards torchdata's reading service now if it is imported, else when it is (no import here)."""
    if READING_SERVICE_MODULE in sys.modules:
        guard_torchdata()
    elif not any(isinstance(finder, _ReadingServiceWatcher) for finder in sys.meta_path):
        sys.meta_path.insert(0, _ReadingServiceWatcher())


def install() -> bool:
    """Use the fixed loop for every ``MultiProcessingReadingService`` of this process; returns
    whether it is in place (not with an untested torchdata, nor without DataLoader2)."""
    try:
        loop = _fixed_loop_class()
    except ImportError:
        return False
    if loop is None:
        return False
    _, communication, _ = _quiet_import_dataloader2()
    communication.iter._IterateQueueDataPipes = loop
    logger.debug("DataLoader2's worker loop replaced by wds_datapipes' for the whole process")
    return True


def uninstall() -> None:
    """Puts torchdata's own loop back after :func:`install`."""
    loop = _fixed_loop_class()
    if loop is not None:
        _, communication, _ = _quiet_import_dataloader2()
        communication.iter._IterateQueueDataPipes = loop.original


def __getattr__(name: str):
    # The classes are built on first use (torchdata is imported then), and found by name
    # when pickled (DataLoader2 traverses its graph by pickling it).
    if name == "RoundRobinOverLiveWorkers":
        return _fixed_loop_class()
    if name == "MultiProcessingReadingService":
        return reading_service_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
