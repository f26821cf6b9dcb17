"""Run a local MindSpore training job, kill part of it, recover, and show the timeline.

The job is real: NODES x PROCS rank processes train a small MLP with MindSpore on the CPU
under one agent per node (or, with --launcher msrun, one real msrun per node whose agent is
ms_recover's taskd shim), a manager, and a local pod supervisor standing in for Kubernetes.
With either launcher the manager is a process of node 0's pod, as the scheduler pod's is
in Kubernetes, with a standby in node 1's (docs/manager-takeover.md): killing node 0 (under
msrun: node 0's msrun, its MindSpore scheduler process, taskd agent and ranks) loses the
manager too, the standby takes over, and the JSON reports ``manager_takeover_s``.
One rank (or a whole node) is killed with SIGKILL mid-run; the job recovers with the chosen
strategy and finishes. With --verify the same job also runs uninterrupted and the final
weights are compared by SHA-256. Under ``elastic-training`` the world shrinks and grows, so
the fault-free reference runs afterwards and replays the same world schedule
(:mod:`ms_recover.localrun.worlds`): the comparison stays bit for bit. Exit code 0 only when
the recovery succeeded (and, with --verify, the weights match).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import secrets
import sys
import tempfile
import time
from typing import Any

from ms_recover import inputs
from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError
from ms_recover.inputs import int_arg, seconds_arg
from ms_recover.localrun import worlds
from ms_recover.localrun.faults import Faults
from ms_recover.localrun.job import LocalJob, ManagerPodJob
from ms_recover.localrun.msrunjob import MsrunManagerPodJob
from ms_recover.localrun.slowpod import slow_rank_of_pod
from ms_recover.observability.events import Event
from ms_recover.observability.timeline import Timeline
from ms_recover.strategy import Strategy, format_strategies, parse_strategies
from ms_recover.subhealth import SubHealthy

MAX_DEMO_RANKS = 32
DEMO_HANG_TIMEOUT_S = 20.0  # --fault hang: see _validate
KILL_STEP = 15  # the fault's step by default
#: --fault hang's step by default: the adaptive hang rule needs its ranks' step times (5 steps
#: of compilation, then 20 timed: ms_recover.worker.health), else the fixed bound applies.
HANG_STEP = 30
MAX_STEPS = 1_000_000
#: --fault slow: steps at least (a new pod imports MindSpore while training goes on), and each
#: step's extra time as short sleeps (a stopped rank takes longer over them too).
SLOW_STEPS, SLOW_WORK = 600, ("--step-time", "0.05", "--slices", "25")
SLOW_TIMEOUT_S = 900.0  # --fault slow: each run is 600 steps of at least 50 ms
FAULTS = {
    "kill": "SIGKILL one rank after --kill-step",
    "node": "SIGKILL a whole node (its agent and ranks)",
    "hang": "one rank blocks in its own compute while its heartbeat goes on (a deadlocked data "
    f"loader; from step {HANG_STEP} by default, once step times are known): the adaptive hang "
    "rule names it within seconds",
    "transient": "a transient data-plane error in one rank's allreduce (the rank survives)",
    "memory": "corrupt one rank's state and report a device memory error",
    "bitflip": "flip one bit of one rank's state silently: found by comparing the replicas' "
    "digests (checked every 10 steps in the demo)",
    "allreduce": "SIGKILL one rank in the middle of its gradient allreduce",
    "slow": "from --kill-step, stop one rank a third of the time (a duty-cycled SIGSTOP owned "
    "by its pod): flagged fail-slow, then --sub-healthy-strategy acts (hotSwitch: a new pod, "
    f"swapped in; at least {SLOW_STEPS} steps are run)",
}
LAUNCHERS = {
    "agent": "one 'ms-recover agent' per node launches the ranks",
    "msrun": "one real msrun per node launches them, with ms_recover's taskd shim as its agent",
}


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=2, help="number of nodes (default 2)")
    p.add_argument("--procs-per-node", type=int, default=2, help="ranks per node (default 2)")
    p.add_argument(
        "--steps", type=int_arg(1, MAX_STEPS), default=40, help="training steps (default 40)"
    )
    p.add_argument(
        "--strategy",
        default="recover-in-place,recover,exit",
        help="recover-strategy comma list (default recover-in-place,recover,exit)",
    )
    p.add_argument(
        "--fault",
        choices=FAULTS,
        default=None,
        help="; ".join(f"{k}: {v}" for k, v in FAULTS.items())
        + " (default kill, or node with --kill-node)",
    )
    p.add_argument("--kill-rank", type=int, default=1, help="rank to fault (default 1)")
    p.add_argument(
        "--sub-healthy-strategy",
        choices=[s.value for s in SubHealthy],
        default=SubHealthy.HOT_SWITCH.value,
        help="--fault slow: what the flagged node meets (MindCluster's subHealthyStrategy; "
        "default %(default)s)",
    )
    p.add_argument(
        "--kill-step",
        type=int,
        default=None,
        help=f"step of the fault (default {KILL_STEP}; {HANG_STEP} for --fault hang)",
    )
    p.add_argument("--kill-node", type=int, default=None, help="kill this whole node instead")
    p.add_argument(
        "--verify",
        action="store_true",
        help="also run the job uninterrupted and compare final weights (SHA-256)",
    )
    p.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH")
    p.add_argument(
        "--spares",
        type=int,
        default=0,
        help="pre-warmed spare processes per node (MindSpore imported, step compiled) that "
        "replace "
        "a failed rank without a cold start (default 0)",
    )
    p.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default="agent",
        help="; ".join(f"{k}: {v}" for k, v in LAUNCHERS.items()) + " (default agent)",
    )
    p.add_argument("--workdir", help="where rank logs and outputs go (default: a temp dir)")
    p.add_argument(
        "--timeout",
        type=seconds_arg(high=86400.0),
        default=300.0,
        help="give up after this many seconds (default 300)",
    )


def _validate(args: argparse.Namespace) -> tuple[JobConfig, Faults]:
    if importlib.util.find_spec("mindspore") is None:
        raise ConfigError("the demo trains with MindSpore: pip install 'ms-recover[mindspore]'")
    for name in ("nodes", "procs_per_node", "steps"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
    world = args.nodes * args.procs_per_node
    if world < 2:
        raise ConfigError("recovery needs a healthy replica: use at least 2 ranks in total")
    if world > MAX_DEMO_RANKS:
        raise ConfigError(
            f"--nodes x --procs-per-node is {world}; the demo runs every rank on this machine "
            f"(~0.4 GB each): use at most {MAX_DEMO_RANKS} ranks in total"
        )
    _check_outputs(args.workdir, args.json)
    if args.spares < 0:
        raise ConfigError(f"--spares must be 0 or more, got {args.spares}")
    if args.launcher == "msrun" and args.spares:
        raise ConfigError("--spares needs --launcher agent: msrun starts its workers cold")
    fault = args.fault = args.fault or ("node" if args.kill_node is not None else "kill")
    if args.kill_step is None:
        args.kill_step = min(HANG_STEP, args.steps - 2) if fault == "hang" else KILL_STEP
    if not 0 <= args.kill_step < args.steps - 1:
        raise ConfigError(f"--kill-step must be in 0..{args.steps - 2} (before the last step)")
    if fault == "slow":
        faults = _slow(args)
    elif fault == "node":
        node = _node_to_kill(args)
        if not 0 <= node < args.nodes:
            raise ConfigError(f"--kill-node {node} is outside 0..{args.nodes - 1}")
        faults = Faults().node(rank=node * args.procs_per_node, step=args.kill_step)
    else:
        if not 0 <= args.kill_rank < world:
            raise ConfigError(f"--kill-rank {args.kill_rank} is outside 0..{world - 1}")
        kind = "computehang" if fault == "hang" else fault
        faults = Faults().add(kind, rank=args.kill_rank, step=args.kill_step)
    config = JobConfig(
        job_id=f"demo-{os.getpid()}",
        node_nums=args.nodes,
        proc_per_node=args.procs_per_node,
        strategies=parse_strategies(args.strategy),
        # A recreated pod's ranks import MindSpore before they register: on a busy 2-core
        # host that took over 60 s (measured 27 s to recreate the pod, then the imports).
        wait_reschedule_timeout_s=120.0,
        secret=secrets.token_hex(32).encode(),  # random per run: never the forgeable default
    )
    if fault == "hang":
        # Until step times are known (and a --kill-step before HANG_STEP), the fixed hang bound
        # applies: shorter than the default 120 s. It also bounds every resume (the first step
        # after the forming round and after a recovery, which compiles the step graph again):
        # 6 s was shorter than that compile on a busy host, and the job ended before the fault.
        config = config.replace(hang_timeout_s=DEMO_HANG_TIMEOUT_S)
    if fault == "bitflip":  # the default check every 100 steps would come after a short demo
        config = config.replace(digest_every_steps=10)
    return config, faults


def _slow(args: argparse.Namespace) -> Faults:
    """--fault slow: no in-process fault (the harness stops the rank from outside); the rank
    is moved off node 0 (it hosts the manager: it cannot move) and the run made long enough."""
    if args.launcher != "agent":
        raise ConfigError("--fault slow needs --launcher agent (its pods are started anew)")
    if args.kill_rank // args.procs_per_node == 0 and args.nodes > 1:
        args.kill_rank = (args.nodes - 1) * args.procs_per_node
    if not 0 <= args.kill_rank < args.nodes * args.procs_per_node:
        raise ConfigError(
            f"--kill-rank {args.kill_rank} is outside 0..{args.nodes * args.procs_per_node - 1}"
        )
    args.steps = max(args.steps, SLOW_STEPS)
    args.timeout = max(args.timeout, SLOW_TIMEOUT_S)
    return Faults()


def _faulty(config: JobConfig, args: argparse.Namespace) -> JobConfig:
    """The faulty run's config; with --fault slow, its sub-health policy (the reference run
    keeps ``ignore``: on a loaded host a CPU-bound rank can look slow, and the reference must
    run untouched)."""
    faulty = config.replace(job_id=config.job_id + "-f")
    if args.fault == "slow":
        faulty = faulty.replace(sub_healthy=SubHealthy(args.sub_healthy_strategy))
    return faulty


def _chaos(args: argparse.Namespace) -> Any:
    """The outside fault of --fault slow for a job, or None."""
    if args.fault != "slow":
        return None
    rank, node = args.kill_rank, args.kill_rank // args.procs_per_node
    return lambda job: slow_rank_of_pod(job, node, rank, args.kill_step)


def _node_to_kill(args: argparse.Namespace) -> int:
    """``--kill-node``, else the node of ``--kill-rank``."""
    if args.kill_node is not None:
        return int(args.kill_node)
    return int(args.kill_rank // args.procs_per_node)


def _check_outputs(workdir: str | None, json_path: str | None) -> None:
    """Fail before training, not after it, when the results could not be written."""
    if workdir:
        inputs.check_output_dir("--workdir", workdir)
    if json_path:
        inputs.check_output_file("--json", json_path)


def _run_job(
    config: JobConfig,
    steps: int,
    out: str,
    faults: Faults | None,
    timeout: float,
    on_event: Any = None,
    spares: int = 0,
    launcher: str = "agent",
    env: dict[str, str] | None = None,
    chaos: Any = None,
) -> tuple[LocalJob, list[dict[str, Any]]]:
    command = [
        sys.executable,
        "-m",
        "ms_recover.mindspore.programs.demo_train",
        "--steps",
        str(steps),
        "--out",
        out,
        *(SLOW_WORK if chaos is not None else ()),
    ]
    env = {**(faults.to_env() if faults else {}), **(env or {})}
    logs = os.path.join(out, "logs")
    job = (
        MsrunManagerPodJob(config, command, env, logs, on_event=on_event)
        if launcher == "msrun"
        else ManagerPodJob(config, command, env, logs, on_event=on_event, spares=spares)
    )
    with job, chaos(job) if chaos is not None else contextlib.nullcontext():
        _supervise(job, timeout, out)
    return job, _results(out, config.world_size)


#: Say what the job is waiting for when nothing was printed for this long.
QUIET_S = 5.0


def _supervise(job: LocalJob, timeout: float, out: str) -> None:
    """Wait for the job's end; every :data:`QUIET_S` without an event, one line saying what
    it waits for. ConfigError naming the logs at ``timeout``."""
    deadline = time.monotonic() + timeout
    seen, quiet_since = 0, time.monotonic()
    while not job.wait(min(QUIET_S, max(0.0, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            raise ConfigError(f"the job did not finish within {timeout:g}s; logs in {out}/logs")
        events = job.events.recent()
        if len(events) != seen:
            seen, quiet_since = len(events), time.monotonic()
            continue
        print(f"  ... {_waiting_for(events)} ({time.monotonic() - quiet_since:.0f}s)", flush=True)


def _waiting_for(events: list[Event]) -> str:
    """What a job whose last events are ``events`` is waiting for, in a few words."""
    kinds = [e["event"] for e in events]
    if "job_start" not in kinds:
        return "ranks starting: importing MindSpore and registering"
    last = {kind: i for i, kind in enumerate(kinds)}
    if "job_end" in last:
        return "the job ended: ranks finishing (final save), pods exiting"
    if last.get("fault", -1) > last.get("recovery", -1):
        return "recovering: replacement ranks starting (MindSpore import), then repair"
    return "training"


def _results(out: str, world: int) -> list[dict[str, Any]]:
    found = []
    for rank in range(world):
        path = os.path.join(out, f"rank_{rank}.json")
        if os.path.exists(path):
            with open(path) as fh:
                found.append(json.load(fh))
    return found


def _weights(results: list[dict[str, Any]]) -> str | None:
    """The final weights' SHA-256 if every rank that finished holds the same weights."""
    shas = {r["sha256"] for r in results}
    return shas.pop() if len(shas) == 1 else None


def run(args: argparse.Namespace) -> int:
    config, faults = _validate(args)
    if not args.verbose:  # the timeline tells the story; the manager's own log is for -v
        logging.getLogger("ms_recover").setLevel(logging.WARNING)
    workdir = args.workdir or tempfile.mkdtemp(prefix="ms-recover-demo-")
    world = config.world_size
    print(
        f"ms-recover demo: {args.nodes} nodes x {args.procs_per_node} ranks of MindSpore CPU "
        f"training, {args.steps} steps, strategy {format_strategies(config.strategies)}, "
        f"launcher {args.launcher}"
    )
    rank = faults.specs[0].rank if faults.specs else args.kill_rank
    print(f"fault: {args.fault} (rank {rank}) after step {args.kill_step}; logs in {workdir}")
    print(f"each run starts {world} rank processes that import MindSpore first (~10-30 s)")
    result: dict[str, Any] = {}
    elastic = Strategy.ELASTIC_TRAINING in config.strategies
    if args.verify and not elastic:
        result.update(_reference(config, args, workdir, []))
    print("\nrun with fault injection:", flush=True)
    timeline = Timeline(sys.stdout)
    job, final = _run_job(
        _faulty(config, args),
        args.steps,
        os.path.join(workdir, "faulty"),
        faults,
        args.timeout,
        timeline.on_event,
        args.spares,
        args.launcher,
        chaos=_chaos(args),
    )
    result.update(_summarise(job.find("recovery"), final, world, job.exit_code))
    takeover = job.find("manager_takeover")
    if takeover:  # node 0 was lost with the manager: the standby's time to coordinate again
        result["manager_takeover_s"] = takeover[-1]["takeover_s"]
    if args.verify and elastic:
        result.update(_reference(config, args, workdir, _schedule(final)))
    if args.verify:
        result["weights_match"] = (
            result["reference_weights_sha256"] is not None
            and result["reference_weights_sha256"] == result["final_weights_sha256"]
        )
    print("\n" + _verdict(result))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2, sort_keys=True)
    ok = result["recovered"] and result.get("weights_match", True)
    return 0 if ok else 1


def _reference(
    config: JobConfig, args: argparse.Namespace, workdir: str, schedule: worlds.Schedule
) -> dict[str, Any]:
    """Run the job uninterrupted (replaying ``schedule``, if any); its weights' SHA-256."""
    t0 = time.time()
    what = "no fault"
    if len(schedule) > 1:
        what += ", the same worlds: " + "; ".join(
            f"ranks {ranks} from step {step}" for step, ranks in schedule
        )
    print(f"\nreference run ({what}) ...", flush=True)
    env = {worlds.ENV: worlds.encode(schedule)} if schedule else None
    out = os.path.join(workdir, "reference")
    _, ref = _run_job(config, args.steps, out, None, args.timeout, launcher=args.launcher, env=env)
    print(f"reference run finished in {time.time() - t0:.1f}s")
    return {"reference_weights_sha256": _weights(ref), "world_schedule": schedule}


def _schedule(final: list[dict[str, Any]]) -> worlds.Schedule:
    """The world schedule of a run, from a rank that trained from step 0 to the end."""
    for record in final:
        history = [(int(step), [int(r) for r in ranks]) for step, ranks in record["worlds"]]
        if history and history[0][0] == 0:
            return history
    return []


def _summarise(
    recoveries: list[Event], final: list[dict[str, Any]], world: int, exit_code: int | None
) -> dict[str, Any]:
    good = [r for r in recoveries if r["ok"]]
    last = good[-1] if good else (recoveries[-1] if recoveries else None)
    return {
        "recovered": bool(good) and exit_code == 0 and _weights(final) is not None,
        "ranks_finished": len(final),
        "strategy_used": last["strategy"] if last else None,
        "lost_steps": last["lost_steps"] if good and last else None,
        "mttr_s": last["mttr_s"] if last else None,
        "phases": last["phases"] if last else {},
        "recoveries": len(good),
        "final_weights_sha256": _weights(final),
        "job_exit_code": exit_code,
    }


def _verdict(result: dict[str, Any]) -> str:
    lines = ["result:"]
    if result["recovered"]:
        lines.append(
            f"  recovered with {result['strategy_used']} in {result['mttr_s']:.2f}s, "
            f"lost steps: {result['lost_steps']}"
        )
    else:
        lines.append("  NOT recovered")
    if "manager_takeover_s" in result:
        lines.append(
            f"  the standby manager took over; survivors coordinated again in "
            f"{result['manager_takeover_s']:.2f}s"
        )
    lines.append(f"  final weights sha256: {result['final_weights_sha256']}")
    if "weights_match" in result and result["final_weights_sha256"] is None:
        lines.append(
            f"  weights not compared: the run has no final weights "
            f"({result['ranks_finished']} ranks finished, job exit {result['job_exit_code']})"
        )
    elif "weights_match" in result:
        lines.append(f"  reference sha256:     {result['reference_weights_sha256']}")
        lines.append(
            "  weights match the uninterrupted run bit for bit"
            if result["weights_match"]
            else "  WEIGHTS DIFFER from the uninterrupted run"
        )
    return "\n".join(lines)
