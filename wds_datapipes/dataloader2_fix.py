"""A fix for torchdata 0.8's DataLoader2 when its workers yield different numbers of items.

``MultiProcessingReadingService`` reads its workers round-robin in the main process
(``_IterateQueueDataPipes``). Once one worker is exhausted, torchdata's loop can send the
next request to that finished worker and then wait on a live one that was never asked:
"Can not expect any response without submitted request", or a hang (upstream issues
meta-pytorch/data#1228 and #1310, closed as DataPipes are no longer maintained). With
shards of unequal sizes, the usual case, every multi-worker epoch can hit it.

:func:`install` replaces that loop with one that keeps one request in flight per live
worker, takes each worker's answers in turn, and drops a worker from the rotation once
it is exhausted. Importing ``wds_datapipes`` installs it; set
``WDS_DATAPIPES_KEEP_DATALOADER2_LOOP=1`` to keep torchdata's own loop.
"""

from __future__ import annotations

import os
import time

try:
    from torchdata.dataloader2 import communication
    from torchdata.dataloader2.communication.iter import _IterateQueueDataPipes
except ImportError:  # torchdata without DataLoader2: nothing to fix
    _IterateQueueDataPipes = None

_POLL_SECONDS = 0.001


class _RoundRobinOverLiveWorkers(_IterateQueueDataPipes or object):
    """Carries the replacement ``__iter__`` (defined on an IterDataPipe subclass so that
    torch's iterator hook wraps it as it wraps every DataPipe's)."""

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
        """``worker``'s next answer, polling so that termination is noticed; None if none is coming."""
        if self.res_buffers[worker]:
            return self.res_buffers[worker].popleft()
        protocol = self.datapipes[worker].protocol
        if not protocol.waiting_for_response():
            return None
        while not self._terminated:
            try:
                return protocol.get_response_next(block=False)
            except communication.protocol.EmptyQueue:
                time.sleep(_POLL_SECONDS)
        return None

    def _has_answer_coming(self, worker: int) -> bool:
        return bool(self.res_buffers[worker]) or self.datapipes[worker].protocol.waiting_for_response()


def install() -> bool:
    """Put the fixed loop in place of torchdata's; returns whether it is in place."""
    if _IterateQueueDataPipes is None or os.environ.get("WDS_DATAPIPES_KEEP_DATALOADER2_LOOP"):
        return False
    for name in ("__iter__", "_request", "_receive", "_has_answer_coming"):
        setattr(_IterateQueueDataPipes, name, _RoundRobinOverLiveWorkers.__dict__[name])
    return True
