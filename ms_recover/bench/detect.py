"""Fault detection latency (``ms-recover bench detect``): kill -9 to the manager's ``fault`` event.

A 2 nodes x 2 ranks :class:`~ms_recover.localrun.job.LocalJob` of the numpy trainer runs a
long job. The benchmark then, one at a time, and only once the job is back to running:

* SIGKILLs one rank process (by its pid, rotating over ranks 1, 2, 3, 0). The latency is the
  ``fault`` event's wall-clock ``ts`` minus the wall-clock time just before ``kill()``;
  docs/design.md §8 holds it to 200 ms (an agent polls its children every 20 ms);
* SIGKILLs node 1's whole process group (agent and both ranks, ``LocalPods.kill_node``), with
  the pod supervisor's reschedule delay longer than the loss timeout, so the loss is noticed
  by silence and not by the pod coming back. The latency is to the ``node_lost`` fault; the
  target is 3 s, and the configured silence (``heartbeat_s * liveness``, 2 s by default) is the
  floor. Each node kill costs about ``reschedule-delay`` + a recovery, so at most 5 are run
  (the supervisor's restart budget per pod).

Then the faults that do not crash, each in a job of its own (:mod:`ms_recover.bench.detectrows`):
a compute hang and a rank stopped by SIGSTOP (<= 2 x p99 step + 5 s), a fail-slow rank, by a
fault hook and by a duty-cycled SIGSTOP (<= 50 steps, and never a fault), a soak of fault-free
runs in parallel (0 false flags), and a hot switch's pause against a recover-in-place MTTR
(<= 1x).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from ms_recover.bench import detectrows
from ms_recover.bench.jobdriver import JobDriver
from ms_recover.bench.table import Measure, Report, summary
from ms_recover.config import JobConfig
from ms_recover.localrun.job import LocalJob
from ms_recover.strategy import parse_strategies

RANK_TARGET_MS = 200.0
NODE_TARGET_S = 3.0
MAX_NODE_KILLS = 5
LONG_RUN_STEPS = 10**9


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=5, help="rank kills (default 5)")
    p.add_argument(
        "--node-repeats",
        type=int,
        default=None,
        help=f"node kills (default: --repeats, at most {MAX_NODE_KILLS})",
    )
    p.add_argument(
        "--heartbeat",
        type=float,
        default=JobConfig.heartbeat_s,
        help="heartbeat interval in s; 4 missed = lost (default %(default)s)",
    )
    p.add_argument(
        "--reschedule-delay",
        type=float,
        default=4.0,
        help="seconds before a killed pod is recreated (default %(default)s)",
    )
    p.add_argument(
        "--soak",
        type=int,
        default=20,
        help="fault-free runs for the false-flag row (default %(default)s; 0: no fail-slow "
        "and hang rows)",
    )
    p.add_argument(
        "--soak-parallel",
        type=int,
        default=4,
        help="soak runs at a time, loading one another (default %(default)s)",
    )
    p.add_argument("--timeout", type=float, default=60.0, help="per-wait deadline in s")
    p.add_argument("--workdir", help="rank logs go here (default: a temp dir)")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON")


def run(args: argparse.Namespace) -> int:
    node_repeats = min(
        MAX_NODE_KILLS, args.repeats if args.node_repeats is None else args.node_repeats
    )
    if args.repeats < 1 or node_repeats < 0:
        print("ms-recover bench detect: --repeats must be >= 1", file=sys.stderr)
        return 2
    if args.soak < 0:
        print("ms-recover bench detect: --soak must be >= 0 (0: no soak)", file=sys.stderr)
        return 2
    workdir = args.workdir or tempfile.mkdtemp(prefix="ms-recover-bench-detect-")
    config = JobConfig(
        job_id=f"bench-detect-{os.getpid()}",
        node_nums=2,
        proc_per_node=2,
        heartbeat_s=args.heartbeat,
        phase_timeout_s=60.0,
        wait_reschedule_timeout_s=60.0,
        strategies=parse_strategies("recover-in-place,recover,exit"),
    )
    if args.reschedule_delay <= config.silence_s:
        print(
            f"ms-recover bench detect: --reschedule-delay must exceed the loss timeout "
            f"({config.silence_s:g}s) so the loss is detected before the pod returns",
            file=sys.stderr,
        )
        return 2
    command = [
        sys.executable,
        "-m",
        "ms_recover.localrun.numpy_trainer",
        "--steps",
        str(LONG_RUN_STEPS),
        "--out",
        os.path.join(workdir, "out"),
    ]
    job = LocalJob(
        config,
        command,
        {"OPENBLAS_NUM_THREADS": "1"},
        log_dir=os.path.join(workdir, "logs"),
        reschedule_delay_s=args.reschedule_delay,
    )
    with job:
        bench = _Bench(job, args.timeout)
        bench.until_running(min_step=3)
        rank_ms = [bench.kill_rank_latency((1, 2, 3, 0)[i % 4]) * 1e3 for i in range(args.repeats)]
        node_s = [bench.kill_node_latency(1) for _ in range(node_repeats)]
    report = _report(config, args, rank_ms, node_s, workdir)
    if args.soak > 0:  # what does not crash (ms_recover.bench.detectrows)
        measures, samples = detectrows.rows(
            workdir, args.soak, 6 * args.timeout, args.soak_parallel
        )
        report.add(*measures)
        report.samples["not_crashing"] = samples
    return report.emit(args.json)


class _Bench(JobDriver):
    """Kills one rank or node of the job, returns the detection latency, waits for recovery."""

    def _recovered(self, seen: int) -> None:
        self.new_event("recovery", seen, ok=True)
        self.until_running(min_step=2)

    def kill_rank_latency(self, rank: int) -> float:
        """SIGKILL one rank; seconds from the kill to its ``rank_exit`` fault event."""
        faults = self.count("fault", kind="rank_exit", rank=rank)
        recoveries = self.count("recovery", ok=True)
        t_kill = self.kill_rank(rank)
        fault = self.new_event("fault", faults, kind="rank_exit", rank=rank)
        self._recovered(recoveries)
        return float(fault["ts"]) - t_kill

    def kill_node_latency(self, node: int) -> float:
        """SIGKILL a node's process group; seconds from the kill to its ``node_lost`` event."""
        faults = self.count("fault", kind="node_lost", node_rank=node)
        recoveries = self.count("recovery", ok=True)
        t_kill = time.time()
        self.job.pods.kill_node(node)
        fault = self.new_event("fault", faults, kind="node_lost", node_rank=node)
        self._recovered(recoveries)
        return float(fault["ts"]) - t_kill


def _report(
    config: JobConfig,
    args: argparse.Namespace,
    rank_ms: list[float],
    node_s: list[float],
    workdir: str,
) -> Report:
    r, n = summary(rank_ms), summary(node_s)
    rep = Report(
        "detect",
        "ms-recover bench detect: kill -9 to the manager's fault event "
        f"(numpy trainer, 2 nodes x 2 ranks, heartbeat {config.heartbeat_s:g}s x "
        f"{config.liveness})",
    )
    rep.add(
        Measure(
            f"dead process, median of {r['n']}",
            r["median"],
            "ms",
            "<=",
            RANK_TARGET_MS,
            "SIGKILL of one rank -> 'fault' event (kind rank_exit)",
        ),
        Measure("dead process, max", r["max"], "ms", "<=", RANK_TARGET_MS),
    )
    if node_s:
        rep.add(
            Measure(
                f"lost node, median of {n['n']}",
                n["median"],
                "s",
                "<=",
                NODE_TARGET_S,
                "SIGKILL of node 1's process group -> 'fault' event (kind node_lost)",
            ),
            Measure("lost node, max", n["max"], "s", "<=", NODE_TARGET_S),
            Measure(
                "lost node, configured silence",
                config.silence_s,
                "s",
                note="heartbeat_s * liveness; a loss is declared that long after the "
                "node's last heartbeat, so between silence - the agent's heartbeat period "
                f"({config.agent_heartbeat_s:.3g} s) and silence after the kill (plus a tick)",
            ),
        )
    rep.settings = {
        "nodes": 2,
        "proc_per_node": 2,
        "heartbeat_s": config.heartbeat_s,
        "liveness": config.liveness,
        "silence_s": config.silence_s,
        "reschedule_delay_s": args.reschedule_delay,
        "repeats": args.repeats,
        "node_repeats": len(node_s),
        "workdir": workdir,
    }
    rep.samples = {
        "rank_kill_to_fault_ms": rank_ms,
        "node_kill_to_fault_s": node_s,
        "rank": r,
        "node": n,
    }
    rep.notes = [
        "Times are wall clock on one host: the 'fault' event's ts (manager) minus the "
        "time just before kill(); each kill waits for the previous recovery to finish.",
        "The trainer runs flat out on every core, so the agent and manager are "
        "scheduled under full load, as in training.",
    ]
    return rep
