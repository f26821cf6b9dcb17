"""The rows of ``ms-recover bench detect`` for faults that do not crash (docs/design.md).

Each row runs its own 2 nodes x 2 ranks job of the numpy trainer to its end:

* **compute hang**: rank 2 blocks in its own compute after step 60 (fault kind ``computehang``,
  its heartbeat alive) in a job of ~20 ms steps. The row is the ``fault`` event's ``detect_s``
  (from the last commit to the declaration) against 2 x the p99 step time the rule used + 5 s;
* **fail-slow**: rank 1's compute is stretched to 1.5x from step 60 (fault kind ``slow``, ~30 ms
  of compute a step). The row is the ``flagged`` event's step minus 60, against 50 steps;
* **soak**: ``--soak`` fault-free runs of the same job, under whatever else loads the host. The
  row is the ``flagged`` events and ``fault`` events over all of them, against 0.

The hot switch of a flagged node (MindCluster's ``hotSwitch``) is not built yet: no row.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from ms_recover.bench.table import Measure
from ms_recover.config import JobConfig
from ms_recover.strategy import parse_strategies
from ms_recover.testing.faults import Faults
from ms_recover.testing.localjob import LocalJob

FAULT_STEP = 60
SLOW_WITHIN_STEPS = 50
HANG_SLACK_S = 5.0
_P99 = re.compile(r"p99 (\d+)ms")


def job_events(
    workdir: str, name: str, steps: int, step_s: float, faults: Faults | None, timeout_s: float
) -> LocalJob:
    """Run one job of the numpy trainer to its end; the finished job (its events)."""
    config = JobConfig(
        job_id=f"bench-detect-{name}-{os.getpid()}",
        node_nums=2,
        proc_per_node=2,
        phase_timeout_s=60.0,
        wait_reschedule_timeout_s=60.0,
        strategies=parse_strategies("recover-in-place,recover,exit"),
    )
    out = os.path.join(workdir, name)
    command = [sys.executable, "-m", "ms_recover.testing.numpy_trainer", "--steps", str(steps)]
    command += ["--out", out, "--step-time", repr(step_s)]
    env = {"OPENBLAS_NUM_THREADS": "1", **(faults.to_env() if faults else {})}
    job = LocalJob(config, command, env, log_dir=os.path.join(out, "logs"))
    with job:
        if not job.wait(timeout_s):
            raise TimeoutError(f"bench detect: the {name} job did not end in {timeout_s:g}s")
    return job


def hang_row(workdir: str, timeout_s: float) -> tuple[Measure, dict[str, Any]]:
    faults = Faults().add("computehang", rank=2, step=FAULT_STEP)
    job = job_events(workdir, "hang", 2 * FAULT_STEP, 0.02, faults, timeout_s)
    hangs = job.find("fault", kind="hang")
    if not hangs:
        return Measure("compute hang declared", None, "s", failed="no hang declared"), {}
    fault = hangs[0]
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


def soak_row(workdir: str, runs: int, timeout_s: float) -> tuple[Measure, dict[str, Any]]:
    false = 0
    for i in range(runs):
        job = job_events(workdir, f"soak{i}", 2 * FAULT_STEP, 0.03, None, timeout_s)
        false += len(job.find("flagged")) + len(job.find("fault"))
    return (
        Measure(
            f"false flags and hangs over a soak of {runs} fault-free runs",
            float(false),
            "",
            "<=",
            0.0,
            "flagged + fault events, host loaded by everything else running",
        ),
        {"runs": runs, "false": false},
    )


def rows(workdir: str, soak: int, timeout_s: float) -> tuple[list[Measure], dict[str, Any]]:
    """Every row above, and their samples."""
    hang, hang_s = hang_row(workdir, timeout_s)
    slow, slow_s = slow_row(workdir, timeout_s)
    calm, calm_s = soak_row(workdir, soak, timeout_s)
    return [hang, slow, calm], {"hang": hang_s, "slow": slow_s, "soak": calm_s}
