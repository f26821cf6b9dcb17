"""Waiting on a condition with a deadline: the only way tests and the demo wait."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Timeout(AssertionError):
    pass


def wait_for(cond: Callable[[], T], timeout_s: float, what: str, poll_s: float = 0.02) -> T:
    """Return ``cond()``'s first truthy value; raise Timeout naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise Timeout(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(poll_s)
