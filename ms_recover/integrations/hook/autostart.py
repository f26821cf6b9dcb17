"""Opt-in autostart of the manager from the MindSpore scheduler process, with no script change.

``ms-recover hook install-pth`` puts ``ms_recover_autostart.pth`` into site-packages.
Python runs its one line at every interpreter start; the line itself checks the two environment
variables first, so this module is imported only in a process that has both
``MS_RECOVER_AUTOSTART=1`` and ``MS_ROLE=MS_SCHED`` (the operator sets ``MS_ROLE=MS_SCHED`` on
the Scheduler pod). There :func:`maybe_start` spawns ``ms-recover manager`` detached, unless
the pid file of the run directory names a live manager, and returns without waiting for it.

This module is deliberately tiny: it runs inside someone else's interpreter start-up.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

AUTOSTART = "MS_RECOVER_AUTOSTART"
ROLE = "MS_ROLE"
ROLE_SCHED = "MS_SCHED"


def enabled(environ: Mapping[str, str]) -> bool:
    """True only for ``MS_RECOVER_AUTOSTART=1`` together with ``MS_ROLE=MS_SCHED``."""
    return environ.get(AUTOSTART) == "1" and environ.get(ROLE) == ROLE_SCHED


def maybe_start(environ: Mapping[str, str] | None = None) -> bool:
    """Launch the manager if enabled and none runs yet; True when this call spawned it.

    Guarantees: costs two dictionary look-ups when not enabled; never raises (a failure is
    one line on stderr, the host process carries on); never waits for the manager's port;
    concurrent callers on one pod spawn at most one manager (file lock + pid file).
    """
    env = os.environ if environ is None else environ
    if not enabled(env):
        return False
    try:
        from ms_recover.integrations.hook import command as hooks

        pid, started = hooks.launch(env)
    except Exception as exc:  # noqa: BLE001 - must never break the host interpreter
        print(f"ms_recover autostart: warning: manager not started: {exc!r}", file=sys.stderr)
        return False
    if started:
        print(f"ms_recover autostart: started manager pid {pid}", file=sys.stderr)
    return started
