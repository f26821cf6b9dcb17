"""Heartbeat groups (docs/design.md §1c): the config's group size, the manager's handlers of a
leader's frames and its silence rule for a quiet leader's members, and the agent's leader and
link over real sockets on 127.0.0.1."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from ms_recover.agent.group import GroupLeader, GroupLink
from ms_recover.config import GROUP_FROM_NODES, JobConfig
from ms_recover.errors import ConfigError
from ms_recover.localrun.wait import wait_for
from ms_recover.manager.decide import detect_silence
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Envelope
from ms_recover.protocol.transport import manager_channel
from tests.unit.test_manager_restore import Restarted


# ----------------------------------------------------------------------------- the config
@pytest.mark.parametrize(
    ("nodes", "group_nodes", "size"),
    [
        (2, 0, 1),
        (GROUP_FROM_NODES - 1, 0, 1),
        (GROUP_FROM_NODES, 0, 16),
        (2048, 0, 46),
        (8192, 0, 91),
        (16384, 0, 128),
        (4, 2, 2),
        (8192, 1, 1),
    ],
)
def test_group_size(nodes: int, group_nodes: int, size: int) -> None:
    cfg = JobConfig(node_nums=nodes, group_nodes=group_nodes)
    assert cfg.group_size == size
    assert cfg.group_leader(nodes - 1) == (nodes - 1) - (nodes - 1) % size


def test_group_members() -> None:
    cfg = JobConfig(node_nums=5, group_nodes=2)
    assert [list(cfg.group_members(n)) for n in range(5)] == [[1], [], [3], [], []]
    assert not JobConfig(node_nums=4, group_nodes=1).group_members(0)


def test_group_nodes_from_the_environment_and_its_errors() -> None:
    cfg = JobConfig.from_env({"MS_RECOVER_NODE_NUMS": "4", "MS_RECOVER_GROUP_NODES": "2"})
    assert cfg.group_size == 2 and cfg.member_env()["MS_RECOVER_GROUP_NODES"] == "2"
    with pytest.raises(ConfigError, match=r"group_nodes \(MS_RECOVER_GROUP_NODES; 0: automatic"):
        JobConfig(group_nodes=-1)


# ----------------------------------------------------------------------------- the manager
class Grouped(Restarted):
    """A fresh manager of 4 nodes x 2 ranks in groups of 2 (nodes 0-1, 2-3), fed frames of
    epoch 0."""

    def __init__(self) -> None:
        super().__init__(
            JobConfig(job_id="unit", node_nums=4, proc_per_node=2, manager_port=0, group_nodes=2)
        )

    def feed(self, ident: bytes, msg: M.Message, epoch: int = 0) -> None:
        super().feed(ident, msg, epoch)

    def agent(self, node: int, epoch: int = 0) -> None:
        super().agent(node, epoch)

    def group_at(self) -> list[tuple[bytes, Any]]:
        return [(i, (m.leader, m.endpoint)) for i, m in self.sent if isinstance(m, M.GroupAt)]


@pytest.fixture
def grouped() -> Iterator[Grouped]:
    job = Grouped()
    yield job
    job.server.close()


def test_a_leader_is_announced_to_its_members_only(grouped: Grouped) -> None:
    for node in (0, 1, 2):
        grouped.agent(node)
    grouped.feed(b"a0", M.GroupOpen(0, "tcp://10.0.0.1:4001"))
    grouped.feed(b"a1", M.GroupOpen(1, "tcp://10.0.0.2:4002"))  # node 1 leads no group
    assert grouped.group_at() == [(b"a1", (0, "tcp://10.0.0.1:4001"))]
    grouped.feed(b"a2", M.GroupOpen(2, "tcp://10.0.0.3:4003"))  # node 3 not registered yet
    grouped.agent(3)  # ... it hears where its leader is right after its welcome
    assert grouped.group_at()[1:] == [(b"a3", (2, "tcp://10.0.0.3:4003"))]
    grouped.feed(b"a9", M.GroupOpen(0, "tcp://10.0.0.9:1"))  # not node 0's agent
    assert len(grouped.group_at()) == 2


def test_a_lost_leader_is_not_announced(grouped: Grouped) -> None:
    grouped.agent(0)
    grouped.feed(b"a0", M.GroupOpen(0, "tcp://10.0.0.1:4001"))
    grouped.model.agents[0].alive = False
    grouped.agent(1)
    assert grouped.group_at() == []


def test_a_leader_declared_lost_sends_its_members_to_the_manager(grouped: Grouped) -> None:
    for node in range(4):
        grouped.agent(node)
    grouped.feed(b"a0", M.GroupOpen(0, "tcp://10.0.0.1:4001"))
    grouped.feed(b"a2", M.GroupOpen(2, "tcp://10.0.0.3:4003"))
    grouped.server.settle_groups()  # every leader alive: nothing to say
    assert len(grouped.group_at()) == 2
    grouped.model.agents[2].alive = False
    grouped.server.settle_groups()
    grouped.server.settle_groups()  # once
    assert grouped.group_at()[2:] == [(b"a3", (2, ""))]
    grouped.agent(2)  # a new incarnation opens the group again
    grouped.feed(b"a2", M.GroupOpen(2, "tcp://10.0.0.4:4004"))
    assert grouped.group_at()[3:] == [(b"a3", (2, "tcp://10.0.0.4:4004"))]


def test_a_batch_is_each_members_own_heartbeat(grouped: Grouped) -> None:
    for node in range(4):
        grouped.agent(node)
    grouped.t += 1.5
    grouped.feed(b"a0", M.GroupBeats(0, [1], [b"a1"], [{}], [{}]))
    agents = grouped.model.agents
    assert (agents[1].last_seen, agents[1].via) == (grouped.t, 0)
    assert agents[0].last_seen == grouped.t  # the batch says the leader is alive too
    assert agents[2].last_seen == grouped.t - 1.5 and agents[2].via == -1
    # refused: another group's node, an identity not node 1's agent, a batch not from a leader
    # (or not from the leader's agent), columns of different lengths
    before = {n: a.last_seen for n, a in agents.items()}
    grouped.t += 1.0
    grouped.feed(b"a0", M.GroupBeats(0, [2], [b"a2"], [{}], [{}]))
    grouped.feed(b"a0", M.GroupBeats(0, [1], [b"a7"], [{}], [{}]))
    grouped.feed(b"a3", M.GroupBeats(3, [2], [b"a2"], [{}], [{}]))
    grouped.feed(b"a1", M.GroupBeats(2, [3], [b"a3"], [{}], [{}]))
    grouped.feed(b"a2", M.GroupBeats(2, [3], [b"a3"], [], [{}]))
    assert {n: a.last_seen for n, a in agents.items() if n != 0} == {
        n: t for n, t in before.items() if n != 0
    }
    # a direct heartbeat: heard through nobody again
    grouped.feed(b"a1", M.AgentHeartbeat(1))
    assert agents[1].via == -1


def test_a_batch_folds_the_ranks_steps_and_answers_the_leader(grouped: Grouped) -> None:
    for node in range(4):
        grouped.agent(node)
    server = grouped.server
    calls: list[tuple[bytes, dict[int, int]]] = []
    server.relay.fold = lambda ident, steps, now=None, health=None: calls.append((ident, steps))  # type: ignore[method-assign]
    answered: list[bytes] = []
    server._beat.send = lambda sock, ident, force=False: answered.append(ident) or True  # type: ignore[method-assign]
    grouped.feed(b"a0", M.GroupBeats(0, [1], [b"a1"], [{2: 40, 3: 41}], [{}]))
    grouped.feed(b"a1", M.AgentHeartbeat(1, {2: 42}))
    assert calls == [(b"a1", {2: 40, 3: 41}), (b"a1", {2: 42})]
    assert answered == [b"a0", b"a1"]  # the leader once per batch; its member not for it


def _silent(cfg: JobConfig, **last_seen: float) -> list[int]:
    from ms_recover.manager.model import JobModel

    m = JobModel(cfg)
    for node in range(cfg.node_nums):
        a = m.agents[node]
        a.registered = a.alive = True
        a.last_seen = last_seen.get(f"n{node}", 100.0)
    m.agents[1].via = 0
    now = m.heard_at = 100.0
    return [f.node_rank for f in detect_silence(m, now) if f.kind.value == "node_lost"]


def test_a_quiet_leaders_members_get_two_beats_to_move() -> None:
    cfg = JobConfig(node_nums=4, proc_per_node=1, group_nodes=2)
    beat, silence = cfg.agent_heartbeat_s, cfg.silence_s
    gone = 100.0 - silence - 0.01  # heard last just over a silence window ago
    # the leader went quiet with its member's last beat: only the leader is lost ...
    assert _silent(cfg, n0=gone, n1=gone) == [0]
    # ... until two agent beats more have passed
    later = gone - 2 * beat - 0.01
    assert _silent(cfg, n0=later, n1=later) == [0, 1]
    # a member silent while its leader is heard is lost at once
    assert _silent(cfg, n1=gone) == [1]
    # and so is a node heard directly, whatever its group's leader does
    assert _silent(cfg, n0=gone, n3=gone) == [0, 3]


# ----------------------------------------------------------------------------- the agent
def _cfg(node: int, **changes: Any) -> JobConfig:
    return JobConfig(
        job_id="grp", node_nums=4, proc_per_node=1, node_rank=node, group_nodes=2, **changes
    )


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.term()


def _take(leader: GroupLeader, n: int) -> None:
    wait_for(lambda: leader.drain(0, 0.2) or leader.taken >= n, 10, f"{n} heartbeats")


@pytest.mark.parametrize("secret", [b"", b"s3cret"])
def test_a_member_beats_through_its_leader(ctx: Any, secret: bytes) -> None:
    leader = GroupLeader(ctx, _cfg(0, secret=secret))
    link = GroupLink(ctx, _cfg(1, secret=secret), b"a1.77", 0, leader.endpoint)
    try:
        assert leader.endpoint.startswith("tcp://127.0.0.1:") and list(leader.members) == [1]
        now = time.monotonic()
        assert link.send(M.AgentHeartbeat(1, {1: 7}, {1: [0.1, 0.2, 0.0]}), 0, now) is False
        assert link.send(M.AgentHeartbeat(1, {}), 0, now) is False
        _take(leader, 2)
        assert leader.due(time.monotonic())
        batch = leader.batch(time.monotonic())
        assert (batch.node_rank, batch.nodes, batch.idents) == (0, [1], [b"a1.77"])
        assert batch.steps == [{1: 7}] and batch.health == [{1: [0.1, 0.2, 0.0]}]  # merged
        assert not leader.due(time.monotonic())
        got: list[Envelope] = []

        def answered() -> bool:
            env = link.chan.recv_ready() if link.chan.sock.poll(10) else None
            got.extend([env] if env is not None else [])
            return bool(got)

        wait_for(answered, 10, "the leader's answer")
        ack = got[0].msg
        assert isinstance(ack, M.GroupAck) and ack.manager_age_s == pytest.approx(0.2)
        assert link.answered(ack, 50.0) == pytest.approx(49.8)
    finally:
        link.close()
        leader.close()


def test_a_leader_takes_heartbeats_of_its_group_only(ctx: Any) -> None:
    leader = GroupLeader(ctx, _cfg(0))
    strangers = [
        manager_channel(ctx, _cfg(2), "agent:2", b"a2", leader.endpoint),  # another group
        manager_channel(ctx, _cfg(1), "agent:3", b"x", leader.endpoint),  # under another name
        manager_channel(ctx, _cfg(1), "agent:1", b"y", leader.endpoint),  # not a heartbeat
    ]
    try:
        strangers[0].send(M.AgentHeartbeat(2), 0)
        strangers[1].send(M.AgentHeartbeat(1), 0)
        strangers[2].send(M.NodeLeaving(1, "SIGTERM", 25.0), 0)
        wait_for(lambda: leader.drain(0, 0.0) or leader.drops.total >= 3, 10, "three drops")
        assert leader.taken == 0 and not leader.due(time.monotonic())
    finally:
        for chan in strangers:
            chan.close()
        leader.close()


def test_a_member_goes_to_the_manager_while_its_leader_does_not_answer(ctx: Any) -> None:
    link = GroupLink(ctx, _cfg(1), b"a1", 0, "tcp://127.0.0.1:9")  # nobody there
    try:
        beat, t = M.AgentHeartbeat(1), 100.0
        assert link.usable(t) and link.send(beat, 0, t) is False
        assert link.usable(t + link.answer_s - 0.01)
        assert not link.usable(t + link.answer_s + 0.001)
        assert link.send(beat, 0, t + 1.0) is True  # to the manager (not retried yet)
        link.answered(M.GroupAck(0, 0.1), t + 1.1)
        assert link.usable(t + 1.2)
        link.answered(M.GroupAck(0, link.stale_s), t + 1.3)  # the leader lost the manager
        assert not link.usable(t + 1.3) and link.send(beat, 0, t + 1.3) is True
    finally:
        link.close()


def test_a_member_retries_an_unanswering_leader_every_few_beats(ctx: Any) -> None:
    link = GroupLink(ctx, _cfg(1), b"a1", 0, "tcp://127.0.0.1:9")
    sent: list[float] = []
    link.chan.send = lambda msg, epoch: sent.append(t)  # type: ignore[method-assign]
    try:
        for t in (0.0, 0.7, 1.4, link.retry_s, link.retry_s + 0.7):
            link.send(M.AgentHeartbeat(1), 0, t)
        assert sent == [0.0, link.retry_s]
    finally:
        link.close()
