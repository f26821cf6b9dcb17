"""Simulated agents and ranks for the control-plane benchmark: real sockets, no training.

One :func:`fake_main` process plays a slice of the job's nodes. Every simulated agent and
every simulated rank is its own ZeroMQ DEALER socket with its own identity and TCP connection
to the manager, speaking the real protocol (authenticated frames encoded by
:class:`~ms_recover.protocol.codec.Codec`), so the manager does exactly the per-peer work it
would do in a real job. What is simulated is the work behind the messages:

* a rank acks STOP, REBUILD and REPAIR at once, and "commits" the RESUME step immediately;
* an agent ignores KillRanks (the rank is already dead) and answers StartRanks by registering
  the rank again (new pid and incarnation, same socket), but only when the parent releases it:
  a real restart takes seconds (MindSpore's import alone), and the benchmark measures the stop
  phase without the rest of the recovery running behind it;
* heartbeats of all members are spread evenly over ``heartbeat_s``.

Thousands of sockets are watched with ``epoll`` on each socket's notification descriptor
(``zmq.FD``), so a wake-up costs only the sockets that have something, not a scan of all of
them. Incoming frames are not MAC-checked and big bodies (REBUILD carries every rank's endpoint) are
skipped, not decoded: the fakes stand for thousands of machines and must not be the bottleneck.
The parent drives a fake over a ``multiprocessing`` pipe: ``("fault", rank)`` makes the rank's
agent report it killed by SIGKILL and answers with the wall time just before the report;
``("release", None)`` carries out the held restarts; ``("quit", None)`` closes every socket
and returns.
"""

from __future__ import annotations

import dataclasses
import os
import select
import time
from collections import deque
from typing import Any

import msgpack
import zmq

from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import TAG_BYTES, Codec
from ms_recover.protocol.transport import curve_client, recv_frames, send_frames

_EVENTS, _EV, _POLLIN = zmq.backend.Socket.get, int(zmq.EVENTS), int(zmq.POLLIN)

#: Connections in flight at once per fake process (the manager listens with a deep backlog).
CONNECT_BATCH = 1024
ENDPOINT = "fake"  # the data-plane endpoint a simulated rank registers (kept short on purpose)
_NEED_BODY = {M.Repair.KIND, M.Resume.KIND, M.StartRanks.KIND, M.Welcome.KIND}


@dataclasses.dataclass(frozen=True)
class FakeSpec:
    endpoint: str
    job_id: str
    secret: bytes
    nodes: tuple[int, ...]
    proc_per_node: int
    heartbeat_s: float
    max_frame_bytes: int
    #: Ranks behind their agent's relay (docs/design.md §1c): only agents have sockets, and
    #: :class:`~ms_recover.bench.fakerelay.RelayCluster` speaks for their ranks.
    relay: bool = False
    #: How often the simulated agents beat (``JobConfig.agent_heartbeat_s``, as real agents);
    #: 0: ``heartbeat_s``. Directly connected ranks beat every ``heartbeat_s``.
    agent_heartbeat_s: float = 0.0
    #: How often a simulated agent's beat carries its ranks' steps (``JobConfig.rank_report_s``,
    #: as real agents); 0: every beat.
    rank_report_s: float = 0.0
    #: The manager's CURVE public key (Z85) when the job has a secret, as a real member's
    #: channel (:func:`~ms_recover.protocol.transport.manager_channel`); empty: plain TCP.
    server_key: bytes = b""
    #: ``JobConfig.group_size``: with the relay, agents beat through their heartbeat group's
    #: leader (docs/design.md §1c); the parent gives each fake whole groups.
    group_size: int = 1

    @property
    def agent_s(self) -> float:
        return self.agent_heartbeat_s or self.heartbeat_s


class _Member:
    """One simulated process: an agent (rank == -1) or a rank."""

    __slots__ = (
        "node",
        "rank",
        "sock",
        "epoch",
        "committed",
        "incarnation",
        "alive",
        "welcomed",
        "seq",
    )

    def __init__(self, node: int, rank: int) -> None:
        self.node, self.rank = node, rank
        self.sock: zmq.Socket[bytes] | None = None
        self.epoch, self.committed, self.incarnation, self.seq = 0, -1, 0, 0
        self.alive, self.welcomed = True, False

    @property
    def is_agent(self) -> bool:
        return self.rank < 0

    @property
    def pid(self) -> int:
        return 1_000_000 + max(self.rank, 0) * 100 + self.incarnation

    @property
    def sender(self) -> str:
        return f"agent:{self.node}" if self.is_agent else f"rank:{self.rank}"


def _peek(payload: bytes, with_body: bool) -> tuple[int, Any]:
    """The envelope's epoch (and body if asked) without building the rest in Python."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=len(payload) + 1)
    unpacker.feed(payload)
    epoch, body = 0, None
    for _ in range(unpacker.read_map_header()):
        key = unpacker.unpack()
        if key == "epoch":
            epoch = unpacker.unpack()
        elif key == "body" and with_body:
            body = unpacker.unpack()
        else:
            unpacker.skip()
    return epoch, body


class FakeCluster:
    """The members of one fake process and the replies they owe the manager."""

    def __init__(self, spec: FakeSpec) -> None:
        self.spec = spec
        self.codec = Codec(spec.job_id, spec.secret, spec.max_frame_bytes)
        self.members: list[_Member] = []
        self.agents: dict[int, _Member] = {}
        self.ranks: dict[int, _Member] = {}
        for node in spec.nodes:
            self.agents[node] = agent = _Member(node, -1)
            self.members.append(agent)
            for local in range(spec.proc_per_node):
                rank = node * spec.proc_per_node + local
                self.ranks[rank] = member = _Member(node, rank)
                if not spec.relay:
                    self.members.append(member)
        n_sockets = len(self.members) + 64
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, max(n_sockets, self.ctx.get(zmq.MAX_SOCKETS)))
        self.epoll = select.epoll()
        self.by_fd: dict[int, _Member] = {}
        self.ready: set[_Member] = set()  # members whose socket may hold unread messages
        self._pending = deque(self.members)
        self._unwelcomed = 0
        self.handled = 0
        self.held: list[_Member] = []  # ranks whose restart waits for the parent's release
        # One CURVE key pair for the process's sockets: a real member draws its own, which
        # costs the manager nothing more (it accepts any client key that knows its own).
        self._curve = zmq.curve_keypair() if spec.server_key else None

    # ------------------------------------------------------------------ sending
    def send(self, m: _Member, msg: M.Message, epoch: int | None = None) -> None:
        assert m.sock is not None
        m.seq += 1
        frames = self.codec.encode(msg, m.epoch if epoch is None else epoch, m.sender, m.seq)
        try:
            send_frames(m.sock, frames)  # pyzmq's backend calls: the fakes share the cores
        except zmq.Again:
            pass  # a full pipe: the manager is not reading; the heartbeat will say it again
        # A send may consume the descriptor's wake-up for a message that arrived meanwhile.
        if int(_EVENTS(m.sock, _EV)) & _POLLIN:
            self.ready.add(m)

    def hello(self, m: _Member) -> None:
        if m.is_agent:
            per = self.spec.proc_per_node  # a node's ranks are consecutive
            ranks = list(range(m.node * per, (m.node + 1) * per))
            self.send(m, M.AgentHello(m.node, "127.0.0.1", ranks, m.pid, m.node == 0), 0)
        else:
            self.send(
                m, M.WorkerHello(m.rank, m.node, m.pid, m.incarnation, ENDPOINT, m.committed, 0), 0
            )

    def beat(self, m: _Member) -> None:
        if not (m.alive and m.welcomed):
            return
        if m.is_agent:
            self.send(m, M.AgentHeartbeat(m.node))
        else:
            self.send(m, M.WorkerHeartbeat(m.rank, m.committed))

    # ------------------------------------------------------------------ connecting
    def connect_some(self) -> None:
        """Open connections in batches so the manager's listen backlog never overflows."""
        while self._pending and self._unwelcomed < CONNECT_BATCH:
            m = self._pending.popleft()
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            tag = "a" if m.is_agent else "r"
            sock.setsockopt(zmq.ROUTING_ID, f"{tag}{max(m.rank, m.node)}.fake".encode())
            if self._curve is not None:
                curve_client(sock, self.spec.server_key, self._curve)
            sock.connect(self.spec.endpoint)
            m.sock = sock
            fd = int(sock.getsockopt(zmq.FD))
            self.by_fd[fd] = m
            self.epoll.register(fd, select.EPOLLIN)
            self._unwelcomed += 1
            self.hello(m)

    @property
    def all_welcomed(self) -> bool:
        return not self._pending and self._unwelcomed == 0

    # ------------------------------------------------------------------ receiving
    def drain(self, m: _Member) -> None:
        """Handle every message waiting on ``m``'s socket."""
        sock = m.sock
        assert sock is not None
        while True:
            try:
                frames = recv_frames(sock)
            except zmq.Again:
                return
            if len(frames) != 1 or not m.alive:
                continue
            frame = frames[0]  # b"msr2" | len(kind) | kind | envelope | tag (protocol.codec)
            start = 5 + frame[4]
            kind = frame[5:start]
            epoch, body = self.peek(kind, frame[start:-TAG_BYTES])
            self.handled += 1
            if epoch >= m.epoch:
                m.epoch = epoch
            self._on(m, kind, epoch, body)

    def peek(self, kind: bytes, payload: bytes) -> tuple[int, Any]:
        """The envelope's epoch, and the body where the reply needs it."""
        return _peek(payload, kind in _NEED_BODY)

    def _on(self, m: _Member, kind: bytes, epoch: int, body: Any) -> None:
        if kind in (M.Welcome.KIND, M.AgentWelcome.KIND):
            if not m.welcomed:
                m.welcomed = True
                self._unwelcomed -= 1
        elif kind == M.Stop.KIND:
            self.send(m, M.Stopped(m.rank, m.committed, ""), epoch)
        elif kind == M.Rebuild.KIND:
            self.send(m, M.Rebuilt(m.rank), epoch)
        elif kind == M.Repair.KIND:
            m.committed = max(m.committed, body["target_step"])
            self.send(m, M.Repaired(m.rank, body["attempt"], True, m.committed, -1, ""), epoch)
        elif kind == M.Resume.KIND:
            m.committed = body["step"]  # the first step after recovery, committed at once
            self.beat(m)
        elif kind == M.StartRanks.KIND:
            self.held.extend(self.ranks[r] for r in body["ranks"] if self.ranks[r] not in self.held)

    def release(self) -> int:
        """Restart every held rank (register it again); how many."""
        held, self.held = self.held, []
        for m in held:
            self._restart(m)
        return len(held)

    def _restart(self, m: _Member) -> None:
        m.incarnation += 1
        m.alive, m.committed, m.epoch = True, -1, 0
        self.hello(m)

    def fault(self, rank: int) -> float:
        """Report ``rank`` killed by SIGKILL from its agent; returns the wall time of the report."""
        m = self.ranks[rank]
        m.alive = False
        t0 = time.time()
        self.send(self.agents[m.node], M.RankExited(m.node, rank, m.pid, -9, 9, t0))
        return t0

    def tick(self) -> None:
        """Work due on the clock rather than on a frame (none here)."""

    def close(self) -> None:
        self.epoll.close()
        for m in self.members:
            if m.sock is not None:
                m.sock.close(0)
        self.ctx.term()


def fake_main(spec: FakeSpec, conn: Any) -> None:
    """Run one fake process until the parent says quit (or the pipe closes)."""
    if spec.relay:
        from ms_recover.bench.fakerelay import RelayCluster

        cluster: FakeCluster = RelayCluster(spec)
    else:
        cluster = FakeCluster(spec)
    cluster.epoll.register(conn.fileno(), select.EPOLLIN)
    schedules = [
        _Schedule([m for m in cluster.members if m.is_agent], spec.agent_s),
        _Schedule([m for m in cluster.members if not m.is_agent], spec.heartbeat_s),
    ]
    start, ready_sent = time.monotonic(), False
    try:
        while True:
            cluster.connect_some()
            for fd, _ in cluster.epoll.poll(0.02):
                if fd == conn.fileno():
                    if _command(cluster, conn):
                        return
                else:
                    cluster.ready.add(cluster.by_fd[fd])
            while cluster.ready:
                cluster.drain(cluster.ready.pop())
            if cluster.all_welcomed and not ready_sent:
                conn.send(("ready", os.getpid()))
                ready_sent = True
            elapsed = time.monotonic() - start
            for schedule in schedules:
                schedule.beat(cluster, elapsed)
            cluster.tick()
    finally:
        cluster.close()
        conn.close()


class _Schedule:
    """Heartbeats spread evenly: member i of n beats at start + (k + i/n) * period."""

    def __init__(self, members: list[_Member], period: float) -> None:
        self.members, self.period, self.beats = members, period, 0

    def beat(self, cluster: FakeCluster, elapsed: float) -> None:
        n = len(self.members)
        due = int(elapsed / self.period * n) if n else 0
        while self.beats < due:
            cluster.beat(self.members[self.beats % n])
            self.beats += 1


def _command(cluster: FakeCluster, conn: Any) -> bool:
    """Carry out one command from the parent; True to quit."""
    try:
        what, arg = conn.recv()
    except EOFError:
        return True
    if what == "fault":
        conn.send(("fault", cluster.fault(int(arg))))
    elif what == "release":
        conn.send(("release", cluster.release()))
    elif what == "stats":
        # CPU of the whole process (its ZeroMQ I/O thread too): the simulated nodes' share.
        conn.send(("stats", {"handled": cluster.handled, "cpu_s": time.process_time()}))
    return bool(what == "quit")
