"""Communicators: the CommBackend interface, the group log, and the host / Ascend backends.

The group log is pure (the manager keeps one); ``CommBackend`` and ``ReduceOp`` load on first
use (PEP 562), so importing ``ms_recover.comm.grouplog`` does not import numpy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ms_recover.comm.grouplog import GroupLog

if TYPE_CHECKING:
    from ms_recover.comm.base import CommBackend, ReduceOp

__all__ = ["CommBackend", "GroupLog", "ReduceOp"]


def __getattr__(name: str) -> Any:
    if name not in ("CommBackend", "ReduceOp"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("ms_recover.comm.base"), name)
    globals()[name] = value
    return value
