"""What is left of a launcher's children when it leaves (Linux ``/proc``).

msrun starts the MindSpore scheduler process as its own child and never waits for it once a
``taskd`` agent has taken over. Before the agent ends msrun's process, :func:`settle` lets
those children finish (the scheduler may host the manager until the job ends), then ends and
reaps whatever is left, so no process outlives its pod's launcher.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def of(ppid: int) -> list[int]:
    """Pids of the live (non-zombie) children of ``ppid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 1 and fields[1] == str(ppid) and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def settle(ppid: int, ok: bool, wait_s: float, grace_s: float = 2.0) -> list[int]:
    """Wait for ``ppid``'s children (up to ``wait_s`` when ``ok``, else ``grace_s``), then
    SIGTERM, and SIGKILL after ``grace_s``, what is left; reap. Returns the pids it ended."""
    _wait_until_gone(ppid, wait_s if ok else grace_s)
    left = of(ppid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if not _wait_until_gone(ppid, grace_s):
            continue
        break
    _reap()
    return left


def _wait_until_gone(ppid: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        _reap()
        if not of(ppid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def _reap() -> None:
    """Collect every exited child of this process (they would stay zombies otherwise)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
