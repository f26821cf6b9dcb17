"""The spare's side of a pre-warmed spare rank (:mod:`ms_recover.agent.spares`).

A spare runs the training script up to ``ms_recover.init()``, runs the program's ``warm_up``
there (its step graphs compile while nothing waits for them), loads the modules a rank needs
once it has an identity, then blocks reading the pipe the agent passed in
``MS_RECOVER_SPARE_FD``, until the agent writes a rank's environment (take that rank) or closes
the pipe empty (exit unused). Once the rank committed its first step, :func:`settled` tells the
agent (a byte on ``MS_RECOVER_SPARE_SETTLED_FD``), which then starts the next spare.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import time
from collections.abc import Callable

from ms_recover.env import SPARE_FD, SPARE_SETTLED_FD

log = logging.getLogger("ms_recover.worker")

#: Imported before the wait: what a rank needs once it knows who it is (the data plane).
_PRELOAD = ("ms_recover.comm.host", "ms_recover.comm.hostauth")

_settled_fd: list[int] = []  # this process's settle pipe while it is an unsettled spare


def await_assignment(warm_up: Callable[[], object] | None = None) -> bool:
    """In a spare process: warm up, then block until the agent assigns a rank, and adopt its
    environment.

    Returns False (the caller should exit) when the agent released the spare unused; True
    right away in an ordinary rank process (``warm_up`` is not called there: its first step
    warms up anyway).
    """
    fd = os.environ.pop(SPARE_FD, "")
    settled = os.environ.pop(SPARE_SETTLED_FD, "")
    if not fd:
        return True
    adopt_settle_pipe(settled)
    started = time.monotonic()
    if warm_up is not None:
        warm_up()
    for name in _PRELOAD:
        importlib.import_module(name)
    log.info("spare %d ready in %.2fs; waiting for a rank", os.getpid(), time.monotonic() - started)
    env = read_assignment(int(fd))
    if env is None:
        return False
    os.environ.update(env)
    return True


def read_assignment(fd: int) -> dict[str, str] | None:
    """Block until the agent writes a rank's environment to ``fd`` and closes it; None if it
    closed the pipe with nothing written (released unused)."""
    chunks = []
    with os.fdopen(fd, "rb") as pipe:
        for chunk in iter(lambda: pipe.read(65536), b""):
            chunks.append(chunk)
    if not chunks:
        return None
    env = json.loads(b"".join(chunks))
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ValueError("the agent's assignment is not a JSON object of strings")
    return env


def adopt_settle_pipe(fd: str) -> None:
    """Make :func:`settled` write to ``fd`` (a standby that took a rank: its program's session
    reports the first commit as a spare's would)."""
    if fd:
        _settled_fd.append(int(fd))


def settled() -> None:
    """Tell the agent this former spare committed its first step (once; a no-op otherwise)."""
    while _settled_fd:
        fd = _settled_fd.pop()
        with contextlib.suppress(OSError):
            os.write(fd, b"\0")
        with contextlib.suppress(OSError):
            os.close(fd)
