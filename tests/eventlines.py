"""Event lines for tests: a typed record of any kind, with only the fields a test cares about.

:func:`line` builds the record of kind ``event`` from ``fields``, gives every other required
field a zero of its type (0, 0.0, "", False, [], {}, or None where None is allowed), and encodes
it as the manager writes it, so that a test's log always follows the schema.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from ms_recover.observability.schema import RECORDS, SCHEMA_VERSION, EventLine, Record, encode

_ZERO: dict[Any, Any] = {
    int: 0,
    float: 0.0,
    str: "",
    bool: False,
    list: [],
    dict: {},
    types.UnionType: None,
}


def record(event: str, /, **fields: Any) -> Record:
    """The record of kind ``event`` with ``fields``, other required fields zero."""
    cls = RECORDS[event]
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.default is dataclasses.MISSING and f.name not in fields:
            hint = hints[f.name]
            fields[f.name] = _ZERO[typing.get_origin(hint) or hint]
    return cls(**fields)


def line(ts: float, event: str, epoch: int | None = None, /, **fields: Any) -> dict[str, Any]:
    """An encoded event line (a dict as the log keeps it) of kind ``event`` at ``ts``, of the
    job "job"."""
    return encode(EventLine(ts, record(event, **fields), "job", SCHEMA_VERSION, epoch))
