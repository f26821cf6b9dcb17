"""A restarted manager rebuilds its view from the members' re-registration (issue 9).

The real server's handlers are fed decoded envelopes (no sockets connect) and a fake clock;
``decide`` and the executor run as in production.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError
from ms_recover.manager.decide import decide
from ms_recover.manager.server import ManagerServer
from ms_recover.observability.schema import JobState
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Envelope
from ms_recover.strategy import parse_strategies

EPOCH = 3  # the job's epoch under the previous manager (after two recoveries)


class Restarted:
    """A fresh manager (2 nodes x 2 ranks) that members of a running job talk to."""

    def __init__(self, cfg: JobConfig | None = None) -> None:
        self.t = 1000.0
        cfg = cfg or JobConfig(
            job_id="unit",
            node_nums=2,
            proc_per_node=2,
            manager_port=0,
            heartbeat_s=0.5,
            rank_silence_s=2.0,
            phase_timeout_s=10.0,
            strategies=parse_strategies("recover-in-place,exit"),
        )
        self.server = ManagerServer(cfg, clock=lambda: self.t)
        self.model = self.server.model
        self.sent: list[tuple[bytes, M.Message]] = []
        self.server.send = lambda ids, msg: self.sent.extend((i, msg) for i in ids)  # type: ignore[method-assign]

    def feed(self, ident: bytes, msg: M.Message, epoch: int = EPOCH) -> None:
        env = Envelope("unit", epoch, ident.decode(), 0, msg)
        self.server._handlers[type(msg)](ident, env, msg)

    def agent(self, node: int, epoch: int = EPOCH) -> None:
        self.feed(
            f"a{node}".encode(), M.AgentHello(node, "127.0.0.1", [], 500 + node, node == 0), epoch
        )

    def rank(self, rank: int, step: int = 41, epoch: int = EPOCH) -> None:
        hello = M.WorkerHello(rank, rank // 2, 600 + rank, 0, f"tcp://h:{rank}", step, 0)
        self.feed(f"r{rank}".encode(), hello, epoch)

    def tick(self) -> None:
        self.server.executor.execute(decide(self.model, self.t))

    def of(self, kind: type[M.Message]) -> list[tuple[bytes, Any]]:
        return [(i, m) for i, m in self.sent if isinstance(m, kind)]


@pytest.fixture
def job() -> Iterator[Restarted]:
    job = Restarted()
    yield job
    job.server.close()


def test_unknown_members_are_asked_to_register_again(job: Restarted) -> None:
    job.feed(b"r2", M.WorkerHeartbeat(2, 40))
    job.feed(b"a1", M.AgentHeartbeat(1))
    job.feed(b"r2", M.WorkerHeartbeat(2, 40))  # within one heartbeat interval: not again
    assert [(i, type(m)) for i, m in job.sent] == [(b"r2", M.Rejoin), (b"a1", M.Rejoin)]


def test_every_member_back_means_running_again_without_a_round(job: Restarted) -> None:
    for node in (0, 1):
        job.agent(node)
    for rank in range(4):
        job.rank(rank, step=41 + rank % 2)
    welcomes = job.of(M.Welcome)
    assert len(welcomes) == 4 and all(m.ok and not m.reboot for _, m in welcomes)
    job.tick()
    assert job.model.state is JobState.RUNNING
    assert job.model.epoch == EPOCH and job.model.round is None
    sent = {type(m) for _, m in job.sent}
    assert not sent & {M.Stop, M.Rebuild, M.Repair, M.Resume, M.KillRanks, M.StartRanks}
    restored = job.server.events.recent("restored")
    assert restored and restored[0]["steps"] == {"0": 41, "1": 42, "2": 41, "3": 42}


def test_group_log_is_rebuilt_from_the_members(job: Restarted) -> None:
    job.rank(1)
    job.feed(b"r1", M.GroupCreated(1, "parity1", [1, 3]))
    assert list(job.model.group_log) == [("parity1", (1, 3))]


def test_a_rank_reported_dead_while_away_is_recovered(job: Restarted) -> None:
    for node in (0, 1):
        job.agent(node)
    for rank in (0, 1, 2):
        job.rank(rank)
    # the agent re-sends the exit of rank 3, which died while no manager listened
    job.feed(b"a1", M.RankExited(1, 3, 603, 137, 9, job.t - 2))
    job.feed(b"a1", M.RankExited(1, 3, 603, 137, 9, job.t - 2))  # twice: one fault
    job.tick()
    assert job.model.state is JobState.STOPPING and job.model.epoch == EPOCH + 1
    assert job.model.round is not None and job.model.round.replace_ranks == {3}
    assert [m.ranks for _, m in job.of(M.StartRanks)] == [[3]]
    assert len(job.server.events.recent("fault")) == 1


def test_a_rank_missing_after_the_grace_is_a_fault(job: Restarted) -> None:
    for node in (0, 1):
        job.agent(node)
    for rank in (0, 1, 2):
        job.rank(rank)
    job.tick()
    assert job.model.state is JobState.FORMING  # rank 3 may still come back
    job.t += 2.5  # past max(heartbeat*liveness, rank_silence_s)
    for info in job.model.ranks.values():
        info.last_seen = job.t
    for agent in job.model.agents.values():
        agent.last_seen = job.t
    job.tick()
    fault = job.server.events.recent("fault")[0]
    assert fault["kind"] == "rejoin" and fault["rank"] == 3
    assert job.model.round is not None and job.model.round.replace_ranks == {3}


def test_a_rank_back_from_another_epoch_is_recovered(job: Restarted) -> None:
    for node in (0, 1):
        job.agent(node)
    for rank in (0, 1, 3):
        job.rank(rank)
    job.rank(2, step=-1, epoch=0)  # a fresh process: the old manager died mid-recovery
    job.tick()
    fault = job.server.events.recent("fault")[0]
    assert fault["kind"] == "rejoin" and fault["rank"] == 2
    assert "epoch 0" in fault["detail"]


def test_a_fresh_job_still_forms_normally(job: Restarted) -> None:
    for node in (0, 1):
        job.agent(node, epoch=0)
    for rank in range(4):
        job.rank(rank, step=-1, epoch=0)
    job.tick()
    assert job.model.state is JobState.REBUILDING and job.model.restore is None


def test_manager_grace_is_validated() -> None:
    assert JobConfig(phase_timeout_s=30.0).lost_manager_grace_s == 30.0
    env = {"MS_RECOVER_MANAGER_GRACE_S": "45"}
    assert JobConfig.from_env(env).lost_manager_grace_s == 45.0
    for bad in (-1.0, float("nan"), float("inf"), 1.0):
        with pytest.raises(ConfigError, match="manager_grace_s"):
            JobConfig(manager_grace_s=bad)


def test_a_fault_waits_until_the_job_epoch_is_known(job: Restarted) -> None:
    """The agent (still at epoch 0: it had no beat since the job started) answers Rejoin and
    re-sends an exit before any rank is back: the round must not start at a stale epoch."""
    job.feed(b"a0", M.AgentHeartbeat(0))  # -> Rejoin
    job.agent(0, epoch=0)
    job.feed(b"a0", M.RankExited(0, 1, 601, 137, 9, job.t - 1))
    job.tick()
    assert job.model.state is JobState.FORMING and job.model.restore is not None
    job.agent(1)
    for rank in (0, 2, 3):
        job.rank(rank)
    job.tick()
    assert job.model.state is JobState.STOPPING and job.model.epoch == EPOCH + 1
    assert [m.ranks for _, m in job.of(M.StartRanks)] == [[1]]
