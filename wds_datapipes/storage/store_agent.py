"""The object-store agent: makes obstore calls for a process that cannot (see :mod:`.store_calls`).

Started by that process with this room's modules only (``store_calls._AGENT_BOOT``: not the
package's ``__init__``, which imports torch), or as ``python -m
wds_datapipes.storage.store_agent``, it reads requests
from its standard input and answers on its standard output (length-prefixed pickles),
one at a time, until its input ends. Open reads and listings are kept by a handle and
moved on by ``next`` requests, so an abandoned read costs nothing but its close.
"""

from __future__ import annotations

import sys

from . import store_calls


def serve(requests, answers) -> None:
    """Answers each request on ``requests`` on ``answers`` until ``requests`` ends."""
    open_items: dict[int, object] = {}
    counter = 0
    while True:
        try:
            request = store_calls._receive(requests)
        except store_calls.StoreFailure:
            return  # the client is gone
        op, *args = request
        try:
            if op == "head":
                value = store_calls.head(*args)
            elif op == "put":
                value = store_calls.put(*args)
            elif op == "sign":
                value = store_calls.sign(*args)
            elif op == "get":
                meta, chunks = store_calls.get(*args)
                counter += 1
                open_items[counter] = chunks
                value = (counter, meta)
            elif op == "list":
                counter += 1
                open_items[counter] = store_calls.list_pages(*args)
                value = counter
            elif op == "next":
                item = next(open_items[args[0]], None)
                value = bytes(item) if item is not None and not isinstance(item, list) else item
            elif op == "close":
                open_items.pop(args[0], None)
                value = None
            else:
                raise store_calls.StoreFailure(store_calls.TRANSIENT, f"unknown request {op!r}")
            answer = ("ok", value)
        except Exception as exn:  # noqa: BLE001 - every failure goes back to the client
            failure = store_calls.classify(exn)
            answer = ("error", (failure.kind, failure.message))
        store_calls._send(answers, answer)
        answers.flush()


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
