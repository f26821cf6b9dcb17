"""Helpers for tests that run a whole local job of numpy trainer processes."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from ms_recover.config import JobConfig
from ms_recover.localrun.faults import Faults
from ms_recover.localrun.job import LocalJob
from ms_recover.strategy import parse_strategies

STEPS = 30


def job_config(strategy: str = "recover-in-place,recover,exit", **changes: Any) -> JobConfig:
    base = dict(
        job_id="itest",
        node_nums=2,
        proc_per_node=2,
        heartbeat_s=0.5,
        phase_timeout_s=20.0,
        hang_timeout_s=30.0,
        wait_reschedule_timeout_s=30.0,
        strategies=parse_strategies(strategy),
    )
    base.update(changes)
    return JobConfig(**base)


def trainer_job(
    out: str,
    faults: Faults | None = None,
    strategy: str = "recover-in-place,recover,exit",
    extra: tuple[str, ...] = (),
    steps: int = STEPS,
    reschedule_delay_s: float = 0.0,
    spares: int = 0,
    env: dict[str, str] | None = None,
    spare_pods: int = 0,
    **changes: Any,
) -> LocalJob:
    command = [
        sys.executable,
        "-m",
        "ms_recover.localrun.numpy_trainer",
        "--steps",
        str(steps),
        "--out",
        out,
        *extra,
    ]
    return LocalJob(
        job_config(strategy, **changes),
        command,
        {"OPENBLAS_NUM_THREADS": "1", **(faults.to_env() if faults else {}), **(env or {})},
        log_dir=os.path.join(out, "logs"),
        reschedule_delay_s=reschedule_delay_s,
        spares=spares,
        spare_pods=spare_pods,
    )


def results(out: str, world: int = 4) -> list[dict[str, Any]]:
    found = []
    for rank in range(world):
        with open(os.path.join(out, f"rank_{rank}.json")) as fh:
            found.append(json.load(fh))
    return found


def run_to_end(job: LocalJob, timeout_s: float = 90.0) -> None:
    assert job.wait(timeout_s), f"job did not finish in {timeout_s}s: {job.status()}"


def reference_sha(out: str, steps: int = STEPS, **changes: Any) -> str:
    """The final weights' sha256 of an uninterrupted run in ``out``, the same on every rank
    (``changes``: of the job's config, e.g. ``node_nums=3``)."""
    with trainer_job(out, steps=steps, **changes) as job:
        run_to_end(job)
        assert job.exit_code == 0
    shas = {r["sha256"] for r in results(out, world=job.config.world_size)}
    assert len(shas) == 1, "replicas of an uninterrupted run disagree"
    return shas.pop()


def shared_reference_sha(factory: Any, steps: int = STEPS, **changes: Any) -> str:
    """:func:`reference_sha` run once per test session, not once per module: the result is
    kept beside the session's temporary directories, shared by pytest-xdist's workers (a lock
    makes the second worker that needs it wait for the first one's run, then read it).
    ``factory``: pytest's ``tmp_path_factory``."""
    root = Path(factory.getbasetemp())
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's base is in the session's
        root = root.parent
    key = hashlib.sha256(json.dumps([steps, sorted(changes.items())]).encode()).hexdigest()[:16]
    found = root / f"reference-{key}.sha256"
    with open(root / f"reference-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if found.exists():
            return found.read_text()
        sha = reference_sha(str(factory.mktemp("reference")), steps, **changes)
        found.write_text(sha)
        return sha


def running_with(needle: str) -> list[str]:
    """Live processes whose command line contains ``needle`` ("pid: command"), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        if needle in cmdline:
            found.append(f"{entry.name}: {cmdline[:160]}")
    return found
