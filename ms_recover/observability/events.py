"""The job's event log: one JSON object per line, with a wall-clock timestamp.

Every fault, decision, phase and recovery is written here (docs/design.md §2). Listeners (the demo's
timeline printer, the Prometheus exporter) see each event as it is written.

Every line carries ``job_id`` (the job it belongs to, so the logs of several jobs can be merged)
and ``schema`` (:data:`SCHEMA_VERSION`, raised when a field's meaning changes, so a reader can
tell which layout it reads).
"""

from __future__ import annotations

import collections
import io
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ms_recover.errors import ConfigError
from ms_recover.inputs import open_regular, os_reason
from ms_recover.protocol.bounds import depth_ok

log = logging.getLogger(__name__)

Event = dict[str, Any]

#: The layout of an event line; readers compare it before they interpret the fields.
SCHEMA_VERSION = 1


class EventLog:
    """Appends events to a JSONL file (if a path is given) and keeps the most recent in memory."""

    def __init__(
        self,
        path: str = "",
        keep: int = 2000,
        clock: Callable[[], float] = time.time,
        job_id: str = "",
    ):
        self.path = path
        self.job_id = job_id  # the manager fills it in from its config when left empty
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
        record: Event = {"ts": round(self._clock(), 6), "event": event}
        record.update(job_id=self.job_id, schema=SCHEMA_VERSION)
        record.update(fields)
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


#: The largest event log read (a week of a 16k-rank job with a recovery an hour is ~100 MiB).
MAX_LOG_BYTES = 1 << 30
#: The longest line read as one event; a longer one is skipped as malformed.
MAX_LINE = 1 << 20
#: The deepest nesting of one event (the manager writes 3 levels: an event > phases > value).
MAX_EVENT_DEPTH = 16


def open_log(path: str) -> io.TextIOWrapper:
    """The event log ``path`` opened as UTF-8 text (undecodable bytes replaced), if it is a
    regular file of at most :data:`MAX_LOG_BYTES`; else ConfigError naming it and the problem
    in one line (a FIFO, a device or a directory is refused at once, never read)."""
    try:
        fh = open_regular(path)
    except OSError as exc:
        raise ConfigError(f"event log {path}: {os_reason(exc)}") from exc
    size = os.fstat(fh.fileno()).st_size
    if size > MAX_LOG_BYTES:
        fh.close()
        raise ConfigError(f"event log {path}: {size} bytes; at most {MAX_LOG_BYTES} are read")
    return io.TextIOWrapper(fh, "utf-8", errors="replace")


def log_lines(fh: io.TextIOWrapper) -> Iterator[str]:
    """The lines of an open log, each at most :data:`MAX_LINE` characters (a longer line
    comes in pieces, each of them malformed)."""
    return iter(lambda: fh.readline(MAX_LINE), "")


def parse_event(line: str) -> Event | None:
    """One log line's event (a JSON object with ``event`` and ``ts``), or None: never raises."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, a 4300-digit number, too deep to parse
        return None
    ok = isinstance(record, dict) and "event" in record and "ts" in record
    return record if ok and depth_ok(record, MAX_EVENT_DEPTH) else None


def read_events(path: str) -> tuple[list[Event], int]:
    """Events of a JSONL file, and the number of malformed lines skipped; ConfigError naming
    the file if it cannot be read (:func:`open_log`)."""
    events: list[Event] = []
    bad = 0
    with open_log(path) as fh:
        for line in log_lines(fh):
            if not line.strip():
                continue
            record = parse_event(line)
            if record is None:
                bad += 1
            else:
                events.append(record)
    return events, bad
