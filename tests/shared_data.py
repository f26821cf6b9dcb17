"""The project's shared reference data, found relative to the repository.

The data sits beside the repository (``../shared/data`` from the repository root), never at an
absolute path of one machine. In a user's clone it is usually absent: the tests that need it
skip with that reason. Under ``CI=true`` (CI sets it) a missing file fails the test instead, so
that CI cannot pass by skipping.
"""

from __future__ import annotations

import os
import pathlib

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


def shared_data(*parts: str) -> pathlib.Path:
    """The path of ``../shared/data/<parts>``; skip (fail under CI=true) when it is absent."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        reason = f"shared reference data {path} is absent (../shared/data/ beside the repository)"
        if in_ci():
            pytest.fail(f"{reason}; CI=true requires it")
        pytest.skip(reason)
    return path
