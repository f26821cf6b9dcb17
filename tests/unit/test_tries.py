"""Rounds, tries and the restart budget, driven through ``decide(model, now)`` with a fake
clock (the :class:`~tests.unit.test_decide.Job` harness).

* A new fault of another rank during a round widens it (new epoch) and uses up no try; a try
  is used up by a new incident, a failed phase, or a faulty rank's replacement failing again.
* Each incident that restarts a rank counts once against its budget
  (``rank_restarts_per_hour``); a rank over budget is not restarted again, and the decision
  says why.
* A rank whose process exited 0 before it finished is a ``rank_exit`` fault once no
  WorkerDone came within the grace.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ms_recover import exitcodes
from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError
from ms_recover.manager.budget import WINDOW_S
from ms_recover.manager.decide import EARLY_EXIT_GRACE_S
from ms_recover.manager.model import Ack
from ms_recover.observability.schema import JobState

from .test_decide import RIP, Job, make_job

__all__ = ["make_job"]  # the fixture, used by name
STEP = 10
WIDENED = "widened, no try used"


def _settle(job: Job) -> None:
    """Carry the current round one phase on: every member answers, replacements register."""
    m, rnd = job.model, job.model.round
    assert rnd is not None
    job.advance(0.1)
    if m.state is JobState.STOPPING:
        job.stopped([r for r, i in m.ranks.items() if i.alive], STEP)
        for rank in sorted(rnd.replace_ranks):
            if not m.ranks[rank].alive:
                job.register_rank(rank)
    elif m.state is JobState.REBUILDING:
        job.ack(Ack.REBUILD)
    elif m.state is JobState.REPAIRING:
        job.ack(Ack.REPAIR)
        job.commit(rnd.target_step, rnd.replace_ranks)
    elif m.state is JobState.RESUMING:
        job.commit(rnd.target_step + 1)
    job.tick()


def _until(job: Job, state: JobState) -> None:
    for _ in range(6):
        if job.model.state is state:
            return
        _settle(job)
    raise AssertionError(f"never reached {state}: {job.model.state}")


@pytest.mark.parametrize(
    ("nodes", "cascade"),
    [
        # 2 x 2: one killed, a second dying at the stop, a third at the rebuild
        (2, [(1, JobState.RUNNING), (2, JobState.STOPPING), (3, JobState.REBUILDING)]),
        # 3 x 2: five of six ranks, one in each phase of the recovery
        (
            3,
            [
                (1, JobState.RUNNING),
                (2, JobState.STOPPING),
                (3, JobState.REBUILDING),
                (5, JobState.REPAIRING),
                (4, JobState.RESUMING),
            ],
        ),
    ],
    ids=["3-in-2x2", "5-in-3x2"],
)
def test_faults_of_other_ranks_widen_the_round_and_use_no_try(
    make_job: Callable[..., Job], nodes: int, cascade: list[tuple[int, JobState]]
) -> None:
    job = make_job(node_nums=nodes)  # max_tries=2
    job.running(step=STEP)
    for i, (rank, phase) in enumerate(cascade):
        _until(job, phase)
        epoch = job.model.epoch
        job.fault("rank_exit", rank)
        job.tick()
        m = job.model
        assert m.state is JobState.STOPPING and m.epoch == epoch + 1, job.decision()
        assert m.tries == {RIP: 1}
        assert (WIDENED in job.decision()["reason"]) == (i > 0), job.decision()
    _until(job, JobState.RUNNING)
    (rec,) = job.events("recovery")
    assert rec["ok"] and rec["lost_steps"] == 0
    assert rec["replaced"] == sorted(rank for rank, _ in cascade)
    assert job.model.tries == {}  # a success starts the count again


def test_a_failed_phase_uses_a_try_and_a_new_fault_then_goes_on_with_it(
    make_job: Callable[..., Job],
) -> None:
    job = make_job()
    job.running(step=STEP)
    job.fault("rank_exit", 3)
    job.tick()
    job.stopped([0, 2], STEP)  # rank 1 never answers Stop: the phase times out
    job.advance(job.config.phase_timeout_s + 0.5)
    job.tick()
    m = job.model
    assert m.state is JobState.STOPPING and m.tries == {RIP: 2}
    assert WIDENED not in job.decision()["reason"]
    job.fault("rank_exit", 0)  # a new fault of another rank: the second try goes on
    job.tick()
    assert m.state is JobState.STOPPING and m.tries == {RIP: 2}, job.decision()
    assert job.decision()["strategy"] == RIP and WIDENED in job.decision()["reason"]
    assert m.round is not None and m.round.replace_ranks == {0, 1, 3}


def test_a_replacement_that_keeps_dying_uses_up_the_tries(make_job: Callable[..., Job]) -> None:
    job = make_job()
    job.running(step=STEP)
    seen = []
    for _ in range(3):
        job.fault("rank_exit", 1)
        job.tick()
        seen.append(job.decision()["strategy"])
        if job.model.state is JobState.EXITING:
            break
        _settle(job)  # the replacement registers, then dies again
    assert seen == [RIP, RIP, "exit"]
    assert "recover-in-place: tried 2 time(s), max_tries=2" in job.decision()["reason"]
    assert job.model.exit_code == exitcodes.JOB_EXIT


def test_a_fault_of_an_incident_rank_and_another_in_one_tick_uses_a_try(
    make_job: Callable[..., Job],
) -> None:
    """Rank 1's replacement fails again together with a new rank: the round failed."""
    job = make_job()
    job.running(step=STEP)
    job.fault("rank_exit", 1)
    job.tick()
    _settle(job)
    job.fault("rank_exit", 1)
    job.fault("rank_exit", 2)
    job.tick()
    assert job.model.tries == {RIP: 2} and WIDENED not in job.decision()["reason"]


# ============================================================================ restart budget
def _later(job: Job, dt: float) -> None:
    """``dt`` seconds of training later: every rank committed one more step."""
    job.advance(dt)
    job.commit(max(i.committed_step for i in job.model.ranks.values()) + 1)


def _incident(job: Job, rank: int) -> None:
    """``rank`` fails in a running job and the recovery runs to its end."""
    job.fault("rank_exit", rank)
    job.tick()
    if job.model.state is JobState.STOPPING:
        _until(job, JobState.RUNNING)


def test_a_rank_over_its_restart_budget_escalates_with_the_reason(
    make_job: Callable[..., Job],
) -> None:
    job = make_job("recover-in-place,dump,exit", rank_restarts_per_hour=2)
    job.running(step=STEP)
    for _ in range(2):
        _later(job, 60.0)
        _incident(job, 1)
        assert job.model.state is JobState.RUNNING and job.events("recovery")[-1]["ok"]
    _later(job, 60.0)
    _incident(job, 2)  # another rank has its own budget
    assert job.model.state is JobState.RUNNING
    _later(job, 60.0)
    job.fault("rank_exit", 1)
    job.tick()
    decision = job.decision()
    assert decision["strategy"] == "dump", decision
    assert (
        "recover-in-place: restart budget used up: rank 1 (2) restarted by recoveries within "
        "the last hour (rank_restarts_per_hour=2)" in decision["reason"]
    )


def test_the_restart_budget_counts_the_last_hour_only(make_job: Callable[..., Job]) -> None:
    job = make_job(rank_restarts_per_hour=1)
    job.running(step=STEP)
    _incident(job, 1)
    _later(job, WINDOW_S - 10.0)
    job.fault("rank_exit", 1)
    job.tick()
    assert job.model.state is JobState.EXITING and "rank 1 (1)" in job.decision()["reason"]
    job2 = make_job(rank_restarts_per_hour=1)
    job2.running(step=STEP)
    _incident(job2, 1)
    _later(job2, WINDOW_S + 1.0)
    _incident(job2, 1)
    assert job2.model.state is JobState.RUNNING
    assert [r["ok"] for r in job2.events("recovery")] == [True, True]


def test_an_incident_counts_once_per_rank_against_the_budget(
    make_job: Callable[..., Job],
) -> None:
    """Rank 1's replacement fails again in the same incident (a try, not a new restart), and
    rank 3 widens it: each is restarted once in this incident."""
    job = make_job(rank_restarts_per_hour=1)
    job.running(step=STEP)
    job.fault("rank_exit", 1)
    job.tick()
    _settle(job)
    job.fault("rank_exit", 1)
    job.tick()
    job.fault("rank_exit", 3)
    job.tick()
    assert job.model.state is JobState.STOPPING, job.decision()
    _until(job, JobState.RUNNING)
    assert {r: len(t) for r, t in job.model.restarts.items()} == {1: 1, 3: 1}


def test_the_restart_budget_is_validated_and_read_from_the_environment() -> None:
    env = {"MS_RECOVER_RANK_RESTARTS_PER_HOUR": "7"}
    assert JobConfig.from_env(env).rank_restarts_per_hour == 7
    assert JobConfig().rank_restarts_per_hour == 20
    with pytest.raises(ConfigError, match="rank_restarts_per_hour must be a positive integer"):
        JobConfig(rank_restarts_per_hour=0)
    with pytest.raises(ConfigError, match="MS_RECOVER_RANK_RESTARTS_PER_HOUR='x' is not an int"):
        JobConfig.from_env({"MS_RECOVER_RANK_RESTARTS_PER_HOUR": "x"})


# ============================================================================ early exits
def test_an_exit_0_before_finishing_is_a_fault_after_the_grace(
    make_job: Callable[..., Job],
) -> None:
    job = make_job()
    job.running(step=STEP)
    job.model.early_exits[1] = (job.now, job.now - 0.02)  # what the server records
    assert job.tick() == []  # a WorkerDone may still be on its way
    job.advance(EARLY_EXIT_GRACE_S)
    job.tick()
    m = job.model
    assert m.state is JobState.STOPPING and m.early_exits == {}
    (fault,) = job.events("fault")
    assert (fault["kind"], fault["rank"]) == ("rank_exit", 1)
    assert "exit code 0 before it finished (no session.finish())" in fault["detail"]
    assert fault["detect_s"] == pytest.approx(EARLY_EXIT_GRACE_S + 0.02)
    assert m.round is not None and m.round.replace_ranks == {1}
    assert job.decision()["strategy"] == RIP


def test_a_rank_that_finished_within_the_grace_is_no_fault(
    make_job: Callable[..., Job],
) -> None:
    """A MindIO processor's WorkerDone can arrive after its agent's exit report."""
    job = make_job()
    job.running(step=STEP)
    job.model.early_exits[1] = (job.now, job.now)
    job.model.ranks[1].done = True  # its WorkerDone came
    job.advance(EARLY_EXIT_GRACE_S + 1.0)
    assert job.tick() == []
    assert job.events("fault") == []
