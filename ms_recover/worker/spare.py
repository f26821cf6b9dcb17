"""The spare's side of a pre-warmed spare rank (:mod:`ms_recover.agent.spares`).

A spare runs the training script up to ``ms_recover.init()``, then blocks here reading the pipe
the agent passed in ``MS_RECOVER_SPARE_FD``, until the agent writes a rank's environment (take
that rank) or closes the pipe empty (exit unused).
"""

from __future__ import annotations

import json
import os

from ms_recover.env import SPARE_FD


def await_assignment() -> bool:
    """In a spare process: block until the agent assigns a rank, and adopt its environment.

    Returns False (the caller should exit) when the agent released the spare unused; True
    right away in an ordinary rank process.
    """
    fd = os.environ.pop(SPARE_FD, "")
    if not fd:
        return True
    chunks = []
    with os.fdopen(int(fd), "rb") as pipe:
        for chunk in iter(lambda: pipe.read(65536), b""):
            chunks.append(chunk)
    if not chunks:
        return False
    os.environ.update(json.loads(b"".join(chunks)))
    return True
