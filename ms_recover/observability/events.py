"""The job's event log: one JSON object per line, with a wall-clock timestamp.

Every fault, decision, phase and recovery is written here (docs/design.md §2). Listeners (the demo's
timeline printer, the Prometheus exporter) see each event as it is written.

The manager writes typed records only (:mod:`ms_recover.observability.schema` holds every kind,
the envelope each line carries — ``ts``, ``event``, ``job_id``, ``schema``, ``epoch`` — and the
codec). Listeners and :meth:`EventLog.recent` see each event as the JSON object of its line.
Reading a file back decodes every line against the schema; a line that does not follow it is
skipped and counted, never raised.
"""

from __future__ import annotations

import collections
import io
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ms_recover.errors import ConfigError
from ms_recover.inputs import open_regular, os_reason
from ms_recover.observability.schema import (
    SCHEMA_VERSION,
    EventLine,
    Record,
    SchemaError,
    dumps,
    encode,
    parse_line,
)

log = logging.getLogger(__name__)

#: An event as its line's JSON object (what listeners and :meth:`EventLog.recent` see).
Event = dict[str, Any]


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

    def write(self, record: Record, epoch: int | None = None, state: str | None = None) -> Event:
        """Append ``record`` with the envelope (now, this log's job, ``epoch``, ``state``);
        returns the event as its line's JSON object."""
        line = EventLine(round(self._clock(), 6), record, self.job_id, SCHEMA_VERSION, epoch, state)
        event = encode(line)
        with self._lock:
            self._recent.append(event)
            if self._fh is not None:
                self._fh.write(dumps(event) + "\n")
                self._fh.flush()
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:  # a broken listener must not stop the manager
                log.exception("event listener failed on %s", record.EVENT)
        return event

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


def read_lines(lines: Iterable[str]) -> tuple[list[EventLine], int, str]:
    """The events of JSONL text decoded against the schema, the number of lines skipped (not
    JSON, an unknown event, a missing field or one of the wrong type), and the first of those
    problems (``line N: reason``, the reason cut short; escape it before printing)."""
    events: list[EventLine] = []
    bad, first = 0, ""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            events.append(parse_line(line))
        except SchemaError as exc:
            bad += 1
            first = first or f"line {number}: {exc}"
    return events, bad, first


def read_events(path: str) -> tuple[list[EventLine], int]:
    """The events of a JSONL file, and the number of malformed lines skipped; ConfigError naming
    the file if it cannot be read (:func:`open_log`)."""
    with open_log(path) as fh:
        events, bad, _first = read_lines(log_lines(fh))
    return events, bad
