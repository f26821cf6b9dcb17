"""The node relay (docs/design.md §1c): ranks talk to their agent, the agent to the manager.

Both ends are real: a :class:`ManagerServer` on 127.0.0.1 (frames pumped into ``dispatch`` by
the test, so every step is deterministic) with real agent DEALER sockets, and a real
:class:`LocalRelay` with real rank DEALER sockets. Hostile input on either hop is dropped and
counted; what is valid still gets through.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq

from ms_recover.agent.relay import LocalRelay
from ms_recover.config import JobConfig
from ms_recover.localrun.wait import wait_for
from ms_recover.manager.model import Ack
from ms_recover.manager.server import ManagerServer
from ms_recover.observability.events import EventLog
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import MAGIC, Codec, Envelope
from ms_recover.protocol.relay import virtual_identity

pytestmark = pytest.mark.timeout(60)

JOB = "relay"


class Peer:
    """A real DEALER with its own codec (nonce) and seq counter."""

    def __init__(self, ctx: zmq.Context, endpoint: str, ident: bytes, sender: str, secret: bytes):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTING_ID, ident)
        self.sock.connect(endpoint)
        self.ident, self.sender = ident, sender
        self.codec = Codec(JOB, secret)
        self.seq = 0
        self.sent: list[list[bytes]] = []

    def send(self, msg: M.Message, epoch: int = 0) -> None:
        self.seq += 1
        frames = self.codec.encode(msg, epoch, self.sender, self.seq)
        self.sent.append(frames)
        self.sock.send_multipart(frames)

    def recv(self, timeout_s: float = 5.0) -> Envelope:
        assert self.sock.poll(int(timeout_s * 1000)), f"{self.sender}: nothing within {timeout_s}s"
        return self.codec.decode(self.sock.recv_multipart())

    def quiet(self, timeout_s: float = 0.2) -> bool:
        return not self.sock.poll(int(timeout_s * 1000))


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


# ----------------------------------------------------------------------------- the manager's side
@pytest.fixture
def server() -> Iterator[ManagerServer]:
    cfg = JobConfig(job_id=JOB, node_nums=2, proc_per_node=2, manager_port=0)
    srv = ManagerServer(cfg, events=EventLog(), bind="127.0.0.1")
    yield srv
    srv.close()


def _pump(server: ManagerServer, frames: int) -> None:
    """Dispatch ``frames`` frames from the ROUTER (waiting for each), then flush the relay."""
    for _ in range(frames):
        assert server._sock.poll(5000), "no frame reached the manager"
        server.dispatch(server._sock.recv_multipart())
    server.relay.flush()


def _agent(ctx: zmq.Context, server: ManagerServer, node: int) -> Peer:
    secret = server.config.effective_secret()
    peer = Peer(
        ctx, f"tcp://127.0.0.1:{server.port}", f"a{node}.1".encode(), f"agent:{node}", secret
    )
    peer.send(M.AgentHello(node, "127.0.0.1", [2 * node, 2 * node + 1], 100 + node, node == 0))
    _pump(server, 1)
    assert peer.recv().msg == M.AgentWelcome(True, "")
    return peer


def _relay_up(node: int, items: list[tuple[bytes, str, int, M.Message]], **bad: Any) -> M.RelayUp:
    fields = {
        "node_rank": node,
        "idents": [i[0] for i in items],
        "senders": [i[1] for i in items],
        "nonces": [7] * len(items),
        "seqs": [i[2] for i in items],
        "epochs": [0] * len(items),
        "kinds": [i[3].KIND.decode() for i in items],
        "bodies": [i[3].to_wire() for i in items],
    }
    fields.update(bad)
    return M.RelayUp(**fields)


def _hello(rank: int, node: int | None = None) -> M.WorkerHello:
    return M.WorkerHello(
        rank, rank // 2 if node is None else node, 300 + rank, 0, "tcp://x:1", -1, 0
    )


def _register_node0(ctx: zmq.Context, server: ManagerServer) -> Peer:
    agent = _agent(ctx, server, 0)
    agent.send(_relay_up(0, [(b"L0", "rank:0", 1, _hello(0)), (b"L1", "rank:1", 1, _hello(1))]))
    _pump(server, 1)
    return agent


def test_relayed_ranks_register_and_their_welcomes_come_back_in_one_frame(ctx, server) -> None:
    agent = _register_node0(ctx, server)
    for rank, local in ((0, b"L0"), (1, b"L1")):
        info = server.model.ranks[rank]
        assert info.alive and info.identity == virtual_identity(b"a0.1", local)
    down = agent.recv().msg
    assert isinstance(down, M.RelayDown)
    # The same Welcome for both: one item with both targets, its body packed once.
    assert down.kinds == ["welcome"] and down.targets == [[b"L0", b"L1"]]
    assert all(b["ok"] for b in down.bodies)
    assert agent.quiet()  # one frame for the node, not one per rank
    assert server.status()["ranks"][0]["relayed"] is True


def test_a_broadcast_is_one_item_per_node_and_direct_ranks_still_get_theirs(ctx, server) -> None:
    agent = _register_node0(ctx, server)
    agent.recv()  # the welcomes
    secret = server.config.effective_secret()
    endpoint = f"tcp://127.0.0.1:{server.port}"
    direct = Peer(ctx, endpoint, b"r2.direct", "rank:2", secret)
    _agent(ctx, server, 1)
    direct.send(_hello(2))
    _pump(server, 1)
    assert direct.recv().msg.ok
    idents = [server.model.ranks[r].identity for r in (0, 1, 2)]
    stop, resume0, resume1 = M.Stop("test"), M.Resume(5), M.Resume(6)
    server.send(idents, stop)
    server.send(idents[:1], resume0)  # per-rank payloads that differ: one item each
    server.send(idents[1:2], resume1)
    server.relay.flush()
    down = agent.recv().msg
    assert down.kinds == ["stop", "resume", "resume"]
    assert down.targets == [[b"L0", b"L1"], [b"L0"], [b"L1"]]
    assert down.bodies[1:] == [{"step": 5}, {"step": 6}]
    assert direct.recv().msg == stop and agent.quiet()


def test_folded_heartbeats_count_only_for_ranks_registered_through_that_agent(ctx, server) -> None:
    agent = _register_node0(ctx, server)
    agent1 = _agent(ctx, server, 1)
    agent1.send(_relay_up(1, [(b"L2", "rank:2", 1, _hello(2))]))
    _pump(server, 1)
    agent.send(M.AgentHeartbeat(0, {0: 5, 1: 6, 2: 99}))
    _pump(server, 1)
    steps = {r: server.model.ranks[r].committed_step for r in range(3)}
    assert steps == {0: 5, 1: 6, 2: -1}  # rank 2 belongs to node 1's agent


def test_hostile_relay_items_are_dropped_and_the_rest_handled(ctx, server) -> None:
    agent = _register_node0(ctx, server)
    before = server.relay.drops.total + server.drops.total
    hello_elsewhere = _hello(2, node=1)
    agent.send(
        _relay_up(
            0,
            [
                (b"L0", "rank:0", 2, M.AgentHello(0, "10.0.0.9", [0, 1], 9, True)),  # not up
                (b"L0", "rank:0", 3, M.Stop("x")),  # a manager -> worker kind
                (b"LX", "rank:2", 1, hello_elsewhere),  # another node's rank
                (b"", "rank:1", 2, M.WorkerDone(1, 4)),  # no local identity
                (b"L1", "rank:1", 1, M.WorkerDone(1, 4)),  # a replay of seq 1 (the hello's)
                (b"L0", "rank:0", 4, M.WorkerDone(0, 4)),  # valid
            ],
        )
    )
    _pump(server, 1)
    assert server.relay.drops.total + server.drops.total == before + 5
    assert server.model.ranks[0].done and not server.model.ranks[1].done
    assert server.model.agents[0].pid == 100 and not server.model.ranks[2].registered


def test_malformed_batches_and_forged_identities_are_dropped(ctx, server) -> None:
    agent = _register_node0(ctx, server)
    item = [(b"L0", "rank:0", 2, M.WorkerDone(0, 4))]
    drops = server.relay.drops.total
    agent.send(_relay_up(0, item, seqs=[]))  # lists of unequal length
    agent.send(_relay_up(0, item, bodies=[{"rank": 0}]))  # a body without its fields
    _pump(server, 2)
    assert server.relay.drops.total == drops + 2 and not server.model.ranks[0].done
    forged = Peer(
        ctx,
        f"tcp://127.0.0.1:{server.port}",
        virtual_identity(b"a0.1", b"L0"),  # a direct peer naming itself as a relayed rank
        "rank:0",
        server.config.effective_secret(),
    )
    forged.send(M.WorkerDone(0, 4))
    before = server.drops.total
    _pump(server, 1)
    assert server.drops.total == before + 1 and not server.model.ranks[0].done
    not_maps = _relay_up(0, item, bodies=[[0, 4]])  # a body that is not a map: the frame
    agent.sock.send_multipart(agent.codec.encode(not_maps, 0, "agent:0", 99))
    before = server.drops.total
    _pump(server, 1)
    assert server.drops.total == before + 1 and not server.model.ranks[0].done
    stranger = _agent(ctx, server, 1)  # registered, but for node 1: cannot relay node 0
    stranger.send(_relay_up(0, item))
    _pump(server, 1)
    assert not server.model.ranks[0].done


# ----------------------------------------------------------------------------- the agent's side
@pytest.fixture
def relay(ctx: zmq.Context) -> Iterator[LocalRelay]:
    cfg = JobConfig(job_id=JOB, node_nums=2, proc_per_node=2, node_rank=1, manager_port=0)
    local = LocalRelay(ctx, cfg)
    yield local
    local.close()


def _rank(ctx: zmq.Context, relay: LocalRelay, rank: int, secret: bytes | None = None) -> Peer:
    key = secret if secret is not None else relay.config.effective_secret()
    return Peer(ctx, relay.endpoint, f"r{rank}".encode(), f"rank:{rank}", key)


def _drained(relay: LocalRelay, frames: int) -> list[M.RelayUp | M.RelayAcks]:
    """Wait until ``frames`` more frames were accepted or dropped; the batches since."""
    seen = {"n": 0}

    def done() -> bool:
        before = relay.drops.total + len(relay._items) + len(relay._steps)
        relay.drain()
        seen["n"] += relay.drops.total + len(relay._items) + len(relay._steps) - before
        return seen["n"] >= frames

    wait_for(done, 5, f"{frames} frames at the relay", poll_s=0.005)
    return relay.batches()


def test_the_relay_authenticates_like_the_manager(ctx, relay) -> None:
    good = _rank(ctx, relay, 2)
    wrong_secret = _rank(ctx, relay, 3, secret=b"not-the-secret")
    wrong_secret.send(M.WorkerDone(3, 1))
    good.sock.send_multipart([b"garbage"])
    good.sock.send_multipart([MAGIC + b"\x07stopped\xc1" + b"0" * 32])
    good.send(M.AgentHello(1, "10.0.0.9", [2, 3], 9, False))  # an agent kind
    good.send(M.Stopped(0, 3, ""))  # rank 0 is node 0's
    good.send(M.Stopped(2, 3, "ab"))
    good.sock.send_multipart(good.sent[-1])  # a replay
    batches = _drained(relay, 7)
    assert relay.drops.total == 6
    assert batches == [
        M.RelayAcks(1, "stopped", 0, [b"r2"], ["rank:2"], [good.codec.nonce], [3], [2], [3], ["ab"])
    ]


def test_heartbeats_are_folded_except_the_one_that_closes_a_resume(ctx, relay) -> None:
    rank = _rank(ctx, relay, 2)
    rank.send(M.WorkerHeartbeat(2, 12))
    assert _drained(relay, 1) == [] and relay.take_steps() == {2: 12}
    relay.deliver(M.RelayDown(["resume"], [4], [[b"r2"]], [{"step": 13}]))
    assert rank.recv().msg == M.Resume(13)
    rank.send(M.WorkerHeartbeat(2, 12))  # the periodic beat before the step ran: folded
    assert _drained(relay, 1) == []
    timing = [4.0, 0.01, -1.0, 0.05, 0.04, 0.03, 0.0]
    rank.send(M.WorkerHeartbeat(2, 13, timing))  # the report the manager waits for: at once,
    batches = _drained(relay, 1)  # in columns, without its timing
    assert [(b.kind, b.epoch, b.ranks, b.steps, b.digests) for b in batches] == [
        ("worker_hb", 0, [2], [13], [])
    ]
    assert relay.take_steps() == {2: 12}


def test_the_agents_beats_carry_the_steps_once_per_report_period(ctx, relay) -> None:
    """Between two reports (``JobConfig.rank_report_s``) a beat is the node's liveness alone;
    the next report carries each rank's latest step."""
    rank, cfg = _rank(ctx, relay, 2), relay.config
    rank.send(M.WorkerHeartbeat(2, 12))
    _drained(relay, 1)
    assert relay.report(100.0) == {2: 12}
    assert relay.report(100.1) == {}  # reported just now
    rank.send(M.WorkerHeartbeat(2, 14))
    _drained(relay, 1)
    assert (cfg.agent_heartbeat_s, cfg.rank_report_s) == (pytest.approx(2 / 3), 2.5)
    beats = [relay.report(100.0 + k * cfg.agent_heartbeat_s) for k in range(1, 7)]
    assert beats == [{}, {}, {}, {2: 14}, {}, {}]  # the report due 2.5 s on: the fourth beat


def test_the_relay_fans_out_in_order_and_drops_what_is_not_for_ranks(ctx, relay, caplog) -> None:
    ranks = [_rank(ctx, relay, r) for r in (2, 3)]
    for r, peer in zip((2, 3), ranks, strict=True):
        peer.send(M.WorkerHeartbeat(r, 0))  # connected and known
    _drained(relay, 2)
    before = relay.drops.total
    down = M.RelayDown(
        ["kill_ranks", "stop", "resume", "rebuild"],
        [3, 3, 3, 3],
        [[b"r2"], [b"r2", b"r3"], [b"r3"], [b"r2"]],
        [{"ranks": [2], "reason": "x"}, {"reason": "fault"}, {"step": 8}, {"world": "x"}],
    )
    assert relay.deliver(down) == 3
    assert relay.drops.total == before + 2
    got2, got3 = ranks[0].recv(), [ranks[1].recv(), ranks[1].recv()]
    assert (got2.msg, got2.epoch) == (M.Stop("fault"), 3)
    assert [e.msg for e in got3] == [M.Stop("fault"), M.Resume(8)]
    assert ranks[0].quiet()
    lopsided = M.RelayDown(["stop"], [3, 4], [[b"r2"]], [{"reason": "x"}])
    assert relay.deliver(lopsided) == 0 and ranks[0].quiet()
    deep: object = 0
    for _ in range(20):  # within msgpack's limits, deeper than a Welcome may nest in its frame
        deep = [deep]
    welcome = {"ok": True, "reason": "", "reboot": False, "world_size": 4, "group_log": [deep]}
    assert relay.deliver(M.RelayDown(["welcome"], [3], [[b"r2"]], [welcome])) == 0
    assert "nests deeper" in caplog.text and ranks[0].quiet()


def test_a_rejoin_reaches_every_rank_that_spoke(ctx, relay) -> None:
    ranks = [_rank(ctx, relay, r) for r in (2, 3)]
    for r, peer in zip((2, 3), ranks, strict=True):
        peer.send(M.WorkerHeartbeat(r, 0))
    _drained(relay, 2)
    relay.rejoin_all("manager restarted")
    assert [p.recv().msg for p in ranks] == [M.Rejoin("manager restarted")] * 2


def test_a_batch_over_the_frame_limit_is_split(ctx) -> None:
    cfg = JobConfig(
        job_id=JOB, node_nums=1, proc_per_node=2, manager_port=0, max_frame_bytes=128 << 10
    )
    local = LocalRelay(ctx, cfg)
    try:
        rank = _rank(ctx, local, 0)
        for i in range(4):
            rank.send(M.WorkerFault(0, "comm", "x" * 60000 + str(i)))
        batches = _drained(local, 4)
        assert len(batches) > 1 and sum(len(b.kinds) for b in batches) == 4
        codec = Codec(JOB, cfg.effective_secret(), cfg.max_frame_bytes)
        for batch in batches:
            frames = codec.encode(batch, 0, "agent:0", 1)
            assert codec.decode(frames).msg == batch  # under the limit the manager enforces
    finally:
        local.close()


def test_relay_down_bodies_are_packed_once_per_flush(ctx, server, monkeypatch) -> None:
    agents = [_register_node0(ctx, server)]
    agents.append(_agent(ctx, server, 1))
    agents[1].send(_relay_up(1, [(b"L2", "rank:2", 1, _hello(2)), (b"L3", "rank:3", 1, _hello(3))]))
    _pump(server, 1)
    for agent in agents:
        agent.recv()
    packs: list[Any] = []
    real = msgpack.packb
    monkeypatch.setattr(msgpack, "packb", lambda obj, **kw: packs.append(obj) or real(obj, **kw))
    server.send([server.model.ranks[r].identity for r in range(4)], M.Stop("once"))
    server.relay.flush()
    assert packs == [{"reason": "once"}]
    assert [a.recv().msg.targets for a in agents] == [[[b"L0", b"L1"]], [[b"L2", b"L3"]]]


# ----------------------------------------------------------------------------- a real job
def test_a_real_job_runs_through_its_agents_and_recovers_a_kill(tmp_path) -> None:
    """Ranks launched by ``ms-recover agent`` register through it (no rank frame reaches the
    manager directly), a SIGKILLed rank's replacement does too, and the job ends normally."""
    import os
    import signal

    from .jobs import run_to_end, trainer_job

    with trainer_job(str(tmp_path), steps=400, extra=("--step-time", "0.01")) as job:

        def training(rank: int) -> int:
            info = job.status()["ranks"][rank]
            return info["pid"] if info["alive"] and info["step"] >= 2 else 0

        pid = wait_for(lambda: training(3), 30, "rank 3 to train")
        assert all(r["relayed"] for r in job.status()["ranks"])
        assert job.server.relay.items_in > 0
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: job.find("recovery", ok=True), 60, "the recovery")
        ranks = job.status()["ranks"]
        assert ranks[3]["pid"] != pid and all(r["relayed"] for r in ranks)
        run_to_end(job)
    assert job.exit_code == 0


def _acks_job(ctx: zmq.Context, server: ManagerServer, fast: bool) -> tuple[Peer, list[bytes]]:
    """Node 0 registered at epoch 1, the one-pass record off unless ``fast``; the agent and
    the kinds that took the general per-item path."""
    agent = _register_node0(ctx, server)
    agent.recv()  # the welcomes
    if not fast:
        server._acks.take = lambda *_: False
    server.model.epoch = 1
    handled: list[bytes] = []
    general = server._handle

    def counted(ident: bytes, env: Envelope) -> None:
        handled.append(env.msg.KIND)
        general(ident, env)

    server._handle = counted
    return agent, handled


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "general"])
def test_relayed_acks_are_recorded_alike_without_a_dispatch_each(ctx, server, fast) -> None:
    """A node's STOPPED and REBUILT are recorded in one pass (manager.acks) exactly as their
    own frames would be; whatever is not plainly valid and current takes the general path."""
    agent, handled = _acks_job(ctx, server, fast)
    drops = server.drops.total + server.relay.drops.total
    items = [
        (b"L0", "rank:0", 2, M.Stopped(0, 7, "ab")),  # recorded
        (b"L1", "rank:1", 2, M.Stopped(1, 8, "cd")),  # of epoch 0: stale, dropped
        (b"L0", "rank:0", 2, M.Stopped(0, 9, "zz")),  # seq 2 again: a replay, dropped
        (b"L1", "rank:1", 3, M.Rebuilt(1)),  # recorded
        (b"L0", "rank:0", 3, M.Stopped(0, 9, "")),  # rank True below: dropped as malformed
    ]
    bodies = [msg.to_wire() for *_, msg in items]
    bodies[4]["rank"] = True
    agent.send(_relay_up(0, items, epochs=[1, 0, 1, 1, 1], bodies=bodies))
    _pump(server, 1)
    r0, r1 = server.model.ranks[0], server.model.ranks[1]
    assert server.drops.total + server.relay.drops.total == drops + 3
    assert r0.acked(Ack.STOP, 1) and (r0.committed_step, r0.stop_digest) == (7, "ab")
    assert not r1.acked(Ack.STOP, 1) and not r1.acked(Ack.STOP, 0) and r1.acked(Ack.REBUILD, 1)
    relayed = [k for k in handled if k != M.RelayUp.KIND]
    # The fast pass leaves only the stale item to the per-item dispatch (the malformed one
    # is dropped while unwrapping, before any dispatch).
    assert relayed == ([b"stopped"] if fast else [b"stopped"] * 3 + [b"rebuilt"])


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "general"])
def test_relayed_repairs_and_resume_heartbeats_are_recorded_alike(ctx, server, fast) -> None:
    """REPAIRED (done or failed) and the heartbeat that closes a RESUME take the one-pass
    record too, with what ``on_repaired`` and ``on_heartbeat`` record."""
    agent, handled = _acks_job(ctx, server, fast)
    items = [
        (b"L0", "rank:0", 2, M.Repaired(0, 0, True, 11, -1, "")),
        (b"L1", "rank:1", 2, M.Repaired(1, 0, False, -1, 0, "peer 0 vanished")),
        (b"L0", "rank:0", 3, M.WorkerHeartbeat(0, 15)),
        (b"L1", "rank:1", 3, M.WorkerHeartbeat(1, 3)),
        (b"L1", "rank:1", 4, M.WorkerHeartbeat(1, 2)),  # no step goes back
    ]
    agent.send(_relay_up(0, items, epochs=[1] * len(items)))
    _pump(server, 1)
    r0, r1 = server.model.ranks[0], server.model.ranks[1]
    assert r0.acked(Ack.REPAIR, 1) and r0.committed_step == 15 and r0.repair_failure is None
    assert not r1.acked(Ack.REPAIR, 1) and r1.repair_failure == (0, 0, "peer 0 vanished")
    assert r1.committed_step == 3 and 0 < r1.last_progress <= r1.last_seen
    relayed = [k for k in handled if k != M.RelayUp.KIND]
    assert relayed == ([] if fast else [k.KIND for *_, k in items])


def test_the_drain_stops_at_a_stop_alls_last_answer(ctx, server, monkeypatch) -> None:
    """The last STOPPED owed is decided on before the frames queued behind it are read."""
    import ms_recover.manager.server as server_mod
    from ms_recover.observability.schema import JobState

    agent = _register_node0(ctx, server)
    agent.recv()  # the welcomes
    server.model.state, server.model.epoch = JobState.STOPPING, 1
    server.send([server.model.ranks[r].identity for r in (0, 1)], M.Stop("test"))
    server.relay.flush()
    codec = Codec(JOB, server.config.effective_secret())
    up = _relay_up(
        0,
        [(b"L0", "rank:0", 2, M.Stopped(0, 5, "")), (b"L1", "rank:1", 2, M.Stopped(1, 5, ""))],
        epochs=[1, 1],
    )
    queue = [
        [b"a0.1", *codec.encode(up, 1, "agent:0", 1)],
        [b"s", *codec.encode(M.StatusRequest(), 0, "status", 1)],
    ]

    def recv(sock: Any) -> list[bytes]:
        if not queue:
            raise zmq.Again()
        return queue.pop(0)

    monkeypatch.setattr(server_mod, "recv_frames", recv)
    server._drain()
    assert server.model.ranks[1].acked(Ack.STOP, 1) and server.cadence.answered
    assert len(queue) == 1  # the status request waits for the next read
    assert server.cadence.run(lambda judge: None) and not server.cadence.answered


def _acks(kind: str, epoch: int, items: list[tuple[bytes, int, int]], **bad: Any) -> M.RelayAcks:
    """Node 0's RelayAcks of ``(local identity, rank, seq)`` items (steps 7+rank, digest "d")."""
    fields: dict[str, Any] = {
        "node_rank": 0,
        "kind": kind,
        "epoch": epoch,
        "idents": [i[0] for i in items],
        "senders": [f"rank:{i[1]}" for i in items],
        "nonces": [7] * len(items),
        "seqs": [i[2] for i in items],
        "ranks": [i[1] for i in items],
        "steps": [7 + i[1] for i in items] if kind != "rebuilt" else [],
        "digests": ["d"] * len(items) if kind == "stopped" else [],
    }
    fields.update(bad)
    return M.RelayAcks(**fields)


def test_columnar_acks_are_recorded_without_a_dispatch_each(ctx, server) -> None:
    """A node's STOPPED, REBUILT and RESUME-closing reports in RelayAcks columns are recorded
    as their own frames would be, with no per-rank dispatch, and count as the phase's
    answers; an item whose identity is not the registered one takes the general path."""
    agent, handled = _acks_job(ctx, server, fast=True)
    server.send([server.model.ranks[r].identity for r in (0, 1)], M.Stop("test"))
    agent.send(_acks("stopped", 1, [(b"L0", 0, 2), (b"L1", 1, 2)]))
    _pump(server, 1)
    r0, r1 = server.model.ranks[0], server.model.ranks[1]
    assert r0.acked(Ack.STOP, 1) and (r0.committed_step, r0.stop_digest) == (7, "d")
    assert r1.acked(Ack.STOP, 1) and (r1.committed_step, r1.stop_digest) == (8, "d")
    assert server.cadence.answered  # the last STOPPED owed: decide before reading on
    agent.send(_acks("rebuilt", 1, [(b"L0", 0, 3), (b"Lx", 1, 3)]))  # Lx: not rank 1's
    agent.send(_acks("worker_hb", 1, [(b"L0", 0, 4), (b"L1", 1, 4)], steps=[30, 5]))
    drops = server.drops.total
    _pump(server, 2)
    assert r0.acked(Ack.REBUILD, 1) and not r1.acked(Ack.REBUILD, 1)
    assert server.drops.total == drops + 1  # "message from unregistered rank 1"
    assert (r0.committed_step, r1.committed_step) == (30, 8)  # no step goes back
    assert [k for k in handled if k != M.RelayAcks.KIND] == [b"rebuilt"]


def test_columnar_repairs_are_the_first_attempts_successes(ctx, server) -> None:
    """A node's REPAIRED in columns is recorded as each rank's own success at the round's
    first attempt would be (its ack and committed step, no failure), with no per-rank
    dispatch; an item of a rank not registered under that identity takes the general path."""
    agent, handled = _acks_job(ctx, server, fast=True)
    agent.send(_acks("repaired", 1, [(b"L0", 0, 2), (b"Lx", 1, 2)]))  # Lx: not rank 1's
    _pump(server, 1)
    r0, r1 = server.model.ranks[0], server.model.ranks[1]
    assert r0.acked(Ack.REPAIR, 1) and r0.committed_step == 7 and r0.repair_failure is None
    assert not r1.acked(Ack.REPAIR, 1) and r1.repair_failure is None
    assert [k for k in handled if k != M.RelayAcks.KIND] == [b"repaired"]


def test_stale_columnar_acks_take_the_general_path(ctx, server) -> None:
    """A batch of another epoch is left, item by item, to the rank's own path: a stale
    STOPPED is dropped there with its reason, a replayed item as a replay."""
    agent, handled = _acks_job(ctx, server, fast=True)
    drops = server.drops.total
    agent.send(_acks("stopped", 0, [(b"L0", 0, 2), (b"L1", 1, 2)]))
    _pump(server, 1)
    assert not server.model.ranks[0].acked(Ack.STOP, 0)
    assert handled.count(b"stopped") == 2 and server.drops.total == drops + 2
    agent.send(_acks("stopped", 0, [(b"L0", 0, 2)]))  # the same seq again: a replay
    _pump(server, 1)
    assert server.drops.total == drops + 3


def test_malformed_columnar_acks_are_dropped_whole(ctx, server) -> None:
    """Columns of unequal length, a kind that is not sent in columns, a claimant agent, a
    rank of another node: dropped and logged, nothing recorded, the manager goes on."""
    agent, handled = _acks_job(ctx, server, fast=True)
    before = server.drops.total + server.relay.drops.total
    agent.send(_acks("stopped", 1, [(b"L0", 0, 2), (b"L1", 1, 2)], steps=[7]))
    agent.send(_acks("rebuilt", 1, [(b"L0", 0, 3)], steps=[1]))
    agent.send(_acks("worker_fault", 1, [(b"L0", 0, 4)]))
    agent.send(_acks("stopped", 1, [(b"L2", 2, 5)]))  # rank 2 is node 1's
    _pump(server, 4)
    assert server.drops.total + server.relay.drops.total == before + 4
    assert not any(server.model.ranks[r].acks for r in (0, 1, 2, 3))
    assert server.errors.total == 0


def test_the_agent_sends_runs_of_answers_in_columns_and_the_rest_in_order(ctx, relay) -> None:
    """A rank's STOPPED, fault and REBUILT: three batches in that order (the manager sees a
    rank's frames in the order it sent them); two ranks' STOPPED of one epoch: one batch."""
    ranks = {r: _rank(ctx, relay, r) for r in (2, 3)}
    ranks[2].send(M.Stopped(2, 5, "a"), epoch=1)
    ranks[2].send(M.WorkerFault(2, "comm", "x"), epoch=1)
    ranks[2].send(M.Rebuilt(2), epoch=1)
    batches = _drained(relay, 3)
    assert [type(b).__name__ for b in batches] == ["RelayAcks", "RelayUp", "RelayAcks"]
    assert [(b.kind, b.ranks) for b in batches if isinstance(b, M.RelayAcks)] == [
        ("stopped", [2]),
        ("rebuilt", [2]),
    ]
    for r, peer in ranks.items():
        peer.send(M.Stopped(r, 6, ""), epoch=2)
    (batch,) = _drained(relay, 2)
    assert isinstance(batch, M.RelayAcks) and sorted(batch.ranks) == [2, 3]
    assert (batch.epoch, batch.steps, batch.digests) == (2, [6, 6], ["", ""])


def test_only_a_first_attempts_successful_repair_travels_in_columns(ctx, relay) -> None:
    """REPAIRED in columns implies attempt 0, ok and no failed peer: both ranks' successes
    share one RelayAcks; a failure, and a retry's success, travel as themselves."""
    ranks = {r: _rank(ctx, relay, r) for r in (2, 3)}
    for r, peer in ranks.items():
        peer.send(M.Repaired(r, 0, True, 9, -1, ""), epoch=1)
    (batch,) = _drained(relay, 2)
    assert isinstance(batch, M.RelayAcks) and batch.kind == "repaired"
    assert (sorted(batch.ranks), batch.steps, batch.digests) == ([2, 3], [9, 9], [])
    ranks[2].send(M.Repaired(2, 0, False, 9, 3, "peer 3 vanished"), epoch=2)
    ranks[3].send(M.Repaired(3, 1, True, 9, -1, ""), epoch=2)
    batches = _drained(relay, 2)
    assert [type(b).__name__ for b in batches] == ["RelayUp"] * len(batches)
    assert [k for b in batches for k in b.kinds] == ["repaired", "repaired"]


def test_ack_columns_name_the_messages_fields() -> None:
    """What RelayAcks carries per kind, with the fields its items imply or leave out, is
    exactly that message's fields; only a heartbeat's step timing is left out (an urgent one
    travels in a RelayUp; a folded one's timing rides on its agent's heartbeat)."""
    from ms_recover.protocol.relay import ACK_COLUMNS, ACK_DROPPED, ACK_IMPLIED

    for kind, fields in ACK_COLUMNS.items():
        names = M.field_types(M.KINDS[kind.encode()])
        rest = [*ACK_IMPLIED.get(kind, {}), *ACK_DROPPED.get(kind, ())]
        assert sorted(names) == sorted(["rank", *fields, *rest]), kind
    assert ACK_DROPPED == {"worker_hb": ("health",)}
