"""Ask a running manager for the job's state: a summary by default (world, alive, step range,
state, epoch, last recovery, last fault with its host and traceback, flagged ranks, insecure),
one line per rank with ``--ranks``, again and again with ``--watch``.

The flags fall back to the environment (MS_SCHED_HOST, MS_RECOVER_PORT, MINDX_TASK_ID and the
secret), then to the defaults. Exit code 0 on an answer, 1 when no manager answered in time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import zmq

from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError
from ms_recover.inputs import seconds_arg
from ms_recover.observability.report import tail_lines
from ms_recover.observability.safetext import safe
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
    p.add_argument("--ranks", action="store_true", help="also print one line per node and rank")
    p.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=seconds_arg(high=MAX_WAIT_S),
        metavar="SECONDS",
        help="print the status again every SECONDS (default 2) until interrupted",
    )


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


MAX_FLAGGED_SHOWN = 10


def render(status: dict[str, Any], ranks: bool = False) -> str:
    """The summary; with ``ranks``, one line per node agent and per rank as well. Text that
    came from the ranks (hosts, reasons, tracebacks) is escaped."""
    lines = [
        f"job {safe(str(status['job_id']))}: {status['state']}, epoch {status['epoch']}, "
        f"strategy {status['strategies']}, recoveries {status['recoveries']}",
        "  " + _ranks_line(status["ranks"], status["world_size"]),
    ]
    agents = status["agents"]
    lines.append(f"  nodes: {sum(a['alive'] for a in agents)} of {len(agents)} agents up")
    lines += _spare_lines(status.get("spares") or [])
    if status.get("insecure"):
        lines.append(f"  INSECURE: {INSECURE_HINT}")
    last = status.get("last_recovery")
    if last:
        phases = ", ".join(f"{safe(k)} {v:.3f}s" for k, v in last["phases"].items())
        lines.append(
            f"  last recovery: {safe(last['strategy'])} {'ok' if last['ok'] else 'FAILED'}, mttr "
            f"{last['mttr_s']:.3f}s, lost steps {last['lost_steps']} ({phases})"
        )
    lines += _fault_lines(status.get("last_faults") or [])
    lines += _flagged_lines(status.get("flagged") or [])
    lines += _hot_switch_lines(status)
    if ranks:
        lines += _member_lines(status)
    return "\n".join(lines)


def _spare_lines(spares: list[dict[str, Any]]) -> list[str]:
    """Spare nodes waiting to take a lost node's place (``ms-recover agent --spare``)."""
    if not spares:
        return []
    shown = ", ".join(
        f"pid {s.get('pid')} on {safe(str(s.get('pod_ip') or '-'))} ({s.get('warm')} warm, "
        f"{s.get('waiting_s')}s)"
        for s in spares
    )
    return [f"  spare nodes: {len(spares)}: {shown}"]


def _ranks_line(ranks: list[dict[str, Any]], world: int) -> str:
    registered = [r for r in ranks if r["silent_s"] is not None or r["step"] >= 0]
    steps = [r["step"] for r in ranks if r["step"] >= 0]
    span = f"steps {min(steps)}..{max(steps)}" if steps else "no step committed yet"
    return (
        f"ranks: world {world}, alive {sum(r['alive'] for r in ranks)}, "
        f"done {sum(r['done'] for r in ranks)}, not registered {len(ranks) - len(registered)}; "
        f"{span}"
    )


def _fault_lines(faults: list[dict[str, Any]]) -> list[str]:
    if not faults:
        return []
    f = faults[-1]
    where = f" on {safe(str(f['host']))}" if f.get("host") else ""
    how = ""
    if f.get("signal"):
        how = f", signal {f['signal']}"
    elif f.get("exit_code") is not None:
        how = f", exit code {f['exit_code']}"
    lines = [
        f"  last fault ({len(faults)} shown of the latest): {f.get('kind')} rank {f.get('rank')} "
        f"node {f.get('node_rank')}{where}{how}: {safe(str(f.get('detail', '')))}"
    ]
    if f.get("log_tail"):
        lines.append(tail_lines(f["log_tail"], " " * 4 + "| ").rstrip("\n"))
    return lines


def _flagged_lines(flagged: list[dict[str, Any]]) -> list[str]:
    if not flagged:
        return []
    shown = [
        f"rank {f.get('rank')} (node {f.get('node')}, {safe(str(f.get('host', '?')))}, "
        f"step {f.get('step')}): {safe(str(f.get('reason', '')))}"
        for f in flagged[:MAX_FLAGGED_SHOWN]
    ]
    more = (
        f"; and {len(flagged) - MAX_FLAGGED_SHOWN} more" if len(flagged) > MAX_FLAGGED_SHOWN else ""
    )
    return [f"  flagged: {len(flagged)} rank(s): " + "; ".join(shown) + more]


def _hot_switch_lines(status: dict[str, Any]) -> list[str]:
    """The sub-health policy once something is flagged, and each hot switch under way."""
    lines = []
    if status.get("flagged") and status.get("sub_healthy"):
        lines.append(
            f"  sub-health policy (subHealthyStrategy): {safe(str(status['sub_healthy']))}"
        )
    for s in status.get("hot_switch") or []:
        pod = "its new pod is up, swapping" if s.get("pod_up") else "waiting for its new pod"
        lines.append(f"  hot switch: node {s.get('node')} {pod} ({s.get('waiting_s')}s)")
    return lines


def _member_lines(status: dict[str, Any]) -> list[str]:
    lines = []
    for a in status["agents"]:
        lines.append(
            f"  node {a['node_rank']}: agent {'up' if a['alive'] else 'DOWN'} "
            f"pid={a['pid']} ip={safe(a['pod_ip'] or '-')}"
            f"{' (scheduler)' if a['is_scheduler'] else ''}"
        )
    for r in status["ranks"]:
        if r["silent_s"] is None and r["step"] < 0:
            lines.append(f"    rank {r['rank']:>3} node {r['node_rank']}: not registered")
            continue
        state = "done" if r["done"] else ("up" if r["alive"] else "DOWN")
        lines.append(
            f"    rank {r['rank']:>3} node {r['node_rank']}: {state:<4} step {r['step']:>6} "
            f"pid={r['pid']} incarnation={r['incarnation']}"
        )
    return lines


def run(args: argparse.Namespace) -> int:
    config = JobConfig.from_env(manager_host=args.host, manager_port=args.port, job_id=args.job_id)
    if args.watch is None:
        return _once(config, args)
    try:
        while True:
            if sys.stdout.isatty():
                print("\x1b[H\x1b[2J", end="")  # clear the screen, as watch(1) does
            print(time.strftime("%Y-%m-%d %H:%M:%S"), f"(every {args.watch:g}s; Ctrl-C ends)")
            _once(config, args)
            sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


def _once(config: JobConfig, args: argparse.Namespace) -> int:
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
    print(json.dumps(status, indent=2, sort_keys=True) if args.json else render(status, args.ranks))
    return 0
