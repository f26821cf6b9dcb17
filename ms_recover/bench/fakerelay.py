"""Simulated node agents relaying for their ranks (docs/design.md §1c), for ``bench controlplane``.

Each simulated agent is one DEALER socket to the manager, as a real ``ms-recover agent`` is.
Its ranks have no socket of their own: the rank -> agent hop is local to a node and is not the
manager's load, and a socket per rank would cap the bench at the open-file limit (20,000 here).
So the agent stands for its ranks and speaks exactly what a real agent's relay
(:mod:`ms_recover.agent.relay`) sends the manager:

* its ranks' registrations and answers as :class:`~ms_recover.protocol.messages.RelayUp`
  batches, and their STOPPED, REBUILT and RESUME-closing reports in the columns of a
  :class:`~ms_recover.protocol.messages.RelayAcks`, per agent per wake-up, each item with the
  rank's own sender name and seq;
* their heartbeats folded into the agent's heartbeat (``AgentHeartbeat.steps``), except the
  report that closes a RESUME, which goes at once (as the real relay sends it); the agent's
  beat skipped while it relayed a frame and heard the manager within the beat interval,
  unless it carries steps (as a real agent: ``Agent._exchanging``);
* the manager's :class:`~ms_recover.protocol.messages.RelayDown` batches answered per target
  rank at once: STOPPED, REBUILT, REPAIRED, and the RESUME step committed immediately (a
  stop-all's lone STOP item: its RelayAcks built directly, the same frame);
* with heartbeat groups (``FakeSpec.group_size`` > 1, docs/design.md §1c), what a real group
  leader (:mod:`ms_recover.agent.group`) sends the manager: its ``GroupOpen`` after its
  welcome, and every quarter agent beat one ``GroupBeats`` of the heartbeats its members
  sent it meanwhile; a member beats to its leader once the manager said where
  (``GroupAt``); a ``GroupStop`` to a leader answered with one ``GroupStopped`` of the STOPPED
  of every rank it names. The member -> leader hop is between two nodes, not the manager's load, so
  it is a list in this process (each fake holds whole groups), not a socket.

Incoming bodies are read only where the answer needs them (REPAIR, RESUME), as in
:mod:`ms_recover.bench.fakecluster`.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Any

import msgpack

from ms_recover.agent.group import add_stopped
from ms_recover.agent.relay import next_report_at
from ms_recover.bench.fakecluster import ENDPOINT, FakeCluster, FakeSpec, _Member, _peek
from ms_recover.protocol import messages as M
from ms_recover.protocol.relay import ack_run, relay_acks

_NEED = frozenset({"repair", "resume"})
#: A simulated rank's step timing after its epoch (worker.health's fields): 10 ms since its
#: last commit, in no collective, p99 50 ms, compute median 40 ms and tenth percentile 35 ms,
#: no long stretch. The manager judges hangs and slow ranks on every report, as in a real job.
_TIMING = (0.01, -1.0, 0.05, 0.04, 0.035, 0.0)
GROUP_ENDPOINT = "tcp://127.0.0.1:1"  # a simulated leader's: its members are in-process


def _ident(m: _Member) -> bytes:
    """A simulated agent's identity at the manager (FakeCluster.connect_some names it)."""
    return f"a{m.node}.fake".encode()


def _peek_relay(payload: bytes) -> tuple[int, Any]:
    """A RelayDown's epoch and ``(kinds, epochs, targets, bodies)``, bodies read only where an
    answer needs them (the manager packs ``bodies`` last, see ManagerRelay._send)."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=len(payload) + 1)
    unpacker.feed(payload)
    epoch, parsed = 0, dict[str, Any]()
    for _ in range(unpacker.read_map_header()):
        key = unpacker.unpack()
        if key == "epoch":
            epoch = unpacker.unpack()
        elif key == "body":
            for _ in range(unpacker.read_map_header()):
                field = unpacker.unpack()
                if field == "bodies":
                    kinds = parsed["kinds"]
                    parsed["bodies"] = [
                        unpacker.unpack() if kinds[i] in _NEED else unpacker.skip()
                        for i in range(unpacker.read_array_header())
                    ]
                else:
                    parsed[field] = unpacker.unpack()
        else:
            unpacker.skip()
    return epoch, (parsed["kinds"], parsed["epochs"], parsed["targets"], parsed["bodies"])


def _run(item: tuple[_Member, M.Message, int]) -> tuple[str, int] | None:
    return ack_run(item[1], item[2])


class RelayCluster(FakeCluster):
    """The agents of one fake process, each standing for its ranks through the relay."""

    def __init__(self, spec: FakeSpec) -> None:
        super().__init__(spec)
        self.of_node: dict[int, list[_Member]] = {}
        self.by_local: dict[bytes, _Member] = {}
        for rank in self.ranks.values():
            self.of_node.setdefault(rank.node, []).append(rank)
            self.by_local[self._local(rank)] = rank
        self._items: dict[int, list[tuple[_Member, M.Message, int]]] = {}
        self._report_at: dict[int, float] = {}  # node -> when its next beat carries steps
        self._sent_at: dict[int, float] = {}  # node -> when its agent last relayed a frame
        self._heard_at: dict[int, float] = {}  # node -> when its agent last heard the manager
        size = spec.group_size
        self._size = size
        members = [n for n in spec.nodes if size > 1 and n % size]
        self._leaders = {n - n % size for n in members}  # leaders of a group of 2 nodes or more
        self._joined: set[int] = set()  # members told where their leader is (GroupAt)
        # leader -> member node -> (its identity at the manager, steps, health) since the last
        # batch
        self._group: dict[int, dict[int, tuple[bytes, dict[int, int], dict[int, list[float]]]]]
        self._group = {}
        self._flush_s = spec.agent_s / 4
        self._flushed = 0.0

    @staticmethod
    def _local(rank: _Member) -> bytes:
        """The rank's identity at its agent (a new one per incarnation, as a real rank's)."""
        return f"r{rank.rank}.{rank.incarnation}".encode()

    # ------------------------------------------------------------------ up
    def _relay(self, rank: _Member, msg: M.Message, epoch: int) -> None:
        self._items.setdefault(rank.node, []).append((rank, msg, epoch))

    def _flush(self, node: int) -> None:
        """Send what the node's ranks answered since the last flush, in order, as the real
        relay batches it: a run of one answer kind and epoch as one RelayAcks, the rest as
        RelayUp (:meth:`LocalRelay.batches <ms_recover.agent.relay.LocalRelay.batches>`)."""
        items = self._items.pop(node, [])
        for rank, _, _ in items:
            rank.seq += 1
        for run, batch in itertools.groupby(items, key=_run):
            self.send(self.agents[node], self._batch(node, run, list(batch)))
        if items:
            self._sent_at[node] = time.monotonic()

    def _batch(
        self, node: int, run: tuple[str, int] | None, items: list[tuple[_Member, M.Message, int]]
    ) -> M.Message:
        ranks = [r for r, _, _ in items]
        idents, senders = [self._local(r) for r in ranks], [r.sender for r in ranks]
        nonces, seqs = [self.codec.nonce] * len(items), [r.seq for r in ranks]
        msgs: list[Any] = [msg for _, msg, _ in items]
        if run is None:
            epochs, kinds = [e for _, _, e in items], [m.KIND.decode() for m in msgs]
            bodies = [m.to_wire() for m in msgs]
            return M.RelayUp(node, idents, senders, nonces, seqs, epochs, kinds, bodies)
        return relay_acks(node, *run, list(zip(idents, senders, nonces, seqs, strict=True)), msgs)

    def hello(self, m: _Member) -> None:
        super().hello(m)
        if not m.is_agent:
            return
        ranks = self.of_node[m.node]
        self._unwelcomed += len(ranks)
        for r in ranks:
            self._hello_rank(r)
        self._flush(m.node)

    def _hello_rank(self, r: _Member) -> None:
        hello = M.WorkerHello(r.rank, r.node, r.pid, r.incarnation, ENDPOINT, r.committed, 0)
        self._relay(r, hello, 0)

    def beat(self, m: _Member) -> None:
        if not (m.alive and m.welcomed):
            return
        steps: dict[int, int] = {}
        health: dict[int, list[float]] = {}
        now = time.monotonic()
        if now >= self._report_at.get(m.node, 0.0):  # as a real agent (rank_report_s)
            steps = {r.rank: r.committed for r in self.of_node[m.node] if r.alive and r.welcomed}
            # each rank's step timing, as a real rank's heartbeat carries it (worker.health)
            health = {r: [float(self.ranks[r].epoch), *_TIMING] for r in steps}
            self._report_at[m.node] = next_report_at(
                now, self.spec.rank_report_s, self.spec.agent_s
            )
        beat = self.spec.agent_s
        if (
            not steps
            and now - self._sent_at.get(m.node, -math.inf) < beat
            and now - self._heard_at.get(m.node, -math.inf) < beat
        ):
            return  # exchanging with the manager anyway: no beat (as Agent._exchanging)
        if m.node in self._joined:  # to the group's leader (a list here, see the docstring)
            batch = self._group.setdefault(m.node - m.node % self._size, {})
            held = batch.get(m.node)
            if held:
                steps, health = {**held[1], **steps}, {**held[2], **health}
            batch[m.node] = (_ident(m), steps, health)
            return
        self.send(m, M.AgentHeartbeat(m.node, steps, health))

    def tick(self) -> None:
        """Every quarter agent beat, each leader's batch of its members' heartbeats."""
        now = time.monotonic()
        if now - self._flushed < self._flush_s:
            return
        self._flushed = now
        batches, self._group = self._group, {}
        for leader, items in batches.items():
            nodes = sorted(items)
            idents = [items[n][0] for n in nodes]
            steps = [items[n][1] for n in nodes]
            beats = M.GroupBeats(leader, nodes, idents, steps, [items[n][2] for n in nodes])
            self.send(self.agents[leader], beats)
            self._sent_at[leader] = now  # as a real leader: its own beat may be skipped

    # ------------------------------------------------------------------ down
    def peek(self, kind: bytes, payload: bytes) -> tuple[int, Any]:
        if kind == M.RelayDown.KIND:
            return _peek_relay(payload)
        if kind == M.GroupStop.KIND:
            return _peek(payload, True)
        return super().peek(kind, payload)

    def _on(self, m: _Member, kind: bytes, epoch: int, body: Any) -> None:
        self._heard_at[m.node] = time.monotonic()
        if kind == M.GroupAt.KIND:
            self._joined.add(m.node)
        elif kind == M.GroupStop.KIND:
            self._group_stop(m.node, epoch, body)
        elif kind != M.RelayDown.KIND:
            opens = kind == M.AgentWelcome.KIND and not m.welcomed and m.node in self._leaders
            super()._on(m, kind, epoch, body)
            if opens:
                self.send(m, M.GroupOpen(m.node, GROUP_ENDPOINT))
        elif body[0] == ["stop"]:
            self._stop(m.node, body[1][0], body[2][0])
        else:
            self._down(m.node, body)

    def _group_stop(self, leader: int, epoch: int, body: dict[str, Any]) -> None:
        """A leader's GroupStop: each member's ranks answer, and the leader sends their
        STOPPED as one GroupStopped (the member -> leader hops are in this process)."""
        out = M.GroupStopped(leader, epoch, [], [], [], [], [], [], [])
        columns = body["nodes"], body["idents"], body["targets"]
        for node, ident, targets in zip(*columns, strict=True):
            ranks = self._stopping(epoch, targets)
            if ranks:
                who = [self._local(r) for r in ranks], [r.rank for r in ranks]
                steps = [r.committed for r in ranks]
                add_stopped(out, node, ident, *who, steps, [""] * len(ranks))
                self._sent_at[node] = time.monotonic()
        if out.nodes:
            self.send(self.agents[leader], out)

    def _stopping(self, epoch: int, targets: list[bytes]) -> list[_Member]:
        """The live ranks among ``targets``, each now stopped in ``epoch``."""
        ranks = [r for r in map(self.by_local.get, targets) if r is not None and r.alive]
        for r in ranks:
            r.epoch = max(r.epoch, epoch)
            r.seq += 1
        return ranks

    def _stop(self, node: int, epoch: int, targets: list[bytes]) -> None:
        """A stop-all's one STOP item for ``targets``: the RelayAcks of their STOPPED, the very
        frame :meth:`_down` sends for it (the same columns, seqs and epochs), built at once.
        The simulated nodes share this host's cores with the manager they stand beside, so
        what a real agent spends on its own machine is kept small here."""
        ranks = self._stopping(epoch, targets)
        if not ranks:
            return
        n = len(ranks)
        acks = M.RelayAcks(
            node,
            "stopped",
            epoch,
            [self._local(r) for r in ranks],
            [r.sender for r in ranks],
            [self.codec.nonce] * n,
            [r.seq for r in ranks],
            [r.rank for r in ranks],
            [r.committed for r in ranks],
            [""] * n,
        )
        self.send(self.agents[node], acks)
        self._sent_at[node] = time.monotonic()

    def _down(self, node: int, body: Any) -> None:
        """A RelayDown's items, each target rank answering as a real rank would."""
        for kind_i, epoch_i, targets, body_i in zip(*body, strict=True):
            for local in targets:
                rank = self.by_local.get(local)
                if rank is not None and rank.alive:
                    rank.epoch = max(rank.epoch, epoch_i)
                    self._answer(rank, kind_i, epoch_i, body_i)
        self._flush(node)

    def _answer(self, r: _Member, kind: str, epoch: int, body: Any) -> None:
        if kind == "welcome":
            if not r.welcomed:
                r.welcomed = True
                self._unwelcomed -= 1
        elif kind == "stop":
            self._relay(r, M.Stopped(r.rank, r.committed, ""), epoch)
        elif kind == "rebuild":
            self._relay(r, M.Rebuilt(r.rank), epoch)
        elif kind == "repair":
            r.committed = max(r.committed, body["target_step"])
            self._relay(r, M.Repaired(r.rank, body["attempt"], True, r.committed, -1, ""), epoch)
        elif kind == "resume":
            r.committed = body["step"]  # committed at once; the closing report goes at once
            self._relay(r, M.WorkerHeartbeat(r.rank, r.committed), epoch)

    def _restart(self, m: _Member) -> None:
        m.incarnation += 1
        m.alive, m.committed, m.epoch = True, -1, 0
        self.by_local[self._local(m)] = m
        self._hello_rank(m)
        self._flush(m.node)
