"""A standby rank process: the rank's interpreter with MindSpore already imported.

``ms-recover agent`` keeps one per node (``--standby on``, the default; see
:mod:`ms_recover.agent.ranks`), started once the node's ranks are training, so its import never
competes with theirs. When a rank is restarted in place, the agent hands the standby that
rank's environment instead of starting a new interpreter: the replacement skips interpreter
start-up and ``import mindspore`` (1.5-2 s on a 2-core host, more on a cluster's shared file
system) and runs the rank command from its first line, exactly as a cold start would.

Unlike a pre-warmed spare (``--spares N``) it needs nothing from the training script (no
``ms_recover.init``), compiles nothing and opens no device: until it takes a rank it is an
idle interpreter (about 170 MiB private memory beyond what the ranks share with it). Once a
rank of the job showed that its program passes ``ms_recover.init(warm_up=...)``, the agent
starts the standby *warm* instead: the rank command itself, as a pre-warmed spare
(:mod:`ms_recover.worker.spare`), so it takes a rank with its step already compiled; it falls
back to this module if a warm one dies before it is ready (:mod:`ms_recover.agent.ranks`).

Run as ``python -m ms_recover.worker.standby SCRIPT ARGS...`` or ``... -m MODULE ARGS...``:
it imports :data:`PRELOAD` (or ``MS_RECOVER_STANDBY_PRELOAD``'s list: the agent asks only for
ms_recover's bootstrap when its ranks do not load MindSpore), blocks reading the assignment
pipe (the spare protocol, :func:`~ms_recover.worker.spare.read_assignment`), adopts the
environment, sends its output to the rank's log (``MS_RECOVER_STANDBY_LOG``) and runs the
command as ``python SCRIPT ARGS...`` (or ``python -m MODULE ARGS...``) would: ``__main__``,
``sys.argv`` and ``sys.path[0]`` set the same way. Released unused (the pipe closed empty), it
exits 0.
"""

from __future__ import annotations

import importlib
import logging
import os
import runpy
import sys
import time

from ms_recover import env as E
from ms_recover.worker import spare

log = logging.getLogger("ms_recover.worker")

#: Imported before the wait, each if installed: what a MindSpore rank imports first.
PRELOAD = ("mindspore", "mindspore.nn", "mindspore.train", "ms_recover.worker.bootstrap")


def command_ok(args: list[str]) -> bool:
    """Whether a standby can run ``python ARGS`` (a script, or ``-m MODULE``; no other
    interpreter options)."""
    if not args:
        return False
    if args[0] == "-m":
        return len(args) >= 2 and bool(args[1]) and not args[1].startswith("-")
    return not args[0].startswith("-")


def main(argv: list[str]) -> int:
    if not command_ok(argv):
        print(
            f"ms_recover.worker.standby: need SCRIPT [ARGS...] or -m MODULE [ARGS...], got {argv}",
            file=sys.stderr,
        )
        return 2
    fd = os.environ.pop(E.SPARE_FD, "")
    settled = os.environ.pop(E.SPARE_SETTLED_FD, "")
    if not fd:
        print(
            f"ms_recover.worker.standby: {E.SPARE_FD} is unset (the agent starts it)",
            file=sys.stderr,
        )
        return 2
    started = time.monotonic()
    preload = os.environ.pop(E.STANDBY_PRELOAD, "")
    for name in preload.split(",") if preload else PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            log.info("standby: %s not preloaded: %s", name, exc)
    ready = time.monotonic()
    env = spare.read_assignment(int(fd))
    if env is None:
        return 0  # released unused
    spare.to_log(env.pop(E.STANDBY_LOG, ""))
    print(
        f"ms_recover: standby {os.getpid()} runs rank {env.get(E.RANK_ID, '?')} (its imports "
        f"took {ready - started:.2f}s, {time.monotonic() - ready:.1f}s ago)",
        file=sys.stderr,
        flush=True,
    )
    os.environ.update(env)
    spare.adopt_settle_pipe(settled)
    _run(argv)
    return 0


def _run(argv: list[str]) -> None:
    """``python ARGV`` in this interpreter (raises the program's SystemExit, if any)."""
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]  # run_module sets argv[0] to the module's file
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    script = argv[0]
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
