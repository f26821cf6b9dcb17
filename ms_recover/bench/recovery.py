"""Recovery time against a job-level restart from a disk checkpoint (``ms-recover bench recovery``).

Both sides run the same real MindSpore job: :mod:`ms_recover.mindspore.programs.demo_train`'s
MLP, data and Adam step, 2 nodes x 2 ranks by default, under a LocalJob (manager, one agent per
node, the host data plane), on this host's CPU.

**recover-in-place.** Once training is warm, one rank is SIGKILLed (by pid; ranks 1, 2, 3, ...
in turn, each kill after the previous recovery finished). MTTR is the manager's ``recovery``
event's ``mttr_s``: from the agent seeing the process die to every rank having committed the
first step after the recovery; its phases are shown too. The agents run at their default:
each node keeps its standby, warm here (the demo passes ``init(warm_up=...)``, so the standby
runs it up to ``init()`` and compiles its step there, :mod:`ms_recover.worker.spare`), and
before each kill the bench waits until every node's standby is ready, as a fault some seconds
into training finds it. docs/design.md §8: MTTR <= 0.3 s. What a waiting standby costs
(memory, CPU) is shown.

**Cold start** (``--standby off``). The same kills, each replacement a new interpreter that
imports MindSpore: the floor without a standby.

**With a pre-warmed spare** (``--spares N``, default 1; 0 skips it). The same kills on a job
whose agents each keep N spare processes waiting in ``ms_recover.init()`` (MindSpore imported,
model built, step graphs compiled by ``init(warm_up=...)``). Before each kill the bench waits
until every agent's spares are warm (blocked reading their assignment pipe, seen in ``/proc``),
so each kill is taken over by a warm spare. docs/design.md §8: <= 0.15 s, and below the cold floor
(the cold MTTR). Before the first kill it also measures what a waiting spare costs: its memory
(RSS and private) next to a training rank's, and its CPU over 2 s.

**Baseline: job-level restart from a disk checkpoint.** The same job, run by
:mod:`ms_recover.bench.ckpt_train`, where rank 0 saves the whole state (weights and Adam
moments) with ``mindspore.save_checkpoint`` every ``--ckpt-every`` steps. Once training is warm,
every process of the job is SIGKILLed (all pods' process groups), and a fresh job is started on
the same checkpoint directory. *Restart* is from the kill to the last rank committing its first
step: process start, MindSpore import, model build, ``mindspore.load_checkpoint``, rendezvous
and one step, all ranks at once. The work since the last checkpoint is lost too; for a fault
at a uniformly random time that is, on average, half a checkpoint interval of steps, at the
steady-state step time measured on the same job. So

    baseline = restart + (ckpt_every / 2) * step_time

The detection a job-level restart also needs is not added to it (this favours the baseline);
MTTR includes detection. The row's target, MTTR <= 25 % of this baseline, is the earlier one;
it stays as a reference row (a baseline of our own parts is not what docs/design.md §8 holds us to).

**Baseline: msrun's own restart** (:mod:`ms_recover.bench.msrunrestart`; ``--no-msrun-restart``
skips it, about 60 s a sample). Plain msrun, no ms_recover, the same model in MindSpore's own
data-parallel step with the same world: kill -9 of one worker until msrun exits, the relaunch
to every rank's first step, and half a checkpoint interval of recomputed steps. docs/design.md §8:
MTTR <= 5 % of it.
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from ms_recover import env as E
from ms_recover.bench import msrunrestart, recoveryreport, sparecost
from ms_recover.bench.jobdriver import JobDriver
from ms_recover.bench.recoveryreport import RESTART_PARTS
from ms_recover.config import JobConfig
from ms_recover.localrun.job import LocalJob
from ms_recover.localrun.msrunjob import MsrunJob
from ms_recover.strategy import parse_strategies

LONG_RUN_STEPS = 10**7


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=2, help="nodes (default 2)")
    p.add_argument("--procs-per-node", type=int, default=2, help="ranks per node (default 2)")
    p.add_argument("--repeats", type=int, default=3, help="kills on each side (default 3)")
    p.add_argument("--warm-steps", type=int, default=30, help="steps before the first kill")
    p.add_argument(
        "--ckpt-every",
        type=int,
        default=100,
        help="baseline checkpoint interval in steps (default %(default)s)",
    )
    p.add_argument(
        "--spares",
        type=int,
        default=1,
        help="also measure recover-in-place with this many pre-warmed spares per node "
        "(default %(default)s; 0 skips it)",
    )
    p.add_argument(
        "--msrun",
        action="store_true",
        help="also run the same kills on the job launched by real msrun (taskd shim) and show "
        "its MTTR next to ms-recover agent's",
    )
    p.add_argument(
        "--no-msrun-restart",
        dest="msrun_restart",
        action="store_false",
        help="skip the baseline of plain msrun restarting the whole job (about 60 s a sample)",
    )
    p.add_argument(
        "--msrun-restart-repeats",
        type=int,
        default=1,
        help="kills of the plain msrun job (default %(default)s)",
    )
    p.add_argument("--timeout", type=float, default=240.0, help="per-wait deadline in s")
    p.add_argument("--workdir", help="logs and checkpoints go here (default: a temp dir)")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON")


def run(args: argparse.Namespace) -> int:
    world = args.nodes * args.procs_per_node
    if (
        world < 2
        or args.repeats < 1
        or args.ckpt_every < 1
        or args.spares < 0
        or args.msrun_restart_repeats < 1
    ):
        print(
            "ms-recover bench recovery: needs at least 2 ranks, --repeats >= 1, "
            "--ckpt-every >= 1, --spares >= 0 and --msrun-restart-repeats >= 1",
            file=sys.stderr,
        )
        return 2
    workdir = args.workdir or tempfile.mkdtemp(prefix="ms-recover-bench-recovery-")
    config = JobConfig(
        job_id=f"bench-rec-{os.getpid()}",
        node_nums=args.nodes,
        proc_per_node=args.procs_per_node,
        phase_timeout_s=120.0,
        hang_timeout_s=300.0,
        strategies=parse_strategies("recover-in-place,exit"),
    )
    print(
        f"recovery: recover-in-place on a {args.nodes}x{args.procs_per_node} MindSpore job ...",
        flush=True,
    )
    inplace = _recover_in_place(config, args, os.path.join(workdir, "in-place"))
    print("recovery: recover-in-place, cold start (--standby off) ...", flush=True)
    cold = _recover_in_place(
        config.replace(job_id=config.job_id + "-cold"),
        args,
        os.path.join(workdir, "cold"),
        standby=False,
    )
    spare = None
    if args.spares:
        print(f"recovery: recover-in-place with {args.spares} pre-warmed spare(s) per node ...")
        spare = _recover_in_place(
            config.replace(job_id=config.job_id + "-spare"),
            args,
            os.path.join(workdir, "spare"),
            args.spares,
        )
    under_msrun = None
    if args.msrun:
        print("recovery: recover-in-place, the same job launched by msrun ...", flush=True)
        under_msrun = _recover_in_place(
            config.replace(job_id=config.job_id + "-msrun"),
            args,
            os.path.join(workdir, "msrun"),
            launcher="msrun",
        )
    print("recovery: baseline, job-level restarts from a checkpoint ...", flush=True)
    baseline = _restart_from_checkpoint(
        config.replace(job_id=config.job_id + "-ckpt"), args, os.path.join(workdir, "restart")
    )
    restart = None
    if args.msrun_restart:
        print("recovery: baseline, plain msrun restarting the whole job ...", flush=True)
        restart = _msrun_restart(args, world, os.path.join(workdir, "msrun-restart"))
    report = recoveryreport.report(args, inplace, cold, spare, baseline, workdir)
    if under_msrun is not None:
        recoveryreport.add_msrun(report, inplace, under_msrun)
    if restart is not None:
        report.add(*msrunrestart.rows(report.samples["mttr"]["median"], restart, args.ckpt_every))
        report.samples["msrun_restart"] = restart
    else:
        report.notes.append("msrun restart baseline skipped (--no-msrun-restart).")
    return report.emit(args.json)


def _msrun_restart(args: argparse.Namespace, world: int, out: str) -> dict[str, Any]:
    """Plain msrun's restart, or ``{"failed": reason}``: a baseline that could not be measured
    is reported as such, not as a crash of the whole bench."""
    restarts = msrunrestart.Restarts(
        world=world,
        ckpt_every=args.ckpt_every,
        warm_steps=args.warm_steps,
        timeout_s=args.timeout,
        workdir=out,
    )
    try:
        return restarts.measure(args.msrun_restart_repeats)
    except Exception as exc:  # noqa: BLE001 - reported in the table with its reason
        return {"failed": f"{type(exc).__name__}: {exc} (logs in {out})"}


# ----------------------------------------------------------------------------- recover-in-place
def _recover_in_place(
    config: JobConfig,
    args: argparse.Namespace,
    out: str,
    spares: int = 0,
    launcher: str = "agent",
    standby: bool = True,
) -> dict[str, Any]:
    """Kills under recover-in-place. ``ms-recover agent`` keeps its default standby unless
    ``standby`` is False (the cold start) or ``spares`` are asked for; each kill waits until
    every node's standby or spares are warm (blocked on their assignment pipe)."""
    command = [
        sys.executable,
        "-m",
        "ms_recover.mindspore.programs.demo_train",
        "--steps",
        str(LONG_RUN_STEPS),
        "--out",
        out,
    ]
    samples = []
    logs = os.path.join(out, "logs")
    job = (
        MsrunJob(config, command, {}, log_dir=logs)
        if launcher == "msrun"
        else LocalJob(config, command, {E.STANDBY: "on" if standby else "off"}, logs, spares=spares)
    )
    with job:
        d = JobDriver(job, args.timeout)
        d.until_running(args.warm_steps)
        want = config.node_nums * (spares or int(standby and launcher == "agent"))
        footprint = None
        if want:  # before the step time: a standby's import would share the cores with it
            d.wait(lambda: d.warm_spares() >= want, f"{want} warm spares or standbys")
            footprint = sparecost.footprint(d)
        step_s = d.step_time(3.0)
        for i in range(args.repeats):
            if want:
                d.wait(lambda: d.warm_spares() >= want, f"{want} warm spares or standbys")
            rank = 1 + i % (config.world_size - 1)
            seen = d.count("recovery")
            t_kill = d.kill_rank(rank)
            rec = d.new_event("recovery", seen)
            if not rec["ok"]:
                raise RuntimeError(f"recover-in-place failed: {rec['reason']}; logs in {out}")
            samples.append(
                {
                    "rank": rank,
                    "mttr_s": rec["mttr_s"],
                    "phases": rec["phases"],
                    "kill_to_event_s": rec["ts"] - t_kill,
                    "lost_steps": rec["lost_steps"],
                    "target_step": rec["target_step"],
                }
            )
            d.until_running(3)
    return {"step_s": step_s, "samples": samples, "footprint": footprint}


# ----------------------------------------------------------------------------- baseline
def _restart_from_checkpoint(
    config: JobConfig, args: argparse.Namespace, out: str
) -> dict[str, Any]:
    ckpt_dir = os.path.join(out, "ckpt")
    os.makedirs(ckpt_dir, exist_ok=True)

    def start(tag: int) -> tuple[LocalJob, str]:
        run_out = os.path.join(out, f"run{tag}")
        command = [
            sys.executable,
            "-m",
            "ms_recover.bench.ckpt_train",
            "--steps",
            str(LONG_RUN_STEPS),
            "--out",
            run_out,
            "--ckpt-dir",
            ckpt_dir,
            "--ckpt-every",
            str(args.ckpt_every),
        ]
        job = LocalJob(
            config.replace(job_id=f"{config.job_id}-{tag}"),
            command,
            {E.STANDBY: "off"},  # a job-level restart: no process of it is restarted alone
            log_dir=os.path.join(run_out, "logs"),
        )
        return job.start(), run_out

    job, _ = start(0)
    samples: list[dict[str, Any]] = []
    try:
        d = JobDriver(job, args.timeout)
        d.until_running(args.warm_steps)
        d.wait(lambda: os.path.exists(os.path.join(ckpt_dir, "latest.ckpt")), "a checkpoint")
        step_s = d.step_time(3.0)
        for i in range(args.repeats):
            killed_at = max(d.steps())
            t_kill = time.time()
            job.close()  # SIGKILL every pod's process group, reap them, stop the manager
            job, run_out = start(i + 1)
            d = JobDriver(job, args.timeout)
            timings = d.wait(
                functools.partial(_timings, run_out, config.world_size),
                "every rank's first step after the restart",
            )
            samples.append(_restart_sample(timings, t_kill, killed_at))
            d.until_running(3)
    finally:
        job.close()
    return {"step_s": step_s, "samples": samples}


def _timings(run_out: str, world: int) -> list[dict[str, Any]] | None:
    found = []
    for path in glob.glob(os.path.join(run_out, "timing_*.json")):
        with open(path) as fh:
            found.append(json.load(fh))
    return found if len({t["rank"] for t in found}) == world else None


def _restart_sample(timings: list[dict[str, Any]], t_kill: float, killed_at: int) -> dict[str, Any]:
    parts: dict[str, float] = {}
    for name, _, begin, end in RESTART_PARTS:
        parts[name] = statistics.median(
            t["times"][end] - (t_kill if begin is None else t["times"][begin]) for t in timings
        )
    loaded = timings[0]["loaded_step"]
    return {
        "restart_s": max(t["times"]["first_step"] for t in timings) - t_kill,
        "parts_median_over_ranks": parts,
        "killed_at_step": killed_at,
        "loaded_step": loaded,
        "lost_steps_this_time": killed_at - loaded,
    }
