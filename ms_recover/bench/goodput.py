"""Effective training time under a fault schedule, ms_recover against plain msrun
(``ms-recover bench goodput``).

The same MindSpore job, 2 nodes x 2 ranks of :mod:`ms_recover.mindspore.programs.demo_train`'s
MLP (its default step, ``DataParallelStep``; ``--graph-step``: GraphStep in GRAPH_MODE, whose
failed in-graph reduction MindSpore reports only after a fixed 3 s, and whose graph the
survivors compile again, so every recovery costs 3 s more plus a compile) on this host's
CPU, run side by side in one invocation, each arm for the same wall-clock budget
(``--budget-s``) counted from the moment every rank has taken its first step, and under the
same seeded fault schedule (:mod:`ms_recover.bench.goodputmodel`):

* **(c) no faults**: the job under ms_recover without a fault; its steps in the budget are the
  productive step rate. It runs once, first.
* **(a) ms_recover**: the job under a LocalJob (the manager, one ``ms-recover agent`` per node
  with its default standby, the default strategies), the faults injected at their times:
  a kill is a SIGKILL of the rank's process, a node loss a SIGKILL of the pod's process group,
  a hang a SIGSTOP of the rank,
  a transient error is raised in the rank's allreduce (``MS_RECOVER_FAULTS``, at the step the
  fault-free rate reaches at its time). A node loss never hits node 0 (MindSpore's scheduler and
  the manager: its loss is a manager takeover). A schedule that loses nodes runs with one
  spare node (``ms-recover agent --spare``, docs/design.md §1f), warm before the budget starts
  (on a cluster it warms on its own machine): the manager gives it the lost node's place, and
  the lost pod is recreated at once as the next spare (it warms on the same cores, as it would
  not on a cluster). A run that ends mid-recovery keeps the steps its ranks had committed when
  it last trained.
* **(b) plain msrun** (:mod:`ms_recover.bench.msrunrestart`): the same model in MindSpore's own
  data-parallel step over mccl, ``msrun`` with all 4 workers, rank 0 checkpointing every
  ``--ckpt-every`` steps, and msrun's own answer to a fault: it exits, and is started again on
  the last checkpoint. A kill, and a transient error (the worker's exception ends it with an
  error, which msrun handles as a dead worker), is a SIGKILL of the worker; a node loss the
  SIGKILL of both workers of that node (all on one host here: cheaper for msrun than a remote
  node's loss, which its scheduler notices only by a heartbeat timeout); a hang a SIGSTOP, which
  plain msrun cannot see: the other workers wait in the collective until its timeout (HCCL's
  default, 1800 s, beyond the budget), then the job fails back to its last checkpoint; so a
  hang counts as losing everything since the last checkpoint, as it would on a cluster.
  A fault due while msrun relaunches hits the job once it steps again.

ETTR of an arm = its committed-and-kept steps / (c)'s steps in the budget. (b)'s step differs
from ours (mccl in the graph against the host allreduce), so (b) is also shown against its
own fault-free rate (its steps before the first fault), and that figure is the one the ratio
(a) / (b) uses. The projection table is a model, not a measurement: see
:func:`ms_recover.bench.goodputmodel.projected_ettr_pct`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from ms_recover import env as E
from ms_recover.bench import goodputmodel as gm
from ms_recover.bench import msrunrestart
from ms_recover.bench.jobdriver import warm_spare_pids
from ms_recover.bench.table import Measure, Report
from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError
from ms_recover.localrun.faults import Faults
from ms_recover.localrun.job import LocalJob
from ms_recover.localrun.wait import wait_for
from ms_recover.observability.events import Event
from ms_recover.observability.goodput import ledger_from_events
from ms_recover.observability.schema import EventLine, SchemaError, decode

LONG_RUN_STEPS = 10**7
POLL_S = 0.05
TARGET_PCT = {"kills": 98.0, "nodes": 95.0, "mixed": 95.0}  # docs/design.md §8
DEFAULT_BUDGET_S = 120.0


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--budget-s",
        type=float,
        default=DEFAULT_BUDGET_S,
        help="wall-clock seconds each arm trains, from every rank's first step (default "
        "%(default)s: 7 runs fit well inside 25 minutes on a 2-core host)",
    )
    p.add_argument(
        "--schedule",
        choices=(*gm.SCHEDULES, "all"),
        default="all",
        help="the fault schedule to run (default: all three)",
    )
    p.add_argument("--seed", type=int, default=0, help="the schedules' seed (default 0)")
    p.add_argument(
        "--mean-s",
        type=float,
        default=gm.MEAN_S,
        help="mean seconds between faults (default %(default)s)",
    )
    p.add_argument("--nodes", type=int, default=2, help="nodes (default 2)")
    p.add_argument("--procs-per-node", type=int, default=2, help="ranks per node (default 2)")
    p.add_argument(
        "--ckpt-every",
        type=int,
        default=100,
        help="plain msrun's checkpoint interval in steps (default %(default)s)",
    )
    p.add_argument(
        "--graph-step",
        action="store_true",
        help="run the demo with GraphStep in GRAPH_MODE under ms_recover (default: its "
        "DataParallelStep)",
    )
    p.add_argument("--timeout", type=float, default=240.0, help="per-wait deadline in s")
    p.add_argument("--workdir", help="logs and checkpoints go here (default: a temp dir)")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON")


@dataclasses.dataclass(frozen=True)
class Settings:
    budget_s: float
    schedules: tuple[str, ...]
    seed: int
    mean_s: float
    nodes: int
    procs_per_node: int
    ckpt_every: int
    timeout_s: float

    @property
    def world(self) -> int:
        return self.nodes * self.procs_per_node


@dataclasses.dataclass(frozen=True)
class Programs:
    """What each arm runs: ``ours(out)`` the rank command under ms_recover, ``msrun`` the rank
    program's argv head for plain msrun (:class:`~ms_recover.bench.msrunrestart.Restarts`
    appends its arguments), ``env`` for the ms_recover jobs. Tests use stand-ins."""

    ours: Callable[[str], list[str]]
    msrun: list[str]
    env: dict[str, str]


def demo_programs(graph_step: bool = False) -> Programs:
    def ours(out: str) -> list[str]:
        return [
            *(sys.executable, "-m", "ms_recover.mindspore.programs.demo_train"),
            *(["--graph-step"] if graph_step else []),
            *("--steps", str(LONG_RUN_STEPS), "--out", out),
        ]

    return Programs(ours, list(msrunrestart.PROGRAM), {E.STANDBY: "on"})


def settings_of(args: argparse.Namespace) -> Settings:
    bad = []
    if not (args.budget_s > 0 and args.budget_s < 1e6):
        bad.append(f"--budget-s must be a positive number of seconds, got {args.budget_s}")
    if not (args.mean_s > 0 and args.mean_s < 1e6):
        bad.append(f"--mean-s must be a positive number of seconds, got {args.mean_s}")
    if args.nodes < 1 or args.procs_per_node < 1 or args.nodes * args.procs_per_node < 2:
        bad.append("--nodes and --procs-per-node must give at least 2 ranks")
    if args.ckpt_every < 1:
        bad.append(f"--ckpt-every must be at least 1, got {args.ckpt_every}")
    if bad:
        raise ConfigError("; ".join(bad))
    schedules = gm.SCHEDULES if args.schedule == "all" else (args.schedule,)
    return Settings(
        args.budget_s,
        schedules,
        args.seed,
        args.mean_s,
        args.nodes,
        args.procs_per_node,
        args.ckpt_every,
        args.timeout,
    )


def run(args: argparse.Namespace) -> int:
    cfg = settings_of(args)
    workdir = args.workdir or tempfile.mkdtemp(prefix="ms-recover-bench-goodput-")
    programs = demo_programs(args.graph_step)
    result = measure(cfg, programs, workdir, log=lambda m: print(m, flush=True))
    rep = report(cfg, result, workdir)
    rep.settings["graph_step"] = args.graph_step
    return rep.emit(args.json)


# ----------------------------------------------------------------------------- the arms
def measure(
    cfg: Settings, programs: Programs, workdir: str, log: Callable[[str], None]
) -> dict[str, Any]:
    """(c) once, then (a) and (b) per schedule; each arm's result, or ``{"failed": why}``."""
    log(f"goodput: (c) the job without faults, {cfg.budget_s:g} s ...")
    clean = _guarded(lambda: run_ours(cfg, programs, (), 0.0, os.path.join(workdir, "c")))
    log(f"goodput: (c) {_brief(clean)}")
    out: dict[str, Any] = {"clean": clean, "schedules": {}}
    step_s = cfg.budget_s / clean["steps"] if clean.get("steps") else 0.0
    for name in cfg.schedules:
        faults = gm.schedule(
            name, cfg.budget_s, cfg.seed, cfg.nodes, cfg.procs_per_node, cfg.mean_s
        )
        log(f"goodput: {name}: " + "; ".join(f.describe() for f in faults))
        log(f"goodput: {name}: (a) ms_recover ...")
        a_out, b_out = os.path.join(workdir, f"a-{name}"), os.path.join(workdir, f"b-{name}")
        ours = _guarded(functools.partial(run_ours, cfg, programs, faults, step_s, a_out))
        log(f"goodput: {name}: (a) {_brief(ours)}; (b) plain msrun ...")
        theirs = _guarded(functools.partial(run_msrun, cfg, programs, faults, b_out))
        log(f"goodput: {name}: (b) {_brief(theirs)}")
        out["schedules"][name] = {
            "faults": [dataclasses.asdict(f) for f in faults],
            "ours": ours,
            "msrun": theirs,
        }
    return out


def _brief(arm: dict[str, Any]) -> str:
    return arm["failed"] if arm.get("failed") else f"{arm['steps']} steps in the budget"


def _guarded(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """An arm that could not be measured is a row that says why, not a crash of the bench."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - reported in the table with its reason
        return {"failed": f"{type(exc).__name__}: {exc}"}


def _transient_env(faults: tuple[gm.Fault, ...], step_s: float, ppn: int) -> dict[str, str]:
    plan = Faults()
    for i, f in enumerate(faults):
        if f.kind == "transient":
            if step_s <= 0:
                raise RuntimeError("a transient fault needs the fault-free arm's step time")
            inc = gm.replaced_ranks(faults[:i], ppn).count(f.rank)
            plan = plan.add("transient", f.rank, 1 + int(f.at_s / step_s), inc)
    return plan.to_env() if plan.specs else {}


def run_ours(
    cfg: Settings,
    programs: Programs,
    faults: tuple[gm.Fault, ...],
    step_s: float,
    out: str,
) -> dict[str, Any]:
    """One ms_recover arm: its steps in the budget from every rank's first step, the faults
    injected at their times, and the manager's recovery events."""
    config = JobConfig(
        job_id=f"goodput-{os.getpid()}-{os.path.basename(out)}",
        node_nums=cfg.nodes,
        proc_per_node=cfg.procs_per_node,
    )
    env = {**programs.env, **_transient_env(faults, step_s, cfg.procs_per_node)}
    spare_pods = spare_pods_for(faults)
    job = LocalJob(
        config, programs.ours(out), env, os.path.join(out, "logs"), spare_pods=spare_pods
    )
    injected: list[dict[str, Any]] = []
    with job:
        last = {"running_min": -1}  # the slowest rank's committed step, seen while training

        def supervised(cond: Callable[[], Any]) -> Callable[[], Any]:
            def check() -> Any:
                job.pods.poll()
                st = job.status()
                if _is_training(st):
                    last["running_min"] = min(r["step"] for r in st["ranks"])
                return cond()

            return check

        def first_steps() -> list[int] | None:
            st = job.status()
            steps = [r["step"] for r in st.get("ranks", [])]
            ok = len(steps) == cfg.world and st.get("state") == "running"
            return steps if ok and min(steps) >= 1 else None

        s0 = min(wait_for(supervised(first_steps), cfg.timeout_s, "every rank's first step"))
        if spare_pods:  # a spare warms on its own machine on a cluster: not in the budget here
            wait_for(supervised(functools.partial(_spare_warm, job, cfg)), cfg.timeout_s, "spare")
            s0 = min(r["step"] for r in job.status()["ranks"])
        t0, wall0, load0 = time.monotonic(), time.time(), os.getloadavg()[0]
        rate: float | None = None
        for f in faults:
            due = t0 + f.at_s
            wait_for(supervised(functools.partial(_past, due)), f.at_s + 1, "a fault's time")
            # A fault due while a recovery runs hits the job once it trains again.
            wait_for(supervised(functools.partial(_training, job)), cfg.timeout_s, "training")
            if not injected:  # the arm's own fault-free rate, in the same run and load
                rate = (last["running_min"] - s0) / max(time.monotonic() - t0, 1e-9)
            injected.append({**dataclasses.asdict(f), "late_s": time.monotonic() - due})
            _inject_ours(job, f)
        end = t0 + cfg.budget_s
        wait_for(supervised(functools.partial(_past, end)), cfg.budget_s + 1, "the budget")
        st = job.status()
        # Mid-recovery at the end: what the survivors had committed is kept (recover-in-place
        # resumes from it); a replaced rank's own count means nothing yet.
        kept = min(r["step"] for r in st["ranks"]) if _is_training(st) else last["running_min"]
        ledger = ledger_from_events(_lines(job.events.recent()), start=wall0)
        recoveries = [dict(e) for e in job.find("recovery")]
        fault_events = [dict(e) for e in job.find("fault")]
    return {
        "steps": max(0, kept - s0),
        "clean_rate": rate,
        "spare_pods": spare_pods,
        "promoted": [dict(e) for e in job.find("spare_promoted")],
        "ledger": dataclasses.asdict(ledger.record(wall0 + cfg.budget_s)),
        "load": [load0, os.getloadavg()[0]],
        "state_at_end": st.get("state"),
        "injected": injected,
        "recoveries": recoveries,
        "faults_seen": len(fault_events),
    }


def spare_pods_for(faults: tuple[gm.Fault, ...]) -> int:
    """Spare nodes arm (a) runs with: one when its schedule loses a node (a lost pod then
    comes back as the next spare, docs/design.md §1f), else none."""
    return 1 if any(f.kind == "node" for f in faults) else 0


def _spare_warm(job: LocalJob, cfg: Settings) -> bool:
    """The spare pod's rank processes are all warm (blocked waiting for a rank)."""
    spare = job.pods.procs.get(cfg.nodes)
    return spare is not None and len(warm_spare_pids({spare.pid})) >= cfg.procs_per_node


def _training(job: LocalJob) -> bool:
    return _is_training(job.status())


def _is_training(st: dict[str, Any]) -> bool:
    ranks = st.get("ranks") or []
    return st.get("state") == "running" and bool(ranks) and all(r.get("alive") for r in ranks)


def _past(t: float) -> bool:
    return time.monotonic() >= t


def _inject_ours(job: LocalJob, f: gm.Fault) -> None:
    if f.kind == "node":
        job.pods.kill_node(f.node)
        return
    if f.kind == "transient":
        return  # raised by the rank itself at its step (MS_RECOVER_FAULTS)
    pid = next(int(r["pid"]) for r in job.status()["ranks"] if r["rank"] == f.rank)
    with contextlib.suppress(ProcessLookupError):  # a rank that died meanwhile
        os.kill(pid, signal.SIGKILL if f.kind == "kill" else signal.SIGSTOP)


def run_msrun(
    cfg: Settings, programs: Programs, faults: tuple[gm.Fault, ...], out: str
) -> dict[str, Any]:
    """One plain-msrun arm: msrun restarted on its last checkpoint after every exit."""
    restarts = msrunrestart.Restarts(
        world=cfg.world,
        ckpt_every=cfg.ckpt_every,
        warm_steps=0,
        timeout_s=cfg.timeout_s,
        workdir=out,
        program=list(programs.msrun),
    )
    os.makedirs(restarts.ckpt_dir, exist_ok=True)
    tracker = _MsrunTracker(cfg, restarts)
    try:
        return tracker.run(faults)
    finally:
        tracker.current.kill()


class _MsrunTracker:
    """Follows one plain-msrun arm: its incarnations, their progress and its checkpoints."""

    def __init__(self, cfg: Settings, restarts: msrunrestart.Restarts) -> None:
        self.cfg = cfg
        self.restarts = restarts
        self.launches = 0
        self.current, self.out = restarts.start("run0")
        self.live = False  # the current incarnation has taken its first step on every rank
        self.dying = False  # a fault killed a worker of the current incarnation
        self.hung = False
        self.ckpt_step = -1  # the last step a checkpoint holds
        self.last_min = -1  # the slowest rank's last recorded step of the live incarnation
        self.relaunches: list[dict[str, float]] = []
        self._exit_at = 0.0

    def _progress(self) -> dict[int, dict[str, Any]]:
        return {int(p["rank"]): p for p in msrunrestart.read_records(self.out, "progress_*.json")}

    def poll(self) -> None:
        run = self.current
        run.note_descendants()
        if run.proc.poll() is not None:  # msrun exited after a fault: start it again
            self._exit_at = time.monotonic()
            run.kill()
            self.launches += 1
            self.current, self.out = self.restarts.start(f"run{self.launches}")
            self.live = self.dying = self.hung = False  # a hang MindSpore noticed ends so
            return
        if not self.live and not self.dying:
            firsts = msrunrestart.first_steps(self.out, self.cfg.world)
            if firsts is None:
                return
            self.live = True
            if self._exit_at:
                self.relaunches.append({"relaunch_s": time.monotonic() - self._exit_at})
        prog = self._progress()
        if len(prog) == self.cfg.world and not self.hung:
            self.last_min = min(int(p["step"]) for p in prog.values())
        if 0 in prog:
            self.ckpt_step = max(
                self.ckpt_step, gm.last_checkpoint(int(prog[0]["step"]), self.cfg.ckpt_every)
            )

    def run(self, faults: tuple[gm.Fault, ...]) -> dict[str, Any]:
        cfg = self.cfg

        def started() -> bool:
            self.poll()
            return self.live

        wait_for(started, cfg.timeout_s, "plain msrun's first steps", poll_s=POLL_S)
        t0, load0 = time.monotonic(), os.getloadavg()[0]
        firsts = msrunrestart.first_steps(self.out, cfg.world) or []
        s0 = min(int(t["first_step"]) for t in firsts)
        pending = list(faults)
        injected: list[dict[str, Any]] = []
        rate: float | None = None
        end = t0 + cfg.budget_s
        while time.monotonic() < end:
            self.poll()
            now = time.monotonic()
            if pending and now >= t0 + pending[0].at_s and self.live and not self.hung:
                f = pending.pop(0)
                if rate is None and self.last_min >= s0:  # before its first fault
                    rate = (self.last_min - s0) / max(now - t0, 1e-9)
                self._inject(f)
                injected.append({**dataclasses.asdict(f), "late_s": now - t0 - f.at_s})
            time.sleep(POLL_S)
        self.poll()
        if self.hung or not self.live:
            kept = self.ckpt_step  # back to the last checkpoint: at once, or at the timeout
        else:
            kept = self.last_min
        return {
            "steps": max(0, kept + 1 - s0),
            "clean_rate": rate,
            "hung_at_end": self.hung,
            "live_at_end": self.live,
            "injected": injected,
            "not_injected": [dataclasses.asdict(f) for f in pending],
            "relaunches": self.relaunches,
            "launches": self.launches + 1,
            "load": [load0, os.getloadavg()[0]],
        }

    def _inject(self, f: gm.Fault) -> None:
        ppn = self.cfg.procs_per_node
        prog = self._progress()
        if f.kind == "node":
            ranks = list(range(f.node * ppn, (f.node + 1) * ppn))
        else:
            ranks = [f.rank]
        sig = signal.SIGSTOP if f.kind == "hang" else signal.SIGKILL
        for rank in ranks:
            with contextlib.suppress(ProcessLookupError):  # died meanwhile
                os.kill(int(prog[rank]["pid"]), sig)
        if f.kind == "hang":
            self.hung = True
        else:  # msrun's exit, then its relaunch, are the next events
            self.live, self.dying = False, True


# ----------------------------------------------------------------------------- the table
def report(cfg: Settings, result: dict[str, Any], workdir: str) -> Report:
    rep = Report(
        "goodput",
        f"Goodput: {cfg.nodes}x{cfg.procs_per_node} MindSpore job, {cfg.budget_s:g} s per arm "
        f"from every rank's first step, faults every {cfg.mean_s:g} s on average (seed "
        f"{cfg.seed})",
    )
    rep.settings = {**dataclasses.asdict(cfg), "workdir": workdir}
    rep.samples = result
    clean = result["clean"]
    c_steps = clean.get("steps") or 0
    if clean.get("failed") or c_steps <= 0:
        why = clean.get("failed") or "the fault-free arm took no step"
        for name in cfg.schedules:
            rep.add(_ours_row(cfg, name, None, failed=f"no fault-free arm: {why}"))
        return rep
    step_s = cfg.budget_s / c_steps
    rep.add(
        Measure(
            "goodput (c) no faults: steps in the budget",
            c_steps,
            "steps",
            note=f"step {step_s * 1e3:.2f} ms under ms_recover; the productive step rate",
        )
    )
    costs: dict[str, dict[str, float]] = {}
    for name in cfg.schedules:
        got = result["schedules"][name]
        rows, cost = _schedule_rows(cfg, name, got, c_steps)
        rep.add(*rows)
        costs[name] = cost
    rep.add(*projection_rows(costs))
    rep.notes.append(_loads(result))
    rep.notes += [
        f"Schedules: n = max(2, round(budget / {cfg.mean_s:g} s)) faults a run, one in each of n "
        "equal slots of the budget's middle 80 %, at a seeded time in the slot's first 3/4. "
        f"At {cfg.budget_s:g} s each ETTR rests on {gm.fault_count(cfg.budget_s, cfg.mean_s)} "
        "faults: one fault's cost, off by x s, moves the figure by "
        f"{100 / cfg.budget_s:.2f} x percentage points; a longer --budget-s narrows it.",
        "Projection (a model, not a measurement): ETTR = 1 - c / MTTF, with c the productive "
        "time one fault cost in this run (steps missing, over the faults, against each arm's "
        "own rate before its first fault; (a)'s against (c) in a run without that rate). "
        "Assumes faults arrive one at a time at the published rate (Meta, Llama 3 training: "
        "MTTF 1.8 h at 16,384 GPUs, ~14 min at 131,072), and that a fault costs at scale what "
        "it cost here: ms_recover's recovery is per rank and per node, but detection, the "
        "replacement's start and msrun's job-wide restart (every process, the checkpoint "
        "load) grow with the job, so the msrun figures are an upper bound.",
    ]
    return rep


def _loads(result: dict[str, Any]) -> str:
    """The host's load average (1 min) at each arm's start and end: (c)'s step rate stands for
    every arm's, so a load that changed between the runs moves every ETTR."""
    arms = [("(c)", result["clean"])]
    for name, got in result["schedules"].items():
        arms += [(f"{name} (a)", got["ours"]), (f"{name} (b)", got["msrun"])]
    shown = [f"{lbl} {a['load'][0]:.1f} -> {a['load'][1]:.1f}" for lbl, a in arms if "load" in a]
    return (
        "Load average (1 min) at each arm's start -> end: "
        + "; ".join(shown)
        + (
            ". ETTR compares runs made one after the other: on a shared host a change of load "
            "between (c) and an arm moves its figure; the ledger row is the same run's own account."
        )
    )


def _ours_row(
    cfg: Settings,
    name: str,
    value: float | None,
    note: str = "",
    failed: str = "",
    spares: int = 0,
) -> Measure:
    spare = " with one spare node" if spares else ""
    return Measure(
        f"goodput {name}: ETTR (a) ms_recover{spare}",
        value,
        "%",
        ">=",
        TARGET_PCT[name],
        note=note,
        failed=failed,
    )


def _spare_note(ours: dict[str, Any]) -> str:
    """How arm (a)'s spare node served, if it ran with one."""
    if not ours.get("spare_pods"):
        return ""
    waited = [f"{p['waited_s']:.2f}" for p in ours.get("promoted") or []]
    return (
        f"; one spare node (ms-recover agent --spare, warm before the budget; a lost pod comes "
        f"back as the next spare, warming on these cores): {len(waited)} promoted, "
        f"{', '.join(waited) or '-'} s after the node's last sign of life"
    )


def _schedule_rows(
    cfg: Settings, name: str, got: dict[str, Any], c_steps: int
) -> tuple[list[Measure], dict[str, float]]:
    ours, theirs = got["ours"], got["msrun"]
    faults = [gm.Fault(**f) for f in got["faults"]]
    n = len(faults)
    kinds = ", ".join(f.describe() for f in faults)
    rows: list[Measure] = []
    cost: dict[str, float] = {}
    ettr_a: float | None = None
    spares = spare_pods_for(tuple(faults))
    if ours.get("failed"):
        rows.append(_ours_row(cfg, name, None, failed=ours["failed"], spares=spares))
    else:
        ettr_a = gm.ettr_pct(ours["steps"], c_steps)
        cost["a"] = gm.cost_per_fault_s(ours["steps"], c_steps, cfg.budget_s, n)
        mttrs = [r.get("mttr_s", 0.0) for r in ours["recoveries"] if r.get("ok")]
        lost = sum(int(r.get("lost_steps") or 0) for r in ours["recoveries"])
        rows.append(
            _ours_row(
                cfg,
                name,
                ettr_a,
                note=f"{ours['steps']} of {c_steps} steps; {kinds}; {len(mttrs)} recoveries, "
                f"MTTR {', '.join(f'{m:.2f}' for m in mttrs)} s, {lost} steps recomputed; "
                f"state at the end: {ours['state_at_end']}" + _spare_note(ours),
                spares=spares,
            )
        )
        own_rate = ours.get("clean_rate")
        if own_rate:  # the projection's cost too: a change of load does not move it
            cost["a"] = gm.cost_per_fault_s(ours["steps"], own_rate * cfg.budget_s, cfg.budget_s, n)
            rows.append(
                Measure(
                    f"goodput {name}: ETTR (a) ms_recover vs its own rate before the first fault",
                    gm.ettr_pct(ours["steps"], own_rate * cfg.budget_s),
                    "%",
                    note=f"step {1e3 / own_rate:.2f} ms before the first fault, (c)'s "
                    f"{cfg.budget_s / c_steps * 1e3:.2f} ms: the same run's load, so a change "
                    "of load between (c) and this run does not move it",
                )
            )
        ledger = ours.get("ledger") or {}
        if ledger.get("wall_s"):
            spent = sorted(
                ((k, v) for k, v in ledger["seconds"].items() if k != "productive" and v > 0.005),
                key=lambda kv: -kv[1],
            )
            rows.append(
                Measure(
                    f"goodput {name}: (a) the manager's goodput ledger, productive / wall",
                    100.0 * ledger["ettr"],
                    "%",
                    note="the same run's events, no step counting: "
                    + (", ".join(f"{k} {v:.2f} s" for k, v in spent) or "nothing lost")
                    + "; it does not see a slower step (a standby's import sharing the cores)",
                )
            )
        rows.append(
            Measure(
                f"goodput {name}: (a) productive time one fault cost",
                cost["a"],
                "s",
                note="steps missing at the fault-free step rate, over the faults: detection, "
                "recovery, recomputation and the replacement's start together; the rate is "
                + ("the run's own before its first fault" if own_rate else "(c)'s"),
            )
        )
    k_note = (
        f"rank 0 checkpoints every {cfg.ckpt_every} steps (mindspore.save_checkpoint, whole "
        "state), a frequent checkpoint that a user of a model this small would pick: it loses "
        "little work per fault"
    )
    hangs = [f for f in faults if f.kind == "hang"]
    if hangs:
        k_note += (
            "; the hang is a SIGSTOP, whose silence MindSpore's scheduler notices (then msrun "
            "exits and is started again); a hang that still heartbeats (a deadlocked loader) "
            "waits for the collective timeout (HCCL's 1800 s default, past the budget), as on a "
            "cluster: while the job is hung at the end, it is counted back to its last checkpoint"
        )
    if theirs.get("failed"):
        rows.append(
            Measure(
                f"goodput {name}: ETTR (b) plain msrun",
                None,
                "%",
                note=k_note,
                failed=f"plain msrun arm not measured: {theirs['failed']}",
            )
        )
        return rows, cost
    ettr_b = gm.ettr_pct(theirs["steps"], c_steps)
    relaunch = [r["relaunch_s"] for r in theirs["relaunches"]]
    rows.append(
        Measure(
            f"goodput {name}: ETTR (b) plain msrun, restart + checkpoint",
            ettr_b,
            "%",
            note=f"{theirs['steps']} of (c)'s {c_steps} steps; {theirs['launches']} launches, "
            f"relaunch {', '.join(f'{r:.1f}' for r in relaunch) or '-'} s; {k_note}",
        )
    )
    rate = theirs.get("clean_rate")
    if rate:
        own = gm.ettr_pct(theirs["steps"], rate * cfg.budget_s)
        cost["b"] = gm.cost_per_fault_s(theirs["steps"], rate * cfg.budget_s, cfg.budget_s, n)
        rows.append(
            Measure(
                f"goodput {name}: ETTR (b) plain msrun vs its own fault-free rate",
                own,
                "%",
                note=f"msrun's step before the first fault: {1e3 / rate:.2f} ms (ours "
                f"{cfg.budget_s / c_steps * 1e3:.2f} ms); fault handling alone",
            )
        )
        if ettr_a is not None:
            rows.append(
                Measure(
                    f"goodput {name}: ETTR (a) ms_recover / ETTR (b) plain msrun",
                    ettr_a / own if own > 0 else None,
                    "x",
                    ">=",
                    1.0,
                    note="(b) against its own fault-free rate: fault handling alone"
                    + ("" if own > 0 else "; (b) kept no step, no ratio"),
                )
            )
    return rows, cost


def projection_rows(costs: dict[str, dict[str, float]]) -> list[Measure]:
    """The model's rows: ETTR at the published MTTFs from each measured cost per fault."""
    rows = []
    arms = {"a": "(a) ms_recover", "b": "(b) plain msrun"}
    for scale, mttf in gm.PUBLISHED_MTTF_S:
        for name, cost in costs.items():
            for arm, label in arms.items():
                if arm not in cost:
                    continue
                rows.append(
                    Measure(
                        f"model, not measured: {label} ETTR at {scale}, {name} cost",
                        gm.projected_ettr_pct(cost[arm], mttf),
                        "%",
                        note=f"1 - {cost[arm]:.2f} s / {mttf:g} s",
                    )
                )
    return rows


def _lines(events: list[Event]) -> list[EventLine]:
    """The manager's in-process events as typed lines (any that do not decode are left out)."""
    out = []
    for e in events:
        try:
            out.append(decode(e))
        except SchemaError:
            continue
    return out
