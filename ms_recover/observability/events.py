"""The job's event log: one JSON object per line, with a wall-clock timestamp.

Every fault, decision, phase and recovery is written here (DESIGN.md §2). Listeners (the demo's
timeline printer, the Prometheus exporter) see each event as it is written.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

Event = dict[str, Any]


class EventLog:
    """Appends events to a JSONL file (if a path is given) and keeps the most recent in memory."""

    def __init__(self, path: str = "", keep: int = 2000, clock: Callable[[], float] = time.time):
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._recent: collections.deque[Event] = collections.deque(maxlen=keep)
        self._listeners: list[Callable[[Event], None]] = []
        self._fh = None
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def subscribe(self, listener: Callable[[Event], None]) -> None:
        self._listeners.append(listener)

    def write(self, event: str, **fields: Any) -> Event:
        record: Event = {"ts": round(self._clock(), 6), "event": event, **fields}
        with self._lock:
            self._recent.append(record)
            if self._fh is not None:
                self._fh.write(json.dumps(record, sort_keys=True, default=str) + "\n")
                self._fh.flush()
        for listener in self._listeners:
            try:
                listener(record)
            except Exception:  # a broken listener must not stop the manager
                log.exception("event listener failed on %s", event)
        return record

    def replay(self, record: Event) -> None:
        """Keep and announce an event another process wrote (its own ``ts`` kept), as
        :meth:`write` would; nothing is written to this log's file."""
        with self._lock:
            self._recent.append(record)
        for listener in self._listeners:
            try:
                listener(record)
            except Exception:
                log.exception("event listener failed on %s", record.get("event"))

    def recent(self, event: str | None = None) -> list[Event]:
        with self._lock:
            return [e for e in self._recent if event is None or e["event"] == event]

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


def read_events(path: str) -> tuple[list[Event], int]:
    """Events of a JSONL file, and the number of malformed lines skipped."""
    events: list[Event] = []
    bad = 0
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(record, dict) and "event" in record and "ts" in record:
                events.append(record)
            else:
                bad += 1
    return events, bad
