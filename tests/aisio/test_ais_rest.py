"""aisio.rest's time limits, against two bare sockets (no cluster needed)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from aisio import rest
from aisio.errors import NoAnswer


def _serve_once(handle) -> int:
    """A listening socket on 127.0.0.1 whose first connection ``handle(conn)`` serves in a thread; its port."""
    server = socket.create_server(("127.0.0.1", 0))

    def run():
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            handle(conn)
        server.close()

    threading.Thread(target=run, daemon=True).start()
    return server.getsockname()[1]


def test_the_read_timeout_bounds_the_whole_wait_for_an_answer_across_a_redirect():
    silent_done = threading.Event()
    silent = _serve_once(lambda conn: silent_done.wait(10))  # a target that never answers
    slow = 0.6

    def redirect(conn):
        time.sleep(slow)  # the proxy answers late
        conn.sendall(f"HTTP/1.1 301 Moved\r\nLocation: http://127.0.0.1:{silent}/v1/objects/b/o\r\n"
                     "Content-Length: 0\r\n\r\n".encode())

    proxy = _serve_once(redirect)
    started = time.monotonic()
    try:
        with pytest.raises(NoAnswer) as info:
            rest.request("GET", f"http://127.0.0.1:{proxy}/v1/objects/b/o", timeouts=(1.0, 1.0))
    finally:
        silent_done.set()
    elapsed = time.monotonic() - started
    # Each hop with its own 1 s would take 1.6 s; the limit is for the whole wait.
    assert 0.9 < elapsed < 1.4, elapsed
    assert str(silent) in str(info.value)  # it names the node that did not answer
