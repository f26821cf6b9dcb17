"""Ask a running manager for the job's members, steps, epoch, state and last recovery.

The flags fall back to the environment (MS_SCHED_HOST, MS_RECOVER_PORT, MINDX_TASK_ID and the
secret), then to the defaults. Exit code 0 on an answer, 1 when no manager answered in time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import zmq

from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError
from ms_recover.inputs import seconds_arg
from ms_recover.protocol import messages as M
from ms_recover.protocol.transport import manager_channel

MAX_WAIT_S = 3600.0


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", help="manager host (env MS_SCHED_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, help="manager port (env MS_RECOVER_PORT, default 9601)")
    p.add_argument("--job-id", help="job id (env MINDX_TASK_ID)")
    p.add_argument(
        "--timeout",
        type=seconds_arg(high=MAX_WAIT_S),
        default=3.0,
        help=f"seconds to wait, above 0 and at most {MAX_WAIT_S:g} (default 3)",
    )
    p.add_argument("--json", action="store_true", help="print the raw status as JSON")


def query(config: JobConfig, timeout_s: float) -> dict[str, Any] | None:
    """The manager's status snapshot, or None if it did not answer within ``timeout_s``."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    chan = manager_channel(ctx, config, "status", f"status.{os.getpid()}".encode())
    try:
        chan.send(M.StatusRequest(), 0)
        env = chan.recv(int(timeout_s * 1000))
        while env is not None and not isinstance(env.msg, M.StatusReply):
            env = chan.recv(int(timeout_s * 1000))
        return env.msg.status if env is not None and isinstance(env.msg, M.StatusReply) else None
    finally:
        chan.close()
        ctx.term()


INSECURE_HINT = (
    "no job secret; anyone who can reach the manager's port can drive this job "
    "(set MS_RECOVER_SECRET or MS_RECOVER_SECRET_FILE)"
)


def render(status: dict[str, Any]) -> str:
    lines = [
        f"job {status['job_id']}: {status['state']}, epoch {status['epoch']}, "
        f"world {status['world_size']}, strategy {status['strategies']}, "
        f"recoveries {status['recoveries']}"
    ]
    if status.get("insecure"):
        lines.append(f"  INSECURE: {INSECURE_HINT}")
    for a in status["agents"]:
        lines.append(
            f"  node {a['node_rank']}: agent {'up' if a['alive'] else 'DOWN'} "
            f"pid={a['pid']} ip={a['pod_ip'] or '-'}{' (scheduler)' if a['is_scheduler'] else ''}"
        )
    for r in status["ranks"]:
        state = "done" if r["done"] else ("up" if r["alive"] else "DOWN")
        lines.append(
            f"    rank {r['rank']:>3} node {r['node_rank']}: {state:<4} step {r['step']:>6} "
            f"pid={r['pid']} incarnation={r['incarnation']}"
        )
    flagged = status.get("flagged") or {}
    if flagged:
        ranks = ", ".join(f"rank {r} at step {step}" for r, step in flagged.items())
        lines.append(f"flagged slow: {ranks}")
    last = status.get("last_recovery")
    if last:
        phases = ", ".join(f"{k} {v:.3f}s" for k, v in last["phases"].items())
        lines.append(
            f"last recovery: {last['strategy']} ok={last['ok']} mttr {last['mttr_s']:.3f}s "
            f"lost_steps {last['lost_steps']} ({phases})"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    config = JobConfig.from_env(manager_host=args.host, manager_port=args.port, job_id=args.job_id)
    try:
        status = query(config, args.timeout)
    except zmq.ZMQError as exc:
        raise ConfigError(f"cannot reach {config.manager_endpoint}: {exc.strerror}") from exc
    if status is None:
        print(
            f"ms-recover status: no manager answered at {config.manager_endpoint} within "
            f"{args.timeout:g}s (check --host/--port, MINDX_TASK_ID and the secret)",
            file=sys.stderr,
        )
        return 1
    print(json.dumps(status, indent=2, sort_keys=True) if args.json else render(status))
    return 0
