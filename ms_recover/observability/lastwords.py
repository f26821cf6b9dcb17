"""A rank's last words: what a fault report says about why the rank died.

A rank started by an agent gets ``MS_RECOVER_ERROR_FILE``; :func:`install` (called by
``ms_recover.init()``) makes an uncaught exception write the rank's host, pid and traceback
there before the interpreter exits. When the rank ends, the agent reads that file with
:func:`collect`, or, without one (killed by a signal, a crash in native code), the last lines
of the rank's log file when it has one. What comes back is bounded (:data:`MAX_LINES` lines and
:data:`MAX_CHARS` characters, the end kept), so a fault event stays one short JSON line.
Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import traceback
from types import TracebackType

ERROR_FILE = "MS_RECOVER_ERROR_FILE"
MAX_LINES = 40
MAX_CHARS = 4000
_READ_BYTES = 64 * 1024  # of a log's end: enough for MAX_LINES lines of any sane length


def bounded(text: str, max_lines: int = MAX_LINES, max_chars: int = MAX_CHARS) -> str:
    """The last ``max_lines`` lines of ``text``, cut to its last ``max_chars`` characters."""
    lines = text.rstrip("\n").splitlines()[-max_lines:]
    out = "\n".join(lines)
    return out if len(out) <= max_chars else "..." + out[-(max_chars - 3) :]


def install(path: str) -> None:
    """Chain ``sys.excepthook`` so an uncaught exception writes this process's last words to
    ``path`` (JSON: host, pid, exception, traceback), then runs the previous hook."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        with contextlib.suppress(Exception):  # never hide the original error
            write(path, "".join(traceback.format_exception(kind, exc, tb)), exc)
        previous(kind, exc, tb)

    sys.excepthook = hook


def write(path: str, trace: str, exc: BaseException | None = None) -> None:
    """Write the last words (atomically: a reader sees all of it or nothing)."""
    record = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "exception": bounded(f"{type(exc).__name__}: {exc}", 3, 500) if exc else "",
        "traceback": bounded(trace),
    }
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(record, fh)
    os.replace(tmp, path)


def collect(error_file: str, log_file: str = "") -> tuple[str, str]:
    """``(host, tail)`` of a rank that ended: its own report from ``error_file`` (removed once
    read) when it wrote one, else the end of ``log_file``; the host is this machine's when the
    rank did not say (the agent shares its pod)."""
    host, tail = socket.gethostname(), ""
    if error_file:
        with contextlib.suppress(OSError, ValueError):
            with open(error_file, encoding="utf-8") as fh:
                record = json.load(fh)
            os.unlink(error_file)
            if isinstance(record, dict):
                host = str(record.get("host") or host)
                tail = bounded(str(record.get("traceback") or ""))
    if not tail and log_file:
        tail = tail_of(log_file)
    return host, tail


def tail_of(path: str) -> str:
    """The bounded end of a text file ('' when it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - _READ_BYTES))
            return bounded(fh.read().decode("utf-8", "replace"))
    except OSError:
        return ""
