"""The stall watchdog's warnings as the tests read them: the records of the stats logger, and
the (process, thread) of a warning that waits on a given shard."""

from __future__ import annotations

import logging
import threading


def stuck_on(record: logging.LogRecord, url: str, phase: str = "reading") -> list[tuple[dict, dict]]:
    """(process, thread) of a stall warning whose thread waits on the shard ``url`` in ``phase``."""
    return [(p, t) for p in getattr(record, "stall", {"processes": []})["processes"] for t in p["threads"]
            if t["shard"] and t["shard"]["url"].startswith(url) and t["shard"]["phase"] == phase]


class Stalls(logging.Handler):
    """Keeps the stats logger's records. Told ``release_on(url, phase, event)``, the first stall
    warning that waits on ``url`` in ``phase`` sets ``event`` (the cause's release: a wait of a
    loaded machine's before the warning is no release)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._release: tuple[str, str, threading.Event] | None = None

    def release_on(self, url: str, phase: str, event: threading.Event) -> None:
        self._release = (url, phase, event)

    def warnings(self) -> list[logging.LogRecord]:
        return [r for r in self.records if hasattr(r, "stall")]

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if self._release is not None and stuck_on(record, self._release[0], self._release[1]):
            self._release[2].set()
