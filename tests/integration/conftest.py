"""Fixtures shared by the integration tier's modules."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A child process asleep for a minute, killed and reaped by PID afterwards."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()
