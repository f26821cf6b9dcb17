"""Spare nodes (docs/design.md §1f): the pure decision (:mod:`ms_recover.manager.sparenodes`)
and its execution, driven through ``decide`` and the real executor with a fake clock and a
fake sender (the :class:`Job` of ``test_decide``)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

import pytest

from ms_recover import env as E
from ms_recover import exitcodes
from ms_recover.agent import main as agent_main
from ms_recover.errors import ConfigError
from ms_recover.manager import actions as A
from ms_recover.manager import sparenodes
from ms_recover.manager.model import SpareNode
from ms_recover.manager.status import status_of
from ms_recover.observability.metrics import ManagerCollector
from ms_recover.observability.schema import JobState
from ms_recover.observability.status import render
from ms_recover.protocol import messages as M

from .test_decide import Job, make_job, msgs
from .test_metrics import _samples

__all__ = ["make_job"]  # the fixture, used by name


def add_spare(job: Job, pid: int, since: float | None = None) -> bytes:
    """What the server's SpareHello handler records."""
    ident = f"s.{pid}".encode()
    when = job.now if since is None else since
    job.model.spares[ident] = SpareNode(ident, pid, f"10.0.1.{pid % 250}", when, job.now, 2)
    return ident


def beat_spares(job: Job) -> None:
    for spare in job.model.spares.values():
        spare.last_seen = job.now


def lose_node_1(job: Job) -> None:
    """Node 1's pod goes silent past ``silence_s`` (1.5 s): a ``recover`` round starts."""
    job.advance(1.6, silent=("a1", "r2", "r3"))
    beat_spares(job)
    job.tick()
    assert job.model.state is JobState.STOPPING and job.model.round is not None
    assert job.model.round.reschedule_nodes == {1}


def test_without_a_spare_the_round_waits_for_the_recreated_pod(
    make_job: Callable[..., Job],
) -> None:
    job = make_job("recover,exit")
    job.running()
    lose_node_1(job)
    job.advance(0.1)
    job.tick()
    assert msgs(job.take(), M.SpareAssign) == []
    assert job.events("spare_promoted") == [] and job.model.promoted == {}


def test_a_lost_node_goes_to_the_spare_at_once(make_job: Callable[..., Job]) -> None:
    job = make_job("recover,exit")
    job.running()
    ident = add_spare(job, 700)
    lose_node_1(job)
    job.take()
    job.advance(0.02)
    beat_spares(job)
    job.tick()
    assert msgs(job.take(), M.SpareAssign) == [("s.700", M.SpareAssign(1, job.actions[0].reason))]
    assert job.model.spares == {} and job.model.promoted == {1: (ident, job.now)}
    (event,) = job.events("spare_promoted")
    assert (event["node_rank"], event["pid"], event["spares_left"]) == (1, 700, 0)
    assert event["waited_s"] >= 1.6  # since node 1 was last heard
    # Given once: the next ticks wait for the spare's agent to register as node 1.
    job.advance(0.5)
    job.tick()
    assert msgs(job.take(), M.SpareAssign) == []


def test_the_oldest_live_spare_is_given_the_lowest_waiting_node() -> None:
    job = Job("recover,exit", node_nums=3)
    job.running()
    add_spare(job, 801, since=job.now - 5.0)
    add_spare(job, 802, since=job.now - 9.0)  # the longest warm
    job.advance(1.6, silent=("a1", "r2", "r3", "a2", "r4", "r5"))
    beat_spares(job)
    job.tick()
    assert job.model.round is not None and job.model.round.reschedule_nodes == {1, 2}
    got = sparenodes.promotions(job.model, job.now)
    assert [(a.node, a.identity) for a in got if isinstance(a, A.PromoteSpare)] == [
        (1, b"s.802"),
        (2, b"s.801"),
    ]
    job.executor.events.close()


def test_a_silent_spare_is_never_given_a_node_and_is_forgotten(
    make_job: Callable[..., Job],
) -> None:
    job = make_job("recover,exit")
    job.running()
    add_spare(job, 900)
    lose_node_1(job)  # ... and the spare stops answering from here
    job.model.spares[b"s.900"].last_seen = job.now - 1.0
    job.advance(0.6)
    assert sparenodes.promotions(job.model, job.now) == []
    job.tick()
    assert job.model.spares == {} and msgs(job.take(), M.SpareAssign) == []
    (left,) = [e for e in job.events("spare") if e["left"]]
    assert left["pid"] == 900 and "silent" in left["reason"]


def test_a_spare_is_silent_only_as_of_the_last_empty_queue(make_job: Callable[..., Job]) -> None:
    """A manager that has not read its queue since ``heard_at`` does not forget a spare whose
    hello may be waiting there."""
    job = make_job("recover,exit")
    job.running()
    add_spare(job, 708)
    job.model.heard_at = job.now + 0.5
    job.advance(3.0)
    assert sparenodes.dropouts(job.model, job.now) == []
    job.model.heard_at = job.now
    assert [a.identity for a in sparenodes.dropouts(job.model, job.now)] == [b"s.708"]


def test_a_spare_that_never_registered_is_given_up_for_the_next_one(
    make_job: Callable[..., Job],
) -> None:
    job = make_job("recover,exit")
    job.running()
    add_spare(job, 701)
    lose_node_1(job)
    job.advance(0.02)
    beat_spares(job)
    job.tick()
    add_spare(job, 702)  # a second spare; the first never says hello as node 1
    job.advance(1.0)
    beat_spares(job)
    assert sparenodes.waiting_nodes(job.model, job.now) == []  # within silence_s: wait
    job.advance(0.6)
    beat_spares(job)
    job.take()
    job.tick()
    assert [who for who, _ in msgs(job.take(), M.SpareAssign)] == ["s.702"]


def test_a_node_whose_agent_came_back_needs_no_spare(make_job: Callable[..., Job]) -> None:
    job = make_job("recover,exit")
    job.running()
    lose_node_1(job)
    job.register_agent(1)  # the recreated pod was first
    add_spare(job, 703)
    job.tick()
    assert msgs(job.take(), M.SpareAssign) == [] and b"s.703" in job.model.spares


def test_the_job_end_sends_every_spare_away(make_job: Callable[..., Job]) -> None:
    job = make_job("recover,exit")
    job.running()
    add_spare(job, 704)
    for info in job.model.ranks.values():
        info.done = True
    job.tick()
    assert job.model.state is JobState.FINISHED
    exits = msgs(job.take(), M.AgentExit)
    assert ("s.704", M.AgentExit(exitcodes.OK, exits[-1][1].reason)) in exits
    assert job.model.spares == {}


def test_a_failed_job_sends_its_spares_away_with_its_code(make_job: Callable[..., Job]) -> None:
    job = make_job("recover-in-place,exit")
    job.running()
    add_spare(job, 705)
    job.advance(2.0, silent=("a1",))
    job.tick()
    assert job.model.state is JobState.EXITING
    (code,) = {m.code for who, m in msgs(job.take(), M.AgentExit) if who == "s.705"}
    assert code == exitcodes.JOB_EXIT


def test_status_and_metrics_show_the_spares(make_job: Callable[..., Job]) -> None:
    job = make_job("recover,exit")
    job.running()
    collector = ManagerCollector(lambda: status_of(job.model, job.now), job.executor.events)
    assert _samples(collector)[("ms_recover_spare_nodes", ())] == 0
    add_spare(job, 706, since=job.now - 3.0)
    assert _samples(collector)[("ms_recover_spare_nodes", ())] == 1
    status = status_of(job.model, job.now)
    assert status["spares"] == [
        {"pid": 706, "pod_ip": "10.0.1.206", "warm": 2, "waiting_s": 3.0, "silent_s": 0.0}
    ]
    assert "spare nodes: 1: pid 706 on 10.0.1.206 (2 warm, 3.0s)" in render(status)


def _agent_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    agent_main.configure(p)
    return p.parse_args([*argv, "--", "python", "train.py"])


def test_a_spare_node_is_asked_for_or_is_a_replica_beyond_the_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in (E.SPARE, E.NODE_RANK, E.NODE_NUMS, E.WORKER_NUM, E.LOCAL_WORKER):
        monkeypatch.delenv(name, raising=False)
    base = ("--node-nums", "2", "--proc-per-node", "2")
    assert not agent_main.is_spare(_agent_args(*base, "--node-rank", "1"))
    assert agent_main.is_spare(_agent_args(*base, "--node-rank", "1", "--spare", "on"))
    # One extra Kubernetes replica: its node rank is the job's node count.
    monkeypatch.setenv(E.NODE_RANK, "2")
    args = _agent_args(*base)
    assert agent_main.is_spare(args)
    assert agent_main.config_from_args(args).node_rank == 0  # a placeholder until promoted
    assert agent_main.is_spare(_agent_args(*base, "--node-rank", "2"))  # as the sample passes it
    # Without an explicit node count, out of range is an error (the operator's MS_WORKER_NUM
    # would count the spare's workers too).
    monkeypatch.setenv(E.WORKER_NUM, "4")
    monkeypatch.setenv(E.LOCAL_WORKER, "2")
    assert not agent_main.is_spare(_agent_args())
    with pytest.raises(ConfigError, match="node_rank 5 is outside 0..1"):
        agent_main.config_from_args(_agent_args("--node-rank", "5"))
    monkeypatch.setenv(E.SPARE, "off")
    with pytest.raises(ConfigError, match="node_rank 2 is outside 0..1"):
        agent_main.config_from_args(_agent_args(*base))
    monkeypatch.setenv(E.SPARE, "maybe")
    with pytest.raises(ConfigError, match="MS_RECOVER_SPARE='maybe' is not valid; use on, off"):
        agent_main.is_spare(_agent_args(*base))


def test_the_scheduler_node_is_never_given_to_a_spare(make_job: Callable[..., Job]) -> None:
    """Node 0 is rescheduled only after a manager takeover, whose recreated pod brings the
    standby manager along."""
    job = make_job("recover,exit")
    job.running()
    add_spare(job, 707)
    lose_node_1(job)
    assert job.model.round is not None
    job.model.round = dataclasses.replace(job.model.round, reschedule_nodes=frozenset({0, 1}))
    job.model.agents[0].alive = False
    assert sparenodes.waiting_nodes(job.model, job.now) == [1]
