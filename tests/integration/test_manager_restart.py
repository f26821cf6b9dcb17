"""The manager is SIGKILLed mid-run and restarted: training never stops, no rank restarts,
and a fault after the restart is recovered bit-identically (issue 9)."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from ms_recover.localrun.wait import wait_for
from ms_recover.observability.status import query

from .jobs import job_config, results, run_to_end, trainer_job
from .managed import ManagedJob

pytestmark = pytest.mark.timeout(180)

STEPS = 400


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("reference"))
    with trainer_job(out, steps=STEPS) as job:
        run_to_end(job)
    return str(results(out)[0]["sha256"])


def numpy_job(out: str, **changes: object) -> ManagedJob:
    command = [
        sys.executable,
        "-m",
        "ms_recover.localrun.numpy_trainer",
        "--steps",
        str(STEPS),
        "--out",
        out,
        "--step-time",
        "0.02",  # about 10 s of training: time to kill and restart the manager
    ]
    return ManagedJob(job_config(**changes), command, {"OPENBLAS_NUM_THREADS": "1"}, out)


def rank_pids(job: ManagedJob) -> dict[int, int]:
    return {r["rank"]: r["pid"] for r in ranks(job)}


def ranks(job: ManagedJob) -> list[dict]:
    status = wait_for(lambda: query(job.config, 2.0), 10, "the manager's status")
    return list(status["ranks"])


def test_manager_restart_keeps_training_and_recovers_a_later_fault(tmp_path, reference, scenario):
    out = str(tmp_path)
    with numpy_job(out) as job:
        job.wait_event("job_start", 60)
        members = ranks(job)
        before = {r["rank"]: r["pid"] for r in members}
        job.kill_manager()
        job.start_manager()
        restored = job.wait_event("restored", 30)
        assert rank_pids(job) == before, "a rank process changed across the manager restart"
        steps = [(r["step"], restored["steps"][str(r["rank"])]) for r in members]
        assert all(then < now for then, now in steps), f"training paused: {steps}"
        assert min(restored["steps"].values()) < STEPS - 50, "too late to test a fault after"
        os.kill(before[3], signal.SIGKILL)
        assert job.wait_end(120) == 0
    decisions = job.events("decision")
    assert [d["strategy"] for d in decisions] == ["recover-in-place"], decisions
    assert job.events("fault")[0]["rank"] == 3
    recovery = job.events("recovery")
    assert len(recovery) == 1 and recovery[0]["ok"]
    scenario.lost_steps = recovery[0]["lost_steps"]
    assert scenario.lost_steps == 0
    final = results(out)
    assert [r["sha256"] for r in final] == [reference] * 4
    assert [r["incarnation"] for r in final] == [0, 0, 0, 1]  # only the killed rank restarted
    assert job.pods.exit_codes == {0: 0, 1: 0}


def test_a_rank_killed_while_the_manager_is_away_is_recovered_on_its_return(
    tmp_path, reference, scenario
):
    out = str(tmp_path)
    with numpy_job(out) as job:
        job.wait_event("job_start", 60)
        before = rank_pids(job)
        job.kill_manager()
        os.kill(before[1], signal.SIGKILL)  # nobody listens: the agent keeps the report
        job.start_manager()
        assert job.wait_end(120) == 0
    assert job.events("manager_restore")
    fault = job.events("fault")[0]
    assert fault["kind"] == "rank_exit" and fault["rank"] == 1
    recovery = job.events("recovery")
    assert [r["ok"] for r in recovery] == [True]
    scenario.lost_steps = recovery[0]["lost_steps"]
    assert scenario.lost_steps == 0
    final = results(out)
    assert [r["sha256"] for r in final] == [reference] * 4
    assert [r["incarnation"] for r in final] == [0, 1, 0, 0]


def test_a_manager_that_never_returns_still_stops_the_job(tmp_path):
    """The grace is bounded: without a manager, agents kill their ranks and exit 1."""
    out = str(tmp_path)
    with numpy_job(out, manager_grace_s=3.0) as job:
        job.wait_event("job_start", 60)
        pids = rank_pids(job)
        job.kill_manager()
        assert job.pods.wait(30), "the agents did not stop"
        assert job.pods.exit_codes == {0: 1, 1: 1}
        wait_for(
            lambda: not any(os.path.exists(f"/proc/{p}/cmdline") for p in pids.values()),
            10,
            "ranks gone",
        )
