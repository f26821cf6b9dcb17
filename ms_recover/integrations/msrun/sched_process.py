"""What ``ms_recover.init()`` does in a process that is not a training rank.

**The MindSpore scheduler process.** msrun runs the user's script once more on the scheduler's
node, with ``MS_ROLE=MS_SCHED`` and ``RANK_ID=0``. That process must never train as an extra
rank 0, so :func:`ms_recover.init` does not return there: it ends the process.

* With ``MS_RECOVER_AUTOSTART=1`` on the pod that hosts the manager (``POD_IP`` unset or equal
  to ``MS_SCHED_HOST``) and no manager running yet, the process *becomes* the manager: it serves
  until the job ends and exits with the job's exit code (0, or 87 when recovery gave up).
* Otherwise it exits 0 at once, having trained nothing.

A training script sees this as ``ms_recover.init()`` raising ``SystemExit`` (``finally`` blocks
and ``atexit`` handlers run; nothing after ``init()`` does).

**Workers under msrun.** msrun starts workers in their own session, so they would outlive a
killed msrun. When the taskd shim launched them (``MS_RECOVER_LAUNCHER_PID``),
:func:`bind_to_launcher` makes the kernel SIGKILL this process when msrun dies, as
``ms-recover agent`` does for its ranks.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Mapping
from typing import NoReturn

from ms_recover import env as E
from ms_recover import exitcodes

log = logging.getLogger("ms_recover.worker")

PR_SET_PDEATHSIG = 1


def hosts_manager(environ: Mapping[str, str]) -> tuple[bool, str]:
    """Whether this scheduler process should serve the manager, and why (in words)."""
    if environ.get(E.AUTOSTART) != "1":
        return False, f"{E.AUTOSTART} is not 1"
    host, pod_ip = environ.get(E.SCHED_HOST, ""), environ.get(E.POD_IP, "")
    if pod_ip and host and pod_ip != host:
        return False, f"{E.POD_IP}={pod_ip} != {E.SCHED_HOST}={host} (not the manager's pod)"
    from ms_recover.integrations.hook import command as hooks

    pid = hooks.read_pid(hooks.run_files(environ))
    if pid is not None and hooks.is_manager(pid):
        return False, f"a manager already runs as pid {pid}"
    return True, f"{E.AUTOSTART}=1 on the manager's pod"


def run_scheduler_role(environ: Mapping[str, str]) -> NoReturn:
    """Never train in the MindSpore scheduler process: serve the manager or exit 0."""
    bind_to_launcher(environ)
    serve, why = hosts_manager(environ)
    if not serve:
        print(
            f"ms_recover: MindSpore scheduler process ({E.ROLE}={E.ROLE_SCHED}) does not train "
            f"and hosts no manager ({why}): exiting 0",
            file=sys.stderr,
        )
        raise SystemExit(exitcodes.OK)
    from ms_recover.config import JobConfig
    from ms_recover.manager.main import hold_sigterm, serve_in_foreground
    from ms_recover.manager.server import ManagerServer

    hold_sigterm()
    config = JobConfig.from_env(environ)
    print(
        f"ms_recover: MindSpore scheduler process hosts the manager ({why}): {config.describe()}",
        file=sys.stderr,
    )
    raise SystemExit(serve_in_foreground(ManagerServer(config, bind=config.pod_ip)))


def bind_to_launcher(environ: Mapping[str, str]) -> None:
    """Die with msrun when the taskd shim launched this process (Linux; no-op elsewhere)."""
    raw = environ.get(E.LAUNCHER_PID, "").strip()
    if not raw.isdigit():
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(raw):  # msrun died before the line above took effect
        log.error("launcher pid %s is gone: this process ends too", raw)
        os._exit(exitcodes.FAILED)
