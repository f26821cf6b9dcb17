"""The manager at the end of a job: a finished rank is a survivor and a repair source until
every rank finished; members that appear after the end are told it is over; the manager
serves on, bounded, while a lost pod may come back; ranks that finished and left end the job
with the reason."""

from __future__ import annotations

from collections.abc import Callable

from ms_recover.manager.ending import may_stop
from ms_recover.manager.model import Ack
from ms_recover.observability.schema import JobState
from ms_recover.protocol import messages as M

from .test_decide import Job, make_job, msgs

__all__ = ["make_job"]  # the fixture, used by name
LAST = 29


def _done(job: Job, ranks: tuple[int, ...], waits: bool = True, alive: bool = True) -> None:
    """What WorkerDone records (and, ``alive=False``, the rank's exit 0 after it)."""
    for rank in ranks:
        info = job.model.ranks[rank]
        info.done, info.waits, info.committed_step = True, waits, LAST
        if not alive:
            info.alive, info.identity, info.exit_code = False, b"", 0


def test_finished_ranks_repair_the_replacement_then_the_job_ends_0(
    make_job: Callable[..., Job],
) -> None:
    job = make_job()
    job.running(step=LAST)
    _done(job, (0, 2, 3))
    job.fault("rank_exit", 1)
    job.tick()
    assert job.model.state is JobState.STOPPING
    assert sorted(who for who, _ in msgs(job.take(), M.Stop)) == ["r0", "r2", "r3"]
    job.stopped([0, 2, 3], LAST)
    job.register_rank(1)
    job.tick()
    assert job.model.state is JobState.REBUILDING
    assert sorted(who for who, _ in msgs(job.take(), M.Rebuild)) == ["r0", "r1", "r2", "r3"]
    job.ack(Ack.REBUILD)
    job.tick()
    repairs = dict(msgs(job.take(), M.Repair))
    assert repairs["r1"].target_step == LAST and repairs["r1"].recv_from in (0, 2, 3)
    source = f"r{repairs['r1'].recv_from}"
    assert repairs[source].send_to == [1]
    job.ack(Ack.REPAIR)
    job.tick()
    assert [m.step for _, m in msgs(job.take(), M.Resume)] == [LAST + 1] * 4
    assert job.model.ranks[0].alive  # still there: no Exit before every rank finished
    _done(job, (1,))
    job.tick()  # RESUMING -> RUNNING: the recovery succeeded
    (rec,) = job.events("recovery")
    assert rec["ok"] and rec["target_step"] == LAST and rec["lost_steps"] == 0
    job.tick()  # RUNNING -> FINISHED
    assert job.model.state is JobState.FINISHED and job.executor.exit_code() == 0
    sent = job.take()
    assert sorted((who, m.code) for who, m in msgs(sent, M.Exit)) == [
        ("r0", 0),
        ("r1", 0),
        ("r2", 0),
        ("r3", 0),
    ]
    assert sorted((who, m.code) for who, m in msgs(sent, M.AgentExit)) == [("a0", 0), ("a1", 0)]
    assert job.tick() == []  # released once


def test_a_finished_rank_that_does_not_wait_is_not_told_to_exit(
    make_job: Callable[..., Job],
) -> None:
    """A MindIO processor (its WorkerDone does not wait) leaves by MindSpore's own path."""
    job = make_job()
    job.running(step=LAST)
    _done(job, (0, 1, 2, 3), waits=False)
    job.tick()
    assert job.model.state is JobState.FINISHED
    assert msgs(job.take(), M.Exit) == []


def test_members_back_after_the_end_are_told_it_is_over(make_job: Callable[..., Job]) -> None:
    job = make_job("recover,elastic-training,exit")
    job.running(step=LAST)
    _done(job, (0, 1))
    job.fault("node_lost", -1, node=1)
    job.tick()  # recover: node 1 is rescheduled, ranks 0 and 1 stop
    job.stopped([0, 1], LAST)
    job.advance(job.config.wait_reschedule_timeout_s + 1)
    job.tick()  # late: elastic-training goes on with ranks 0 and 1
    job.stopped([0, 1], LAST)
    job.tick()
    job.ack(Ack.REBUILD, [0, 1])
    job.tick()
    job.ack(Ack.REPAIR, [0, 1])
    job.tick()
    job.tick()
    job.tick()
    assert job.model.state is JobState.FINISHED, job.model.state
    assert job.model.active == frozenset({0, 1})
    now = job.now
    assert not may_stop(job.model, now, 1e6), "node 1 may still come back"
    job.take()
    # The pod comes back: its agent and then its ranks register (as the server records them).
    job.register_agent(1)
    job.model.agents[1].released = False
    job.tick()
    assert [(who, m.code) for who, m in msgs(job.take(), M.AgentExit)] == [("a1", 0)]
    for rank in (2, 3):
        job.register_rank(rank)
        job.model.ranks[rank].exit_code = None
    job.tick()
    assert sorted((who, m.code) for who, m in msgs(job.take(), M.Exit)) == [("r2", 0), ("r3", 0)]
    assert job.tick() == []
    assert not may_stop(job.model, now, 0.1), "their exits are not reported yet"
    for rank in (2, 3):
        job.model.ranks[rank].exit_code = 0
    for rank in (0, 1):
        job.model.ranks[rank].exit_code = 0
    assert may_stop(job.model, now, 0.1)


def test_the_wait_for_a_lost_pod_after_the_end_is_bounded(make_job: Callable[..., Job]) -> None:
    job = make_job()
    job.running(step=LAST)
    agent = job.model.agents[1]
    agent.alive = False  # lost (never released), just before every rank finished
    _done(job, (0, 1, 2, 3))
    job.tick()
    assert job.model.state is JobState.FINISHED
    for info in job.model.ranks.values():
        info.exit_code = 0
    assert not may_stop(job.model, job.now, 1e6)
    window = job.config.silence_s + job.config.wait_reschedule_timeout_s
    assert may_stop(job.model, agent.last_seen + window + 0.01, 0.0)


def test_ranks_that_finished_and_left_end_the_job_with_the_reason(
    make_job: Callable[..., Job],
) -> None:
    job = make_job()
    job.running(step=LAST)
    _done(job, (0, 2, 3), alive=False)  # no session.finish(): they are gone
    job.fault("rank_exit", 1)
    job.tick()
    assert job.model.state is JobState.EXITING
    (end,) = job.events("job_end")
    assert end["exit_code"] == 87
    assert "ranks [0, 2, 3] finished training and left" in end["reason"], end["reason"]


def test_ranks_that_leave_during_the_recovery_end_it_without_a_timeout(
    make_job: Callable[..., Job],
) -> None:
    job = make_job()
    job.running(step=LAST)
    job.fault("rank_exit", 1)
    job.tick()
    assert job.model.state is JobState.STOPPING
    _done(job, (0, 2, 3), alive=False)  # they finish and exit instead of stopping
    job.register_rank(1)
    job.tick()
    assert job.model.state is JobState.EXITING
    (end,) = job.events("job_end")
    assert "ranks [0, 2, 3] finished training and left" in end["reason"], end["reason"]


def test_a_node_whose_ranks_all_finished_and_left_is_not_lost(
    make_job: Callable[..., Job],
) -> None:
    """Its agent ends on its own once its ranks exited 0: nothing to recover."""
    job = make_job()
    job.running(step=LAST)
    _done(job, (2, 3), alive=False)
    job.advance(job.config.silence_s + 1, silent=("a1",))
    assert job.tick() == []
    assert job.model.state is JobState.RUNNING and not job.events("fault")
