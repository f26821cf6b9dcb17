"""Helpers only the repository's tests use (not shipped in the wheel).

A process a test starts runs a module of this kit with ``python -m tests.kit.NAME``; it finds
``tests`` through :func:`pythonpath`, whatever the working directory.
"""

from __future__ import annotations

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def pythonpath(*first: str) -> str:
    """A ``PYTHONPATH`` value: ``first`` (e.g. the shim directory), then the repository root."""
    return os.pathsep.join([*(p for p in first if p), str(ROOT)])
