"""Replica divergence (issue 9 #4): the pure comparison, and the manager acting on it.

The manager tests reuse ``test_decide``'s :class:`Job` (decide and the real executor, a fake
clock and hand-set member facts) around a real ManagerServer's model and executor: digests
arrive with STOPPED at a stop, or as StateDigest messages through the server's handler in
steady state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError
from ms_recover.manager.divergence import DIVERGED, Report, compare, faults_of, judge
from ms_recover.manager.model import Ack
from ms_recover.manager.server import ManagerServer
from ms_recover.observability.events import EventLog
from ms_recover.observability.schema import EventLine, FaultKind, JobState
from ms_recover.observability.timeline import describe
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Envelope
from tests.unit.test_decide import Job, msgs

A, B, C = "aaaaaaaa", "bbbbbbbb", "cccccccc"


class ServerJob(Job):
    """``test_decide``'s Job on a real ManagerServer's model and executor (bound to an
    ephemeral port on 127.0.0.1, never served), so messages go through its handlers."""

    def __init__(self, strategies: str, **changes: Any) -> None:
        super().__init__(strategies, **changes)
        self.server = ManagerServer(
            self.config, events=EventLog(), clock=self.clock, bind="127.0.0.1"
        )
        self.model, self.executor = self.server.model, self.server.executor
        self.executor.sender = self.sender


MakeJob = Callable[..., ServerJob]


@pytest.fixture
def make_job() -> Iterator[MakeJob]:
    jobs: list[ServerJob] = []

    def make(strategies: str = "recover-in-place,recover,exit", **changes: Any) -> ServerJob:
        jobs.append(ServerJob(strategies, **changes))
        return jobs[-1]

    yield make
    for job in jobs:
        job.server.close()


# ============================================================================ pure comparison
def test_agreeing_replicas_give_no_verdict() -> None:
    assert compare({r: Report(0, 7, A) for r in range(4)}) == []
    assert judge(0, 7, {0: A}) is None  # a lone replica has nothing to disagree with


@pytest.mark.parametrize(
    ("digests", "majority", "minority"),
    [
        ({0: A, 1: A, 2: B}, (0, 1), (2,)),
        ({0: B, 1: A, 2: A, 3: A}, (1, 2, 3), (0,)),
        ({0: A, 1: A, 2: A, 3: B, 4: C}, (0, 1, 2), (3, 4)),
    ],
)
def test_a_strict_majority_names_the_minority(
    digests: dict[int, str], majority: tuple[int, ...], minority: tuple[int, ...]
) -> None:
    verdict = judge(0, 99, digests)
    assert verdict is not None and verdict.decided
    assert verdict.majority == majority and verdict.minority == minority
    assert verdict.ranks == minority
    assert f"ranks {list(minority)} differ from the majority {list(majority)}" in verdict.reason


@pytest.mark.parametrize(
    "digests",
    [{0: A, 1: B}, {0: A, 1: A, 2: B, 3: B}, {0: A, 1: A, 2: B, 3: C}, {0: A, 1: B, 2: C}],
)
def test_without_a_strict_majority_nothing_is_guessed(digests: dict[int, str]) -> None:
    verdict = judge(1, 99, digests)
    assert verdict is not None and not verdict.decided
    assert verdict.majority == () and verdict.minority == ()
    assert verdict.ranks == tuple(sorted(digests))
    assert "replicas of shard 1 at step 99 disagree with no majority" in verdict.reason
    assert f"{A}: ranks [0" in verdict.reason and "no replica can be trusted" in verdict.reason
    assert verdict.record().fields()["outcome"] == "escalate"


def test_only_replicas_of_one_shard_at_one_step_are_compared() -> None:
    reports = {
        0: Report(0, 10, A),
        1: Report(0, 10, A),
        2: Report(0, 9, B),  # behind: its own group, alone
        3: Report(1, 10, B),  # another shard
        4: Report(1, 10, B),
        5: Report(0, 10, ""),  # no state provider
        6: Report(0, -1, C),  # never trained
    }
    assert compare(reports) == []
    reports[4] = Report(1, 10, C)
    (verdict,) = compare(reports)
    assert (verdict.shard, verdict.step, verdict.decided) == (1, 10, False)


def test_the_event_fields_and_faults_name_ranks_and_digests() -> None:
    verdict = judge(0, 199, {0: A, 1: B, 2: A})
    assert verdict is not None
    assert verdict.record().fields() == {
        "shard": 0,
        "step": 199,
        "ranks": [1],
        "majority": [0, 2],
        "digests": {"0": A, "1": B, "2": A},
        "outcome": "repair",
        "reason": verdict.reason,
    }
    (fault,) = faults_of(verdict, lambda r: r // 2, now=5.0)
    assert (fault.kind, fault.rank, fault.node_rank, fault.corrupt) == (DIVERGED, 1, 0, True)
    assert DIVERGED is FaultKind.DIVERGED
    assert B in fault.detail and "rank 1" in fault.detail


# ============================================================================ config
def test_the_check_interval_is_configurable_and_validated() -> None:
    assert JobConfig().digest_every_steps == 100
    assert JobConfig.from_env({"MS_RECOVER_DIGEST_EVERY_STEPS": "0"}).digest_every_steps == 0
    cfg = JobConfig.from_env({"MS_RECOVER_DIGEST_EVERY_STEPS": "25"})
    assert cfg.digest_every_steps == 25
    assert cfg.member_env()["MS_RECOVER_DIGEST_EVERY_STEPS"] == "25"
    with pytest.raises(ConfigError, match="must be 0 \\(off\\) or 1..1000000000 steps, got -1"):
        JobConfig(digest_every_steps=-1)
    with pytest.raises(ConfigError, match="MS_RECOVER_DIGEST_EVERY_STEPS='often' is not an int"):
        JobConfig.from_env({"MS_RECOVER_DIGEST_EVERY_STEPS": "often"})
    with pytest.raises(ConfigError, match="digest_every_steps must be an integer"):
        JobConfig(digest_every_steps=1.5)  # type: ignore[arg-type]


# ============================================================================ at a stop
def _stop_with_digests(job: ServerJob, digests: dict[int, str], step: int = 10) -> None:
    """RUNNING at ``step`` -> rank 3 dies -> survivors answer STOPPED with ``digests``."""
    job.running(step=step)
    job.fault("rank_exit", 3)
    job.tick()
    job.advance(0.1)
    job.stopped(list(digests), step)
    for rank, digest in digests.items():
        job.model.ranks[rank].stop_digest = digest
    job.register_rank(3)


def test_a_stopped_minority_is_repaired_from_the_majority(make_job: MakeJob) -> None:
    job = make_job()
    _stop_with_digests(job, {0: A, 1: B, 2: A})
    job.tick()
    (event,) = job.events("divergence")
    assert event["ranks"] == [1] and event["majority"] == [0, 2] and event["outcome"] == "repair"
    assert event["digests"] == {"0": A, "1": B, "2": A} and event["step"] == 10
    assert job.model.round is not None and job.model.round.untrusted == {1}
    job.tick()  # the trusted replicas agree now: on to the rebuild
    assert job.model.state is JobState.REBUILDING and len(job.events("divergence")) == 1
    job.ack(Ack.REBUILD)
    job.take()
    job.tick()
    repairs = dict(msgs(job.take(), M.Repair))
    assert repairs["r1"].recv_from in (0, 2) and repairs["r3"].recv_from in (0, 2)
    assert repairs["r1"].send_to == [] and job.model.round.target_step == 10


def test_stopped_replicas_with_no_majority_escalate_with_the_reason(make_job: MakeJob) -> None:
    job = make_job("recover-in-place,recover,dump,exit")
    _stop_with_digests(job, {0: A, 1: B, 2: C})  # three survivors, three digests
    job.tick()
    (event,) = job.events("divergence")
    assert event["outcome"] == "escalate" and event["ranks"] == [0, 1, 2]
    decision = job.decision()
    assert decision["strategy"] == "exit"
    assert "replicas diverged" in decision["reason"]
    assert "no healthy replica left for shard 0" in decision["reason"]
    assert job.model.state is JobState.EXITING
    faults = [f for f in job.events("fault") if f["kind"] == DIVERGED]
    assert sorted(f["rank"] for f in faults) == [0, 1, 2]
    assert "disagree with no majority" in faults[0]["detail"]


def test_a_dump_is_never_written_by_a_replica_found_diverged_at_the_stop(
    make_job: MakeJob,
) -> None:
    job = make_job("dump,exit")
    _stop_with_digests(job, {0: B, 1: A, 2: A})
    job.tick()
    assert job.model.round is not None and job.model.round.untrusted == {0}
    job.tick()
    assert job.model.state is JobState.DUMPING
    assert job.model.round.dump_ranks == (1,)  # rank 0, the lowest, would have been chosen
    assert [who for who, _ in msgs(job.take(), M.Dump)] == ["r1"]


def test_a_diverged_replica_stays_untrusted_when_another_fault_interrupts_its_repair(
    make_job: MakeJob,
) -> None:
    # retry repairs rank 2 in place; rank 0 dies before the repair: the next strategy replaces
    # rank 0 and must still repair rank 2 (never copy from it), with its fault kept.
    job = make_job("retry,recover-in-place,exit")
    job.running(step=99)
    for rank, digest in ((0, A), (1, A), (2, B), (3, A)):
        _digest(job, rank, 99, digest)
    job.tick()
    assert job.decision()["strategy"] == "retry" and job.model.state is JobState.STOPPING
    job.fault("rank_exit", 0)
    job.tick()
    rnd = job.model.round
    assert job.decision()["strategy"] == "recover-in-place" and rnd is not None
    assert rnd.replace_ranks == {0} and rnd.untrusted == {2}
    job.stopped([1, 2, 3], 99)
    job.register_rank(0)
    job.tick()
    job.ack(Ack.REBUILD)
    job.take()
    job.tick()
    repairs = dict(msgs(job.take(), M.Repair))
    assert repairs["r0"].recv_from in (1, 3) and repairs["r2"].recv_from in (1, 3)
    assert repairs["r2"].send_to == []


def test_agreeing_stopped_replicas_go_straight_on(make_job: MakeJob) -> None:
    job = make_job()
    _stop_with_digests(job, {0: A, 1: A, 2: A})
    job.tick()
    assert job.model.state is JobState.REBUILDING and job.events("divergence") == []


# ============================================================================ steady state
def _digest(job: ServerJob, rank: int, step: int, digest: str) -> None:
    msg = M.StateDigest(rank, step, digest)
    env = Envelope("unit", job.model.epoch, f"rank:{rank}", 0, msg)
    job.server.workers.on_state_digest(f"r{rank}".encode(), env, msg)


def test_a_steady_state_minority_becomes_a_diverged_fault_repaired_by_retry(
    make_job: MakeJob,
) -> None:
    job = make_job("retry,recover-in-place,exit")
    job.running(step=99)
    for rank, digest in ((0, A), (1, A), (2, B)):
        _digest(job, rank, 99, digest)
    assert job.model.pending == [] and job.events("divergence") == []  # rank 3 not yet in
    _digest(job, 3, 99, A)
    (event,) = job.events("divergence")
    assert event["ranks"] == [2] and event["digests"]["2"] == B and event["step"] == 99
    job.tick()
    decision = job.decision()
    assert decision["strategy"] == "retry" and decision["replace"] == []
    assert job.model.round is not None and job.model.round.untrusted == {2}
    assert job.model.ranks[2].alive  # a diverged rank is not lost: it is repaired in place
    assert all(i.digests == {} for i in job.model.ranks.values())


def test_a_steady_state_minority_is_replaced_without_retry(
    make_job: MakeJob,
) -> None:
    job = make_job()
    job.running(step=99)
    for rank, digest in ((0, A), (1, B), (2, A), (3, A)):
        _digest(job, rank, 99, digest)
    job.tick()
    assert job.decision()["strategy"] == "recover-in-place"
    assert job.model.round is not None and job.model.round.replace_ranks == {1}


def test_two_steady_replicas_that_differ_end_the_job_without_guessing(
    make_job: MakeJob,
) -> None:
    job = make_job("retry,recover-in-place,recover,exit", node_nums=1)
    job.running(step=199)
    _digest(job, 0, 199, A)
    _digest(job, 1, 199, B)
    (event,) = job.events("divergence")
    assert event["outcome"] == "escalate" and "no majority" in event["reason"]
    job.tick()
    decision = job.decision()
    assert decision["strategy"] == "exit" and job.model.state is JobState.EXITING
    for skipped in ("retry", "recover-in-place"):
        assert (
            f"{skipped}: no healthy replica left for shard 0 (ranks [0, 1])" in (decision["reason"])
        )


def test_steady_digests_count_in_any_state_among_live_replicas_and_stay_bounded(
    make_job: MakeJob,
) -> None:
    job = make_job()
    job.running(step=10)
    for step in range(0, 600, 100):
        _digest(job, 0, step, A)
    assert sorted(job.model.ranks[0].digests) == [200, 300, 400, 500]
    job.fault("rank_exit", 3)
    job.tick()
    assert job.model.state is JobState.STOPPING and not job.model.ranks[3].alive
    _digest(job, 1, 500, A)
    _digest(job, 2, 500, B)  # rank 3 is gone: the live ranks 0..2 compare, 2 is the minority
    (event,) = job.events("divergence")
    assert event["ranks"] == [2] and event["majority"] == [0, 1]
    assert [f.rank for f in job.model.pending] == [2]


def test_a_restarted_rank_starts_with_no_digests(make_job: MakeJob) -> None:
    job = make_job()
    job.running(step=10)
    _digest(job, 3, 99, B)
    job.model.ranks[3].alive = False  # its process died; a new one registers
    hello = M.WorkerHello(3, 1, 4242, 1, "tcp://h3:9", -1, 0)
    job.server.workers.on_hello(b"r3-new", Envelope("unit", 1, "rank:3", 0, hello), hello)
    assert job.model.ranks[3].alive and job.model.ranks[3].digests == {}


def test_the_demo_timeline_shows_a_divergence() -> None:
    verdict = judge(0, 19, {0: A, 1: B, 2: A, 3: A})
    assert verdict is not None
    assert describe(EventLine(0.0, verdict.record())) == f"DIVERGED {verdict.reason}"


def test_a_rank_being_dealt_with_is_not_reported_again(make_job: MakeJob) -> None:
    job = make_job("retry,recover-in-place,exit")
    job.running(step=99)
    for step in (99, 109):  # the next check arrives before the manager has acted
        for rank, digest in ((0, A), (1, A), (2, B), (3, A)):
            _digest(job, rank, step, digest)
    assert [f.rank for f in job.model.pending] == [2] and len(job.events("divergence")) == 1
    job.tick()
    assert job.model.round is not None and job.model.round.untrusted == {2}
    for rank, digest in ((0, A), (1, A), (2, B), (3, A)):
        _digest(job, rank, 119, digest)  # sent just before the STOP reached them
    assert job.model.pending == [] and len(job.events("divergence")) == 1


def test_two_replicas_are_reported_once_and_nothing_after_the_end(
    make_job: MakeJob,
) -> None:
    job = make_job("retry,exit", node_nums=1)
    job.running(step=9)
    for step in (9, 19):
        _digest(job, 0, step, A)
        _digest(job, 1, step, B)
    assert len(job.events("divergence")) == 1 and len(job.model.pending) == 2
    job.tick()
    assert job.model.state is JobState.EXITING
    _digest(job, 0, 29, A)
    _digest(job, 1, 29, C)
    assert len(job.events("divergence")) == 1 and job.model.ranks[0].digests == {}
