"""The spare's side of a pre-warmed spare rank (:mod:`ms_recover.agent.spares`).

A spare runs the training script up to ``ms_recover.init()``, runs the program's ``warm_up``
there (its step graphs compile while nothing waits for them), loads the modules a rank needs
once it has an identity, then blocks reading the pipe the agent passed in
``MS_RECOVER_SPARE_FD``, until the agent writes a rank's environment (take that rank) or closes
the pipe empty (exit unused). Once the rank committed its first step, :func:`settled` tells the
agent (a byte on ``MS_RECOVER_SPARE_SETTLED_FD``), which then starts the next spare.

The agent's default standby runs this way too (a *warm* standby) once a rank of the job showed
that its program passes ``warm_up`` (:func:`mark_warm_up`): it then takes a rank with nothing
left to compile. Its output goes to the rank's log from then on, as a bare standby's does.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable

from ms_recover.env import RANK_ID, SPARE_FD, SPARE_SETTLED_FD, STANDBY_LOG, WARM_UP_MARK

log = logging.getLogger("ms_recover.worker")

#: Imported before the wait: what a rank needs once it knows who it is (the data plane).
_PRELOAD = ("ms_recover.comm.host.backend", "ms_recover.comm.host.auth")

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
        if warm_up is not None:
            mark_warm_up()
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
    standby_log = env.pop(STANDBY_LOG, "")
    if standby_log:  # the agent's warm standby: say so in the rank's log, as a bare one does
        to_log(standby_log)
        print(
            f"ms_recover: standby {os.getpid()} runs rank {env.get(RANK_ID, '?')} (warm: its "
            f"warm_up ran before it waited, {time.monotonic() - started:.1f}s ago)",
            file=sys.stderr,
            flush=True,
        )
    os.environ.update(env)
    return True


def mark_warm_up() -> None:
    """Tell the agent this rank's program passes ``warm_up`` to ``init()`` (so it can be run up
    to there before it knows its rank): create the file it named in ``MS_RECOVER_WARM_UP_MARK``."""
    path = os.environ.get(WARM_UP_MARK, "")
    if path:
        with contextlib.suppress(OSError), open(path, "a"):
            pass


def to_log(path: str) -> None:
    """Send this process's stdout and stderr to the rank's log ``path`` (a standby that took a
    rank writes where a cold start would); nothing if ``path`` is empty."""
    if not path:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


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
