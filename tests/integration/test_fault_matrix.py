"""The fault matrix (issue 9): every fault kind, faults together and in each recovery phase,
a killed agent, on the numpy trainer (2 nodes x 2 ranks, 30 steps).

Each test is one scenario (the ``scenario`` fixture, see tests/conftest.py). A scenario
survives when the job ends 0, every recovery it needed succeeded, and the final weights of
every rank are bit-identical to an uninterrupted run's; it adds the committed steps its
recoveries lost (always 0 when it survives). The terminal summary prints the tally. The
manager restart scenarios are in test_manager_restart.py.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from ms_recover.testing.faults import Faults
from ms_recover.testing.localjob import LocalJob
from ms_recover.testing.wait import wait_for

from .jobs import STEPS, reference_sha, results, run_to_end, trainer_job

pytestmark = pytest.mark.timeout(120)

RIP = "recover-in-place,recover,exit"
KILL = Faults().kill(rank=1, step=10)  # the first fault of the "during recovery" scenarios

#: name -> (faults, strategy, the strategy of the last recovery, JobConfig changes)
MATRIX: dict[str, tuple[Faults, str, str, dict[str, Any]]] = {
    "kill": (KILL, RIP, "recover-in-place", {}),
    "node-loss": (Faults().node(rank=2, step=12), "recover,exit", "recover", {}),
    "hang": (
        Faults().hang(rank=3, step=8),
        RIP,
        "recover-in-place",
        {"hang_timeout_s": 3.0, "rank_silence_s": 60.0},
    ),
    # Stuck in its own compute, heartbeat alive: named by the adaptive hang rule (its steps
    # are timed by then) and the only rank replaced (see test_fault).
    "compute-hang": (Faults().add("computehang", rank=2, step=27), RIP, "recover-in-place", {}),
    "transient": (Faults().transient(rank=2, step=8), "retry,recover-in-place,exit", "retry", {}),
    "memory": (Faults().add("memory", rank=1, step=6), "retry,exit", "retry", {}),
    "allreduce": (Faults().in_allreduce(rank=3, step=7), RIP, "recover-in-place", {}),
    "two-nodes-at-once": (KILL.kill(rank=2, step=10), RIP, "recover-in-place", {}),
    "during-stop": (KILL.add("stopdie", rank=2), RIP, "recover-in-place", {}),
    "during-replace (replacement killed again)": (
        KILL.add("boot", rank=1, inc=1),
        RIP,
        "recover-in-place",
        {},
    ),
    "during-rebuild": (KILL.add("rebuilddie", rank=3), RIP, "recover-in-place", {}),
    "during-repair (repair source killed)": (
        KILL.add("repairdie", rank=0),
        RIP,
        "recover-in-place",
        {},
    ),
    "during-resume": (KILL.add("resumedie", rank=2), RIP, "recover-in-place", {}),
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    return reference_sha(str(tmp_path_factory.mktemp("reference")))


def assert_survived(job: LocalJob, out: str, reference: str, scenario: Any) -> list[dict]:
    """The job ended 0 with every rank bit-identical to the reference, no committed step lost."""
    decisions = [(e["strategy"], e["reason"]) for e in job.find("decision")]
    assert job.exit_code == 0, decisions
    recoveries = job.find("recovery")
    assert recoveries and all(r["ok"] for r in recoveries), recoveries
    scenario.lost_steps = sum(r["lost_steps"] for r in recoveries)
    assert scenario.lost_steps == 0
    final = results(out)
    assert [r["sha256"] for r in final] == [reference] * 4
    assert all(r["committed"] == STEPS - 1 for r in final)
    return recoveries


@pytest.mark.parametrize("name", list(MATRIX))
def test_fault(name: str, tmp_path, reference: str, scenario) -> None:
    faults, strategy, last, changes = MATRIX[name]
    out = str(tmp_path)
    with trainer_job(out, faults, strategy, **changes) as job:
        run_to_end(job)
    recoveries = assert_survived(job, out, reference, scenario)
    assert recoveries[-1]["strategy"] == last
    if name == "compute-hang":
        (fault,) = job.find("fault")
        assert (fault["kind"], fault["rank"], recoveries[0]["replaced"]) == ("hang", 2, [2])
        assert fault["detect_s"] < 10.0, fault  # the adaptive limit, not hang_timeout_s (30 s)
    kinds = {s.kind for s in faults.specs}
    if kinds & {"stopdie", "rebuilddie", "resumedie", "boot", "repairdie"} or len(kinds) > 1:
        victims = {s.rank for s in faults.specs}
        assert victims <= {f["rank"] for f in job.find("fault")}, "a fault went unnoticed"


def test_killed_agent(tmp_path, reference: str, scenario) -> None:
    """SIGKILL one agent: its ranks die with it, its pod is recreated, the node recovers."""
    out = str(tmp_path)
    # Ranks' steps reach the status once per rank_report_s (2.5 s here): 0.2 s steps keep
    # the job running over a few reports, also on a loaded host.
    with trainer_job(out, extra=("--step-time", "0.2")) as job:
        wait_for(
            lambda: (
                job.status()["state"] == "running"
                and min(r["step"] for r in job.status()["ranks"]) >= 3
            ),
            60,
            "training under way",
        )
        os.kill(job.pods.procs[1].pid, signal.SIGKILL)
        run_to_end(job)
    recoveries = assert_survived(job, out, reference, scenario)
    assert sorted(recoveries[-1]["replaced"]) == [2, 3]
    assert job.pods.restarts == {1: 1}
