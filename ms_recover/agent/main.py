"""Launch this node's ranks and keep them under the manager's control.

Usage: ms-recover agent [--node-rank K] [options] -- python train.py [args...]

Every option falls back to the MindCluster environment (MS_NODE_RANK, MS_LOCAL_WORKER,
MS_WORKER_NUM, MS_SCHED_HOST, POD_IP, MINDX_TASK_ID, MS_RECOVER_*) and then to defaults.
Exit codes: 0 when every local rank finished, 86 when the pod must be rescheduled (recover),
87 when the job gave up (exit), 88 after a dump, 143 when the job was asked to stop (every
node got SIGTERM) or when a SIGTERM's deadline passed, 2 on bad usage.

SIGTERM is a planned stop (a pod deletion or a node drain), not a crash: the agent tells the
manager, keeps its ranks running, and leaves when the manager says or at the deadline
(MS_RECOVER_TERMINATION_GRACE_S, the pod's terminationGracePeriodSeconds, less a margin).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import types

from ms_recover import env as E
from ms_recover.agent.agent import Agent
from ms_recover.agent.ranks import die_with_parent
from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError
from ms_recover.inputs import int_arg

#: Spare processes per node: each holds an imported framework (~0.4 GB with MindSpore).
MAX_SPARES = 64


def configure(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--node-rank", type=int, help="this node's rank (env MS_NODE_RANK)")
    p.add_argument(
        "--node-nums",
        type=int,
        help="number of nodes (env MS_RECOVER_NODE_NUMS, or MS_WORKER_NUM / MS_LOCAL_WORKER)",
    )
    p.add_argument("--proc-per-node", type=int, help="ranks per node (env MS_LOCAL_WORKER)")
    p.add_argument("--host", help="manager host (env MS_SCHED_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, help="manager port (env MS_RECOVER_PORT, default 9601)")
    p.add_argument("--job-id", help="job id (env MINDX_TASK_ID)")
    p.add_argument("--strategy", help="recover-strategy comma list (env MS_RECOVER_STRATEGY)")
    p.add_argument("--log-dir", default="", help="write each rank's output to DIR/rank_N.log")
    p.add_argument(
        "--spares",
        type=int_arg(0, MAX_SPARES),
        default=0,
        help="keep N pre-warmed spare processes (script run up to ms_recover.init, step "
        "compiled by its warm_up) "
        f"to replace failed ranks without a cold start (0..{MAX_SPARES}, default 0)",
    )
    p.add_argument(
        "--standby",
        choices=("on", "off"),
        help="keep one standby interpreter per node with MindSpore imported, started once the "
        "ranks train, to restart a failed rank without a cold start; when the ranks' program "
        "passes ms_recover.init(warm_up=...), the standby runs it up to there and compiles "
        f"its step too; ignored with --spares, and when the job's strategies never restart a "
        f"rank in place (neither recover-in-place nor elastic-training) (env {E.STANDBY}, "
        "default on)",
    )
    p.add_argument(
        "--spare",
        choices=("on", "off"),
        help="this pod is a spare node: it holds one pre-warmed process per local rank and no "
        "node rank, and takes a lost node's place when the manager gives it one (recover); its "
        f"node rank is ignored (env {E.SPARE}; default: on when the node rank is at or beyond "
        f"an explicit node count, --node-nums or {E.NODE_NUMS}: one extra replica; "
        "docs/design.md §1f)",
    )
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        help="the rank command after --, e.g. -- python train.py",
    )


def config_from_args(args: argparse.Namespace) -> JobConfig:
    """The agent's configuration; a spare node's (see :func:`is_spare`) has node rank 0 as a
    placeholder until the manager gives it a node."""
    spare = is_spare(args)
    return JobConfig.from_env(
        node_rank=0 if spare else args.node_rank,
        node_nums=args.node_nums,
        proc_per_node=args.proc_per_node,
        manager_host=args.host,
        manager_port=args.port,
        job_id=args.job_id,
        strategies=args.strategy,
    )


def is_spare(args: argparse.Namespace) -> bool:
    """``--spare``, else ``MS_RECOVER_SPARE``. Unset: a node rank (``--node-rank``, else
    ``MS_NODE_RANK``) at or beyond the job's node count given explicitly (``--node-nums`` or
    ``MS_RECOVER_NODE_NUMS``) makes a spare node: one extra Kubernetes replica
    (docs/deployment.md §4d). Without an explicit node count it stays an error."""
    flag = spare_on(getattr(args, "spare", None))
    if flag is not None:
        return flag
    if args.node_nums is None and not os.environ.get(E.NODE_NUMS, "").strip():
        return False
    raw = args.node_rank if args.node_rank is not None else os.environ.get(E.NODE_RANK, "")
    try:
        node_rank = int(raw)
    except ValueError:
        return False  # not given, or not a number: JobConfig says so
    nodes = JobConfig.from_env(
        node_rank=0, node_nums=args.node_nums, proc_per_node=args.proc_per_node
    )
    return node_rank >= nodes.node_nums


def _check_command(command: list[str]) -> None:
    """The rank command must be runnable: a missing program is a usage error, not a traceback
    from every rank start."""
    if shutil.which(command[0]) is None:
        where = "is not an executable file" if os.sep in command[0] else "is not found on PATH"
        raise ConfigError(f"rank command {command[0]!r} {where}; give e.g. -- python train.py")


def _check_log_dir(path: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"--log-dir {path!r} exists and is not a directory; give a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"--log-dir {path!r} cannot be created: {exc.strerror or exc}; give a directory"
        ) from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"--log-dir {path!r} is not writable; give a writable directory")


def run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("missing the rank command: ms-recover agent [options] -- python train.py")
    config = config_from_args(args)
    _check_command(command)
    if args.log_dir:
        _check_log_dir(args.log_dir)
    _die_with_launcher()
    agent = Agent(
        config,
        command,
        log_dir=args.log_dir,
        spares=args.spares,
        standby=standby_on(args.standby),
        spare=is_spare(args),
    )

    def on_term(signum: int, frame: types.FrameType | None) -> None:
        agent.leave("SIGTERM")

    signal.signal(signal.SIGTERM, on_term)
    return agent.run()


def standby_on(flag: str | None) -> bool:
    """``--standby``, else ``MS_RECOVER_STANDBY``, else on."""
    raw = flag if flag is not None else os.environ.get(E.STANDBY, "on").strip().lower()
    if raw not in _SWITCH:
        raise ConfigError(f"{E.STANDBY}={raw!r} is not valid; use on, off, 1 or 0")
    return _SWITCH[raw]


_SWITCH = {"on": True, "1": True, "off": False, "0": False}


def spare_on(flag: str | None) -> bool | None:
    """``--spare``, else ``MS_RECOVER_SPARE``; None when neither is given."""
    raw = flag if flag is not None else os.environ.get(E.SPARE, "").strip().lower()
    if not raw:
        return None
    if raw not in _SWITCH:
        raise ConfigError(f"{E.SPARE}={raw!r} is not valid; use on, off, 1 or 0")
    return _SWITCH[raw]


def _die_with_launcher() -> None:
    """Under LocalPods (``MS_RECOVER_DIE_WITH_PID`` set), make the kernel SIGKILL this agent
    when its launcher dies (at once if it is already gone); its ranks then die by their own
    PDEATHSIG. Kubernetes pods need none of this: the kubelet owns them."""
    raw = os.environ.get(E.DIE_WITH, "").strip()
    if not raw:
        return
    try:
        launcher = int(raw)
    except ValueError:
        raise ConfigError(f"{E.DIE_WITH}={raw!r} is not a process id") from None
    die_with_parent(launcher)
