"""Heartbeat groups on a real job (numpy trainer, 2 nodes x 2 ranks, groups of 2 nodes: node 0's
agent leads, node 1's beats through it; docs/design.md §1c).

Groups are automatic from 256 nodes on; ``group_nodes=2`` forces them here. The job runs to
the end bit-identical with node 1 heard through node 0; losing the leader's node loses only
that node (node 1 moves its beats to the manager and is never declared lost); losing the
member's node is found as without groups.
"""

from __future__ import annotations

import os
import signal

import pytest

from ms_recover.localrun.faults import Faults
from ms_recover.localrun.wait import wait_for

from .jobs import results, run_to_end, shared_reference_sha, trainer_job

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="session")  # shared: the scenarios spread over xdist workers
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    return shared_reference_sha(tmp_path_factory)


def _via(job) -> dict[int, int | None]:
    return {a["node_rank"]: a["beats_via"] for a in job.status()["agents"]}


def test_a_job_runs_with_node_1_heard_through_node_0(tmp_path, reference):
    out = str(tmp_path)
    with trainer_job(out, group_nodes=2, extra=("--step-time", "0.1")) as job:
        wait_for(lambda: _via(job) == {0: None, 1: 0}, 60, "node 1's beats through node 0")
        run_to_end(job)
    assert job.exit_code == 0
    assert not job.find("fault")
    assert [r["sha256"] for r in results(out)] == [reference] * 4


def _faults(job) -> list[tuple[str, int]]:
    return [(f["kind"], f["node_rank"]) for f in job.find("fault")]


def test_the_leaders_node_lost_loses_only_that_node(tmp_path, reference):
    """The leader's pod comes back after the silence window: node 0 is declared lost, and
    node 1, whose beats went through it, is not (it beats to the manager in time)."""
    out = str(tmp_path)
    faults = Faults().node(rank=0, step=12)
    with trainer_job(
        out,
        faults,
        strategy="recover,exit",
        reschedule_delay_s=3.0,
        group_nodes=2,
        sched_node_rank=1,  # node 0's pod may move: the scheduler is on node 1
    ) as job:
        run_to_end(job)
    assert job.exit_code == 0, _faults(job)
    assert _faults(job) == [("node_lost", 0)]
    (rec,) = job.find("recovery", ok=True)
    assert rec["replaced"] == [0, 1] and rec["lost_steps"] == 0
    assert [r["sha256"] for r in results(out)] == [reference] * 4


def test_a_members_node_lost_is_found(tmp_path, reference):
    out = str(tmp_path)
    faults = Faults().node(rank=2, step=12)
    with trainer_job(
        out, faults, strategy="recover,exit", reschedule_delay_s=3.0, group_nodes=2
    ) as job:
        run_to_end(job)
    assert job.exit_code == 0
    assert _faults(job) == [("node_lost", 1)]
    assert [r["sha256"] for r in results(out)] == [reference] * 4


def test_a_spare_node_in_the_leaders_place_leads_the_group(tmp_path, reference):
    """Node 0's pod lost with a spare pod waiting: the spare takes node 0's place and leads
    its group, and node 1 beats through it again."""
    out = str(tmp_path)
    with trainer_job(
        out,
        Faults().node(rank=0, step=6),
        strategy="recover",
        extra=("--step-time", "0.3"),
        reschedule_delay_s=4.0,  # the spare takes the place first; the pod is the next spare
        spare_pods=1,
        group_nodes=2,
        sched_node_rank=1,
    ) as job:
        wait_for(lambda: job.find("spare_promoted"), 60, "the spare taking node 0's place")
        wait_for(lambda: _via(job) == {0: None, 1: 0}, 30, "node 1's beats through the spare")
        run_to_end(job)
    assert job.exit_code == 0, _faults(job)
    assert _faults(job) == [("node_lost", 0)]
    assert [r["sha256"] for r in results(out)] == [reference] * 4


def _kill_rank_1_through_the_leader(job) -> None:
    """Once node 1 beats through node 0 and the job trains, SIGKILL rank 1 (node 0, a process
    this test started): the round's STOP to node 1 goes through node 0's agent."""
    m = job.server.model
    wait_for(lambda: _via(job) == {0: None, 1: 0}, 60, "node 1's beats through node 0")
    wait_for(lambda: m.ranks[1].committed_step >= 3, 60, "training")
    os.kill(m.ranks[1].pid, signal.SIGKILL)


def test_a_stop_goes_through_the_leader_and_back(tmp_path, reference):
    """Rank 1 (node 0) killed with node 1 heard through node 0: node 1's ranks are stopped
    through node 0's agent and answer through it; the recovery loses nothing. (A slower
    heartbeat than the tests' 0.5 s: a member falls back to the manager when its leader's
    answer takes half an agent beat, which a loaded 2-core host can take.)"""
    out = str(tmp_path)
    with trainer_job(out, group_nodes=2, heartbeat_s=1.0, extra=("--step-time", "0.3")) as job:
        _kill_rank_1_through_the_leader(job)
        run_to_end(job)
        relay = job.server.relay
    assert job.exit_code == 0, _faults(job)
    assert _faults(job) == [("rank_exit", 0)]
    assert relay.group_stops == 1 and relay.group_stopped == 2
    (rec,) = job.find("recovery", ok=True)
    assert rec["lost_steps"] == 0
    assert [r["sha256"] for r in results(out)] == [reference] * 4


def test_a_stop_lost_on_the_way_through_the_leader_goes_again(tmp_path, reference):
    """The leader never gets the group's STOP (dropped at the manager): node 1's ranks get it
    again directly two agent beats later, and the recovery still loses nothing."""
    out = str(tmp_path)
    lost: list[int] = []
    with trainer_job(out, group_nodes=2, heartbeat_s=1.0, extra=("--step-time", "0.3")) as job:
        job.server.relay._send_group = lambda ident, epoch, msg: lost.append(epoch)
        _kill_rank_1_through_the_leader(job)
        run_to_end(job)
    assert job.exit_code == 0, _faults(job)
    assert len(lost) == 1 and _faults(job) == [("rank_exit", 0)]
    (rec,) = job.find("recovery", ok=True)
    assert rec["lost_steps"] == 0
    assert rec["phases"]["stop"] >= 2 * job.config.agent_heartbeat_s
    assert [r["sha256"] for r in results(out)] == [reference] * 4


def test_a_member_that_moved_to_another_manager_links_to_its_leader_under_its_new_name():
    """The leader names a member by the identity it beats under, and the manager knows the
    member by its identity at the manager, which changes when the agent moves to another
    manager (a takeover): GroupAt from the new manager links again under the new one, or every
    member's beats would be refused there and the members declared lost."""
    import sys

    from ms_recover.agent.agent import Agent
    from ms_recover.config import JobConfig
    from ms_recover.protocol import messages as M

    cfg = JobConfig(node_nums=4, node_rank=1, proc_per_node=1, manager_port=1, group_nodes=2)
    agent = Agent(cfg, [sys.executable, "t.py"])
    try:
        at = M.GroupAt(0, "tcp://127.0.0.1:9")
        agent._handle(at)
        first = agent.group
        assert first is not None and first.chan.identity == agent.chan.identity
        agent._handle(at)  # said again: the same link
        assert agent.group is first
        agent.chan.reconnect(agent.chan.identity + b".m1.7")  # as a move to a standby does
        agent._handle(at)
        assert agent.group is not first and agent.group.chan.identity == agent.chan.identity
    finally:
        agent.close()
