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
from ms_recover.manager.model import Ack
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Envelope
from ms_recover.protocol.relay import virtual_identity
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


def test_a_batch_item_refuses_a_claim_and_skips_a_dead_agent_as_a_direct_beat(
    grouped: Grouped,
) -> None:
    """The common case is handled inline; a node with a slot claim or an agent that is not
    alive takes the direct heartbeat's path (:meth:`AgentSide._agent_beat`)."""
    for node in range(4):
        grouped.agent(node)
    # a new incarnation of node 1's agent says hello while the registered one is alive: held
    hello = M.AgentHello(1, "127.0.0.1", [], 999, False)  # another nonce: another incarnation
    grouped.server._handlers[M.AgentHello](b"new1", Envelope("unit", 0, "a1", 0, hello, 77), hello)
    assert grouped.server.slots.claimant(1, b"new1") is not None
    grouped.t += 0.1
    grouped.feed(b"a0", M.GroupBeats(0, [1], [b"a1"], [{}], [{}]))  # the old one speaks
    refused = [(i, m.ok) for i, m in grouped.sent if isinstance(m, M.AgentWelcome) and not m.ok]
    assert refused == [(b"new1", False)] and grouped.server.slots.claims == {}
    assert grouped.model.agents[1].last_seen == grouped.t
    grouped.model.agents[1].alive = False  # declared lost: its beats no longer count
    before = grouped.model.agents[1].last_seen
    grouped.t += 0.1
    grouped.feed(b"a0", M.GroupBeats(0, [1], [b"a1"], [{2: 50}], [{}]))
    assert grouped.model.agents[1].last_seen == before


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


def _relayed_ranks(grouped: Grouped, epoch: int = 3) -> None:
    """Every node's agent and ranks registered, the ranks through their agent (rank r is
    ``L{r}`` at agent ``a{node}``), at ``epoch``; node 1 heard through node 0's leader."""
    for node in range(4):
        grouped.agent(node)
    m = grouped.model
    m.epoch = epoch
    for rank, info in m.ranks.items():
        info.registered = info.alive = True
        info.identity = virtual_identity(f"a{rank // 2}".encode(), f"L{rank}".encode())
    grouped.feed(b"a0", M.GroupOpen(0, "tcp://10.0.0.1:4001"))
    grouped.feed(b"a0", M.GroupBeats(0, [1], [b"a1"], [{}], [{}]))


def _stopped(leader: int, epoch: int, *nodes: tuple[int, bytes, list[int]]) -> M.GroupStopped:
    ranks = [r for _, _, rs in nodes for r in rs]
    return M.GroupStopped(
        leader,
        epoch,
        [n for n, _, _ in nodes],
        [i for _, i, _ in nodes],
        [len(rs) for _, _, rs in nodes],
        [f"L{r}".encode() for r in ranks],
        ranks,
        [40] * len(ranks),
        ["d"] * len(ranks),
    )


def test_a_stop_goes_through_the_leader_once_per_epoch(grouped: Grouped) -> None:
    _relayed_ranks(grouped)
    server, relay = grouped.server, grouped.server.relay
    assert relay.router is not None and server._routes() == {b"a1": (1, 0, b"a0")}
    groups: list[tuple[bytes, int, M.GroupStop]] = []
    direct: list[tuple[bytes, list[str]]] = []
    relay._send_group = lambda ident, epoch, msg: groups.append((ident, epoch, msg))  # type: ignore[method-assign]
    relay._send = lambda agent, batch: direct.append((agent, [i[0].KIND for i, _ in batch]))  # type: ignore[method-assign]
    m = grouped.model
    everyone = [m.ranks[r].identity for r in range(8)]
    stop = M.Stop("rank 9 died")
    assert relay.take(everyone, stop, 3) == []
    relay.flush()
    assert groups == [(b"a0", 3, M.GroupStop(0, "rank 9 died", [1], [b"a1"], [[b"L2", b"L3"]]))]
    assert sorted(direct) == [(b"a0", [b"stop"]), (b"a2", [b"stop"]), (b"a3", [b"stop"])]
    # the STOP again in the same epoch goes directly, and so does anything else
    groups.clear(), direct.clear()
    relay.take(everyone[2:4], stop, 3)
    relay.take(everyone[2:4], M.Resume(41), 3)
    relay.flush()
    assert groups == [] and direct == [(b"a1", [b"stop", b"resume"])]
    # a leader not heard within an agent beat takes no STOP
    grouped.t += grouped.model.config.agent_heartbeat_s + 0.01
    assert server._routes() == {}


def test_a_leaders_batch_of_stopped_is_recorded_as_the_members_own(grouped: Grouped) -> None:
    _relayed_ranks(grouped)
    m = grouped.model
    grouped.t += 0.5
    grouped.feed(b"a0", _stopped(0, 3, (1, b"a1", [2, 3])))
    assert [m.ranks[r].acked(Ack.STOP, 3) for r in range(8)] == [False] * 2 + [True] * 2 + [
        False
    ] * 4
    assert m.ranks[2].committed_step == 40 and m.ranks[2].stop_digest == "d"
    assert m.agents[1].last_seen == grouped.t
    # refused: another epoch, a node outside the group, a rank not the node's or under another
    # identity, a batch not from the leader's agent, columns of different lengths
    m.ranks[3].acks.clear()
    drops = grouped.server.drops.total
    grouped.feed(b"a0", _stopped(0, 2, (1, b"a1", [3])))
    grouped.feed(b"a0", _stopped(0, 3, (2, b"a2", [4])))
    grouped.feed(b"a0", _stopped(0, 3, (1, b"a1", [4])))
    grouped.feed(b"a0", _stopped(0, 3, (1, b"a7", [3])))
    grouped.feed(b"a1", _stopped(0, 3, (1, b"a1", [3])))
    bad = _stopped(0, 3, (1, b"a1", [3]))
    grouped.feed(b"a0", M.GroupStopped(0, 3, [1], [b"a1"], [2], bad.locals, [3], [40], ["d"]))
    grouped.feed(b"a0", M.GroupStopped(0, 3, [1], [b"a1"], [1], [b"L9"], [3], [40], ["d"]))
    assert not any(m.ranks[r].acked(Ack.STOP, 3) for r in (3, 4))
    assert grouped.server.drops.total - drops == 7
    grouped.feed(b"a2", _stopped(2, 3, (3, b"a3", [6, 7])))  # node 2 leads nodes 2-3
    assert m.ranks[6].acked(Ack.STOP, 3) and m.ranks[7].acked(Ack.STOP, 3)


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


def _next(chan: Any) -> Envelope:
    got: list[Envelope] = []

    def one() -> bool:
        env = chan.recv_ready() if chan.sock.poll(10) else None
        got.extend([env] if env is not None else [])
        return bool(got)

    wait_for(one, 10, "a frame from the leader")
    return got[0]


def test_a_leader_passes_a_stop_on_and_sends_back_its_members_stopped(ctx: Any) -> None:
    leader = GroupLeader(ctx, _cfg(0, secret=b"s3cret"))
    link = GroupLink(ctx, _cfg(1, secret=b"s3cret"), b"a1.77", 0, leader.endpoint)
    try:
        link.send(M.AgentHeartbeat(1), 4, time.monotonic())  # connected: the leader knows it
        _take(leader, 1)
        assert isinstance(_next(link.chan).msg, M.GroupAck)
        stop = M.GroupStop(0, "rank 0 died", [1], [b"a1.77"], [[b"L1"]])
        assert leader.pass_stop(stop, 5) == 1
        env = _next(link.chan)
        assert (env.sender, env.epoch) == ("agent:0", 5)
        assert env.msg == M.RelayDown(["stop"], [5], [[b"L1"]], [{"reason": "rank 0 died"}])
        # the member's answers, of two epochs: one batch per epoch, in the columns
        for epoch, step in ((5, 40), (6, 41)):
            acks = M.RelayAcks(
                1, "stopped", epoch, [b"L1"], ["rank:1"], [9], [1], [1], [step], [""]
            )
            link.chan.send(acks, epoch)
        wait_for(lambda: leader.drain(5, 0.0) or len(leader._stopped) >= 2, 10, "two answers")
        assert leader.stopped() == [
            M.GroupStopped(0, 5, [1], [b"a1.77"], [1], [b"L1"], [1], [40], [""]),
            M.GroupStopped(0, 6, [1], [b"a1.77"], [1], [b"L1"], [1], [41], [""]),
        ]
        assert leader.stopped() == [] and leader.taken == 1  # answers are not heartbeats
        # refused: a stop for a node outside the group; answers of another kind
        assert leader.pass_stop(M.GroupStop(0, "x", [2], [b"a2"], [[b"L2"]]), 5) == 0
        link.chan.send(M.RelayAcks(1, "rebuilt", 5, [b"L1"], ["rank:1"], [9], [2], [1], [], []), 5)
        wait_for(lambda: leader.drain(5, 0.0) or leader.drops.total >= 2, 10, "two drops")
        assert leader.stopped() == []
    finally:
        link.close()
        leader.close()


def test_a_rank_gets_one_stop_of_an_epoch_from_the_leader(ctx: Any) -> None:
    """The manager sent the STOP again directly while the leader's was late: the leader's is
    not passed on; a direct one always is (a rank answers a repeated STOP again)."""
    from ms_recover.agent.relay import LocalRelay

    relay = LocalRelay(ctx, _cfg(1))
    sent: list[tuple[str, int, list[bytes]]] = []
    relay._send = lambda msg, epoch, targets: (
        sent.append((msg.KIND.decode(), epoch, targets)) or len(targets)
    )  # type: ignore[method-assign]
    try:

        def stop(epoch: int, *targets: bytes) -> M.RelayDown:
            return M.RelayDown(["stop"], [epoch], [list(targets)], [{"reason": "r"}])

        relay.deliver(stop(5, b"L1"))
        relay.deliver(stop(5, b"L1", b"L2"), led=True)
        relay.deliver(stop(5, b"L1"))
        relay.deliver(stop(6, b"L1"), led=True)
        assert sent == [
            ("stop", 5, [b"L1"]),
            ("stop", 5, [b"L2"]),
            ("stop", 5, [b"L1"]),
            ("stop", 6, [b"L1"]),
        ]
    finally:
        relay.close()


def test_step_timing_is_recorded_while_the_job_runs_only(grouped: Grouped) -> None:
    from ms_recover.observability.schema import JobState

    _relayed_ranks(grouped)
    m = grouped.model
    timing = [3.0, 0.01, -1.0, 0.05, 0.04, 0.035, 0.0]
    m.state = JobState.STOPPING
    grouped.feed(b"a0", M.GroupBeats(0, [1], [b"a1"], [{2: 41}], [{2: timing}]))
    grouped.feed(b"a2", M.AgentHeartbeat(2, {4: 41}, {4: timing}))
    assert m.health == {} and m.ranks[2].committed_step == m.ranks[4].committed_step == 41
    m.state = JobState.RUNNING
    grouped.feed(b"a0", M.GroupBeats(0, [1], [b"a1"], [{2: 42}], [{2: timing}]))
    grouped.feed(b"a2", M.AgentHeartbeat(2, {4: 42}, {4: timing}))
    assert sorted(m.health) == [2, 4] and m.health[2].step == 42
