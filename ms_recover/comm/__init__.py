"""Communicators: the CommBackend interface, the group log, and the host / Ascend backends.

The names below load on first use, so that the manager's pure model (which needs only the
group log) does not import numpy through the backend interface.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ms_recover.comm.base import CommBackend, ReduceOp
    from ms_recover.comm.grouplog import GroupLog

__all__ = ["CommBackend", "GroupLog", "ReduceOp"]

_HOMES = {
    "CommBackend": "ms_recover.comm.base",
    "ReduceOp": "ms_recover.comm.base",
    "GroupLog": "ms_recover.comm.grouplog",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
