"""The log format of the ``ms-recover`` commands (the manager's and the agent's logs).

``MS_RECOVER_LOG_FORMAT`` is ``text`` (the default: ``time LEVEL logger: message``) or ``json``:
one JSON object per line with ``ts`` (epoch seconds), ``time`` (ISO 8601, UTC), ``level``,
``logger``, ``message``, ``pid``, and ``exc`` (the traceback) when there is one, for log
pipelines that parse lines instead of reading them.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping

from ms_recover.errors import ConfigError

LOG_FORMAT = "MS_RECOVER_LOG_FORMAT"
FORMATS = ("text", "json")
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 6),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def format_from_env(environ: Mapping[str, str]) -> str:
    """The format ``MS_RECOVER_LOG_FORMAT`` names (``text`` when unset)."""
    raw = environ.get(LOG_FORMAT, "").strip().lower() or "text"
    if raw not in FORMATS:
        raise ConfigError(f"{LOG_FORMAT}={raw[:32]!r} is not one of: {', '.join(FORMATS)}")
    return raw


def setup(level: int, fmt: str) -> None:
    """Configure the root logger once, as ``logging.basicConfig`` does, in format ``fmt``."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT))
    logging.basicConfig(level=level, handlers=[handler])
