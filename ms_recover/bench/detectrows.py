"""The rows of ``ms-recover bench detect`` for faults that do not crash (docs/design.md).

Each row runs its own 2 nodes x 2 ranks job of the numpy trainer to its end:

* **compute hang**: rank 2 blocks in its own compute after step 60 (fault kind ``computehang``,
  its heartbeat alive) in a job of ~20 ms steps. The row is the ``fault`` event's ``detect_s``
  (from the last commit to the declaration) against 2 x the p99 step time the rule used + 5 s;
* **frozen rank**: rank 2 stops itself (SIGSTOP) after step 60 (fault kind ``hang``) in the same
  job shape; its agent sees the process stopped (``ms_recover.agent.frozen``). The row is the
  ``fault`` event's ``detect_s`` (how long the rank had been stopped when its agent reported
  it) against the compute hang's bound, 2 x p99 + 5 s;
* **fail-slow**: rank 1's compute is stretched to 1.5x from step 60 (fault kind ``slow``, ~30 ms
  of compute a step). The row is the ``flagged`` event's step minus 60, against 50 steps;
* **fail-slow by SIGSTOP**: rank 1 is stopped 4 ms of every 12 ms from outside (a duty-cycled
  SIGSTOP, :class:`~ms_recover.localrun.dutycycle.DutyCycle`) from its step 60 (it writes the
  step it runs to a file); its ~30 ms of device work are 30 sleeps of 1 ms, so it runs at 1.5x.
  The row is the ``flagged`` event's step minus the step the rank was in when the stops began,
  against 50 steps; a ``fault`` in that job (the stopped rank taken for a frozen or hung one)
  fails the row;
* **soak**: ``--soak`` fault-free runs of the same job, ``parallel`` at a time (so loaded by one
  another and by whatever else runs). The row is the ``flagged`` events and ``fault`` events
  over all of them, against 0;
* **hot switch**: rank 2 runs at half speed while it is a process of node 1's first pod (a
  duty-cycled SIGSTOP owned by the pod), under ``subHealthyStrategy=hotSwitch``: the pause is
  the swap's ``recovery`` MTTR (stop to training again; the new pod came up before, while
  training went on). Against the recover-in-place MTTR of the same job with rank 2 killed at
  step 60 instead: the row is their ratio, against 1.
"""

from __future__ import annotations

import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ms_recover.bench.table import Measure
from ms_recover.config import JobConfig
from ms_recover.localrun.dutycycle import DutyCycle, pod_rank_pids
from ms_recover.localrun.faults import Faults
from ms_recover.localrun.job import LocalJob
from ms_recover.localrun.wait import wait_for
from ms_recover.strategy import parse_strategies

FAULT_STEP = 60
SLOW_WITHIN_STEPS = 50
HANG_SLACK_S = 5.0
_P99 = re.compile(r"p99 (\d+)ms")


SWAPPED = "switched to its new pod"  # in the fault of a hot switch's swap (manager.subhealth)
SLICED = ("--slices", "30")  # device work as 30 short sleeps: a stopped rank runs slower


def new_job(
    workdir: str,
    name: str,
    steps: int,
    step_s: float,
    faults: Faults | None = None,
    extra: tuple[str, ...] = (),
    **changes: Any,
) -> LocalJob:
    """A (not started) 2 x 2 job of the numpy trainer."""
    config = JobConfig(
        job_id=f"bench-detect-{name}-{os.getpid()}",
        node_nums=2,
        proc_per_node=2,
        phase_timeout_s=60.0,
        wait_reschedule_timeout_s=60.0,
        strategies=parse_strategies("recover-in-place,recover,exit"),
        **changes,
    )
    out = os.path.join(workdir, name)
    command = [sys.executable, "-m", "ms_recover.localrun.numpy_trainer", "--steps", str(steps)]
    command += ["--out", out, "--step-time", repr(step_s), *extra]
    env = {"OPENBLAS_NUM_THREADS": "1", **(faults.to_env() if faults else {})}
    return LocalJob(config, command, env, log_dir=os.path.join(out, "logs"))


def finish(job: LocalJob, name: str, timeout_s: float) -> LocalJob:
    if not job.wait(timeout_s):
        raise TimeoutError(f"bench detect: the {name} job did not end in {timeout_s:g}s")
    return job


def job_events(
    workdir: str, name: str, steps: int, step_s: float, faults: Faults | None, timeout_s: float
) -> LocalJob:
    """Run one job of the numpy trainer to its end; the finished job (its events)."""
    with new_job(workdir, name, steps, step_s, faults) as job:
        return finish(job, name, timeout_s)


def step_in(workdir: str, name: str, rank: int) -> int:
    """The step ``rank`` of the job ``name`` runs (numpy trainer ``--mark``), or -1."""
    try:
        with open(os.path.join(workdir, name, f"step_{rank}")) as fh:
            return int(fh.read() or -1)
    except (OSError, ValueError):
        return -1


def _first_hang(workdir: str, name: str, faults: Faults, timeout_s: float) -> dict[str, Any] | None:
    """Run the ~20 ms-step job ``name`` with ``faults`` to its end; its first ``hang`` of rank
    2, or None."""
    job = job_events(workdir, name, 2 * FAULT_STEP, 0.02, faults, timeout_s)
    hangs = job.find("fault", kind="hang", rank=2)
    return dict(hangs[0]) if hangs else None


def hang_row(workdir: str, timeout_s: float) -> tuple[Measure, dict[str, Any]]:
    faults = Faults().add("computehang", rank=2, step=FAULT_STEP)
    fault = _first_hang(workdir, "hang", faults, timeout_s)
    if fault is None:
        return Measure("compute hang declared", None, "s", failed="no hang declared"), {}
    found = _P99.search(str(fault.get("detail", "")))
    p99 = int(found.group(1)) / 1000 if found else float("nan")
    sample = {"detect_s": fault["detect_s"], "p99_s": p99, "rank": fault["rank"]}
    return (
        Measure(
            "compute hang declared (no commit -> fault)",
            float(fault["detect_s"]),
            "s",
            "<=",
            round(2 * p99 + HANG_SLACK_S, 3),
            f"rank {fault['rank']} stuck in its compute, heartbeat alive; target 2 x p99 "
            f"({p99 * 1000:.0f} ms) + 5 s",
        ),
        sample,
    )


def frozen_row(workdir: str, timeout_s: float, p99_s: float) -> tuple[Measure, dict[str, Any]]:
    """A rank that stops itself (SIGSTOP) after step 60; ``p99_s`` the compute hang row's."""
    fault = _first_hang(workdir, "frozen", Faults().hang(rank=2, step=FAULT_STEP), timeout_s)
    if fault is None:
        return Measure("stopped rank declared", None, "s", failed="no hang declared"), {}
    return (
        Measure(
            "stopped rank (SIGSTOP) declared (stop -> fault)",
            float(fault["detect_s"]),
            "s",
            "<=",
            round(2 * p99_s + HANG_SLACK_S, 3),
            f"rank 2 stopped by a signal, seen by its agent ({fault.get('detail', '')[:80]})",
        ),
        {"detect_s": fault["detect_s"], "detail": fault.get("detail", "")},
    )


def slow_row(workdir: str, timeout_s: float) -> tuple[Measure, dict[str, Any]]:
    faults = Faults().add("slow", rank=1, step=FAULT_STEP)
    job = job_events(workdir, "slow", 3 * FAULT_STEP, 0.03, faults, timeout_s)
    flags = job.find("flagged", rank=1)
    if not flags:
        return Measure("fail-slow rank flagged", None, "steps", failed="never flagged"), {}
    steps = int(flags[0]["step"]) - FAULT_STEP
    return (
        Measure(
            "fail-slow rank (1.5x compute) flagged after",
            float(steps),
            "steps",
            "<=",
            float(SLOW_WITHIN_STEPS),
            f"score {flags[0]['score']}x the members' compute",
        ),
        {"flag": dict(flags[0]), "steps": steps},
    )


def sigstop_row(workdir: str, timeout_s: float) -> tuple[Measure, dict[str, Any]]:
    name = "sigstop"
    with new_job(workdir, name, 4 * FAULT_STEP, 0.03, extra=(*SLICED, "--mark")) as job:
        wait_for(lambda: step_in(workdir, name, 1) >= FAULT_STEP, timeout_s, "rank 1 at step 60")
        pid, onset = int(job.status()["ranks"][1]["pid"]), step_in(workdir, name, 1)
        with DutyCycle(lambda: [pid], stop_s=0.004, period_s=0.012):
            finish(job, name, timeout_s)
    flags = job.find("flagged", rank=1)
    faults = [str(f.get("detail", "")) for f in job.find("fault")]
    if faults:  # stopped a third of the time is slow, not frozen and not hung
        return Measure("fail-slow rank (SIGSTOP)", None, "steps", failed=faults[0][:120]), {}
    if not flags:
        return Measure("fail-slow rank (SIGSTOP)", None, "steps", failed="never flagged"), {}
    steps = int(flags[0]["step"]) - onset
    return (
        Measure(
            "fail-slow rank (SIGSTOP 1/3 of the time) flagged after",
            float(steps),
            "steps",
            "<=",
            float(SLOW_WITHIN_STEPS),
            f"score {flags[0]['score']}x; from step {onset}, when the stops began",
        ),
        {"flag": dict(flags[0]), "onset": onset, "steps": steps},
    )


def soak_row(
    workdir: str, runs: int, timeout_s: float, parallel: int = 4
) -> tuple[Measure, dict[str, Any]]:
    def one(i: int) -> int:
        job = job_events(workdir, f"soak{i}", 2 * FAULT_STEP, 0.03, None, timeout_s)
        return len(job.find("flagged")) + len(job.find("fault"))

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        false = list(pool.map(one, range(runs)))
    return (
        Measure(
            f"false flags and hangs over a soak of {runs} fault-free runs",
            float(sum(false)),
            "",
            "<=",
            0.0,
            f"flagged + fault events; {parallel} runs at a time, loading one another",
        ),
        {"runs": runs, "parallel": parallel, "false": false},
    )


def hot_switch_row(workdir: str, timeout_s: float) -> tuple[Measure, dict[str, Any]]:
    name = "hotswitch"
    with new_job(workdir, name, 8 * FAULT_STEP, 0.03, extra=SLICED, sub_healthy="hotSwitch") as job:
        agent = job.pods.procs[1].pid

        def pid() -> int:
            return int(job.status()["ranks"][2]["pid"])

        with DutyCycle(lambda: pod_rank_pids(agent, pid), stop_s=0.006, period_s=0.012):
            finish(job, name, timeout_s)
    swaps = [r for r in job.find("recovery") if any(SWAPPED in f for f in r.get("faults", []))]
    with new_job(workdir, "inplace", 2 * FAULT_STEP, 0.03, Faults().kill(2, FAULT_STEP)) as rip:
        finish(rip, "inplace", timeout_s)
    in_place = rip.find("recovery", ok=True)
    if not swaps or not swaps[-1]["ok"] or not in_place:
        why = "no hot switch" if not swaps else "no recover-in-place"
        return Measure("hot switch pause", None, "x", failed=why), {}
    pause, mttr = float(swaps[-1]["mttr_s"]), float(in_place[0]["mttr_s"])
    return (
        Measure(
            "hot switch pause / recover-in-place MTTR",
            round(pause / mttr, 3),
            "x",
            "<=",
            1.0,
            f"pause {pause:.3f}s (lost steps {swaps[-1]['lost_steps']}) vs {mttr:.3f}s",
        ),
        {"pause_s": pause, "in_place_mttr_s": mttr, "swap": dict(swaps[-1])},
    )


def rows(
    workdir: str, soak: int, timeout_s: float, parallel: int = 4
) -> tuple[list[Measure], dict[str, Any]]:
    """Every row above, and their samples."""
    hang, hang_s = hang_row(workdir, timeout_s)
    frozen, frozen_s = frozen_row(workdir, timeout_s, hang_s.get("p99_s", 0.02))
    slow, slow_s = slow_row(workdir, timeout_s)
    stop, stop_s = sigstop_row(workdir, timeout_s)
    calm, calm_s = soak_row(workdir, soak, timeout_s, parallel)
    switch, switch_s = hot_switch_row(workdir, timeout_s)
    samples = {"hang": hang_s, "frozen": frozen_s, "slow": slow_s, "sigstop": stop_s}
    rows_ = [hang, frozen, slow, stop, calm, switch]
    return rows_, {**samples, "soak": calm_s, "hot_switch": switch_s}
