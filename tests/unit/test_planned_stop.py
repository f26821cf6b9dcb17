"""Planned stops (issue 26 item 1): a node whose agent got SIGTERM is leaving, not crashed.

Driven through ``decide(model, now)`` and the real executor with a fake clock and sender (the
:class:`~tests.unit.test_decide.Job` harness); the server's handler records the fact with
:func:`~ms_recover.manager.leaving.note_leaving`, as here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ms_recover import exitcodes
from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError
from ms_recover.manager.leaving import SETTLE_S, note_leaving
from ms_recover.manager.model import Ack
from ms_recover.observability.schema import EventLine, JobState, PlannedStopRecord
from ms_recover.observability.timeline import describe
from ms_recover.protocol import messages as M

from .test_decide import Job, make_job, msgs

__all__ = ["make_job"]  # the fixture, shared with test_decide

GRACE = 25.0  # what an agent with Kubernetes' default 30 s grace gives the manager


def leave(job: Job, node: int, deadline_s: float = GRACE) -> None:
    assert note_leaving(job.model, node, "SIGTERM: pod deletion or node drain", deadline_s, job.now)


def settle(job: Job) -> list:
    """Tick just before and just after the settle: nothing, then the decision."""
    job.advance(SETTLE_S - 0.05)
    assert job.tick() == [] and job.model.state is JobState.RUNNING
    job.advance(0.1)
    return job.tick()


def test_one_node_leaving_is_recovered_as_a_pod_that_comes_back(
    make_job: Callable[..., Job],
) -> None:
    job = make_job("recover-in-place,recover,exit")
    job.running(step=10)
    leave(job, 1)
    assert job.tick() == [] and job.take() == []  # settling: the ranks train on
    settle(job)
    m = job.model
    assert m.state is JobState.STOPPING and m.round is not None
    assert m.round.strategy is not None and m.round.strategy.value == "recover"
    assert m.round.replace_ranks == {2, 3} and m.round.reschedule_nodes == {1}
    sent = job.take()
    assert [(w, x.code) for w, x in msgs(sent, M.AgentExit)] == [("a1", exitcodes.RESCHEDULE)]
    assert sorted(w for w, _ in msgs(sent, M.Stop)) == ["r0", "r1"]
    decision = job.decision()
    assert "recover-in-place: node(s) [1] leaving (planned stop)" in decision["reason"]
    assert job.events("fault") == []  # a planned stop is not a fault
    # The pod comes back; its ranks are repaired from replicas with nothing lost.
    job.stopped([0, 1], 10)
    job.advance(2.0)
    job.register_agent(1)
    job.register_rank(2)
    job.register_rank(3)
    job.tick()
    assert m.state is JobState.REBUILDING
    job.ack(Ack.REBUILD)
    job.tick()
    assert m.state is JobState.REPAIRING and m.round.target_step == 10
    job.ack(Ack.REPAIR)
    job.tick()
    job.commit(11)
    job.tick()
    (recovery,) = job.events("recovery")
    assert recovery["ok"] and recovery["lost_steps"] == 0 and recovery["strategy"] == "recover"


def test_the_settle_is_short_when_the_deadline_is_near(make_job: Callable[..., Job]) -> None:
    job = make_job("recover,exit")
    job.running()
    leave(job, 1, deadline_s=1.0)  # a quarter of it: 0.25 s
    assert job.tick() == []
    job.advance(0.3)
    job.tick()
    assert job.model.state is JobState.STOPPING


def test_elastic_training_sends_the_leaving_node_away_instead_of_restarting_in_place(
    make_job: Callable[..., Job],
) -> None:
    job = make_job("elastic-training,exit")
    job.running()
    leave(job, 1)
    settle(job)
    m = job.model
    assert m.state is JobState.STOPPING and m.round is not None
    assert m.round.left_out == {2, 3}
    # They go with their pod: never taken for replacements that are back (a grow).
    assert not m.ranks[2].alive and not m.ranks[3].alive
    sent = job.take()
    assert [(w, x.code) for w, x in msgs(sent, M.AgentExit)] == [("a1", exitcodes.RESCHEDULE)]
    assert msgs(sent, M.KillRanks) == [] and msgs(sent, M.StartRanks) == []


def test_a_leaving_node_holding_the_only_replica_dumps_with_its_own_ranks(
    make_job: Callable[..., Job],
) -> None:
    job = make_job("recover,dump,exit", proc_per_node=1)  # rank r holds shard r: no replica
    job.form()
    for rank in (0, 1):
        job.model.ranks[rank].shard = rank
    job.advance(1.0)
    job.commit(10)
    leave(job, 1)
    settle(job)
    m = job.model
    assert m.round is not None and m.round.strategy is not None
    assert m.round.strategy.value == "dump", job.decision()
    assert "recover: no healthy replica left for shard 1" in job.decision()["reason"]
    assert sorted(w for w, _ in msgs(job.take(), M.Stop)) == ["r0", "r1"]  # rank 1 stops too
    job.stopped([0, 1], 10)
    job.tick()
    assert m.state is JobState.DUMPING and m.round.dump_ranks == (0, 1)
    assert msgs(job.take(), M.AgentExit) == []  # the leaving agent waits for the dump


def test_every_node_leaving_ends_the_job_as_asked(make_job: Callable[..., Job]) -> None:
    job = make_job("recover-in-place,recover,exit")
    job.running()
    leave(job, 1)
    leave(job, 0)
    job.tick()  # no settle: every node is leaving
    m = job.model
    assert m.state is JobState.EXITING and m.exit_code == exitcodes.STOPPED == 143
    (end,) = job.events("job_end")
    assert end["exit_code"] == 143 and end["reason"].startswith("asked to stop: every node")
    assert "dump not configured" in end["reason"]
    sent = job.take()
    assert sorted((w, x.code) for w, x in msgs(sent, M.AgentExit)) == [("a0", 143), ("a1", 143)]
    assert job.events("recovery") == [] and job.events("fault") == []


def test_every_node_leaving_writes_a_final_dump_first(
    make_job: Callable[..., Job], tmp_path: Path
) -> None:
    job = make_job("recover,dump,exit", dump_dir=str(tmp_path))
    job.running(step=10)
    leave(job, 0)
    leave(job, 1)
    job.tick()
    m = job.model
    assert m.state is JobState.STOPPING and m.round is not None
    assert m.round.strategy is not None and m.round.strategy.value == "dump"
    assert job.decision()["reason"].startswith("asked to stop")
    assert sorted(w for w, _ in msgs(job.take(), M.Stop)) == ["r0", "r1", "r2", "r3"]
    job.stopped([0, 1, 2, 3], 10)
    job.tick()
    assert m.state is JobState.DUMPING
    writers = m.round.dump_ranks
    for rank in writers:
        m.ranks[rank].dump = {
            "ok": True,
            "rank": rank,
            "step": 10,
            "file": f"rank_{rank}.npz",
            "format": "npz",
            "sha256": "0" * 64,
            "size": 1,
            "reason": "",
        }
    job.tick()
    assert m.state is JobState.EXITING and m.exit_code == exitcodes.STOPPED
    (end,) = job.events("job_end")
    assert end["reason"].startswith("asked to stop") and "saved by ranks" in end["reason"]
    (dump,) = job.events("dump")
    assert dump["step"] == 10 and dump["manifest"].startswith(str(tmp_path))


def test_the_last_node_leaving_mid_recovery_ends_the_job(make_job: Callable[..., Job]) -> None:
    job = make_job("recover,exit", node_nums=3)
    job.running()
    leave(job, 1)
    settle(job)
    assert job.model.state is JobState.STOPPING  # node 1 sent away (no longer alive)
    leave(job, 2)
    job.advance(0.1)
    job.tick()
    assert job.model.state is JobState.STOPPING  # node 0 stays: node 2 settles, then recover
    leave(job, 0)
    job.tick()
    assert job.model.state is JobState.EXITING and job.model.exit_code == exitcodes.STOPPED


def test_a_planned_stop_is_recorded_once(make_job: Callable[..., Job]) -> None:
    job = make_job()
    job.running()
    leave(job, 1)
    assert note_leaving(job.model, 1, "again", 10.0, job.now) is None
    assert len(job.model.pending) == 1


@pytest.mark.parametrize("raw", ["abc", "0", "-5", "inf", "1e9"])
def test_the_termination_grace_is_validated_in_one_line(raw: str) -> None:
    with pytest.raises(ConfigError, match="MS_RECOVER_TERMINATION_GRACE_S") as err:
        JobConfig.from_env({"MS_RECOVER_TERMINATION_GRACE_S": raw})
    assert "\n" not in str(err.value)


def test_the_termination_grace_defaults_to_kubernetes_30s() -> None:
    assert JobConfig.from_env({}).termination_grace_s == 30.0
    env = {"MS_RECOVER_TERMINATION_GRACE_S": "360"}
    assert JobConfig.from_env(env).termination_grace_s == 360.0


def test_the_timeline_shows_a_planned_stop_without_the_agents_own_text() -> None:
    event = EventLine(0.0, PlannedStopRecord(1, "\x1b[2J", 1025.0, 25.0))
    assert describe(event) == "LEAVING  node 1 got SIGTERM (planned stop), leaves in 25s"


def test_a_crash_while_a_planned_stop_settles_takes_it_along(make_job: Callable[..., Job]) -> None:
    job = make_job("recover,exit", node_nums=3)
    job.running()
    leave(job, 1)
    job.fault("rank_exit", 5, "rank 5 died (signal 9)")
    job.tick()
    m = job.model
    assert m.state is JobState.STOPPING and m.round is not None and m.pending == []
    assert m.round.reschedule_nodes == {1, 2}  # the leaving node is not forgotten


def test_node_0_leaving_without_a_standby_ends_the_job_as_asked(
    make_job: Callable[..., Job], tmp_path: Path
) -> None:
    """Node 0 hosts the manager: with no standby manager the job cannot outlive its pod.
    It ends at once (no settle) as a job asked to stop: a final dump first with ``dump``."""
    job = make_job("recover,dump,exit", dump_dir=str(tmp_path))
    job.running(step=10)
    leave(job, 0)
    job.tick()
    m = job.model
    assert m.state is JobState.STOPPING and m.round is not None
    assert m.round.strategy is not None and m.round.strategy.value == "dump"
    assert job.decision()["reason"].startswith(
        "asked to stop: node 0, which hosts the manager, is leaving"
    ), job.decision()
    assert msgs(job.take(), M.AgentExit) == []  # node 0's ranks may write the dump
    plain = make_job("recover,exit")
    plain.running()
    leave(plain, 0)
    plain.tick()
    (end,) = plain.events("job_end")
    assert plain.model.exit_code == exitcodes.STOPPED and "no standby manager" in end["reason"]


def test_the_managers_own_sigterm_without_a_standby_ends_the_job_as_asked(
    make_job: Callable[..., Job],
) -> None:
    job = make_job("recover,exit")
    job.running()
    job.model.stop_asked = "node 0, which hosts the manager, was asked to stop (SIGTERM)"
    job.tick()
    (end,) = job.events("job_end")
    assert end["exit_code"] == exitcodes.STOPPED
    assert (
        end["reason"]
        == f"asked to stop: {job.model.stop_asked}; no final dump (dump not configured)"
    )


def test_node_0_leaving_after_a_handover_is_an_ordinary_planned_stop(
    make_job: Callable[..., Job],
) -> None:
    """The successor manager (on node 1, with the list of managers) moves node 0 like any
    node: sent away for a new pod, repaired from replicas."""
    job = make_job("recover,exit", sched_node_rank=1, managers=("127.0.0.1:1", "127.0.0.1:2"))
    job.running(step=10)
    leave(job, 0)
    settle(job)
    m = job.model
    assert m.state is JobState.STOPPING and m.round is not None
    assert m.round.replace_ranks == {0, 1} and m.round.reschedule_nodes == {0}
    sent = job.take()
    assert [(w, x.code) for w, x in msgs(sent, M.AgentExit)] == [("a0", exitcodes.RESCHEDULE)]
