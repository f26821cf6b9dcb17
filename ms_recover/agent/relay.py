"""The agent's local relay: its ranks talk to it, not to the manager (docs/design.md §1c).

The agent binds a ZeroMQ ROUTER on ``127.0.0.1`` (an ephemeral port, so nothing outside the
pod can reach it) and gives each rank it launches the endpoint in ``MS_RECOVER_RELAY_ENDPOINT``.
The rank's :class:`~ms_recover.worker.link.ManagerLink` connects there instead of to the
manager, with the same protocol: frames signed with the job secret, CURVE with the manager's
keys when the job has a secret, the same size cap.

Guarantees:

* every rank frame is authenticated and bounded exactly as the manager does it
  (:meth:`Codec.decode <ms_recover.protocol.codec.Codec.decode>`, a replay guard); a bad frame,
  a kind that is not worker -> manager, or a rank that is not this node's is dropped and logged
  (rate limited), never raised;
* what arrives is passed on at once and in order, per wake-up for everything that was ready
  (a STOPPED waits for no timer): a run of STOPPED, REBUILT or RESUME-closing reports of one
  epoch as one :class:`~ms_recover.protocol.messages.RelayAcks` (columns, no map per rank),
  anything else as :class:`~ms_recover.protocol.messages.RelayUp` frames;
* a rank's periodic heartbeat is folded into the agent's own (``AgentHeartbeat.steps``, once
  per ``JobConfig.rank_report_s``: :meth:`LocalRelay.report`), except the first one at or
  after the step a RESUME named, which the manager waits for to close a recovery: that one is
  relayed at once, and so is one the rank marked ``urgent`` (a stall or a slowdown); the last
  folded heartbeat's step timing rides along (``AgentHeartbeat.health``);
* a :class:`~ms_recover.protocol.messages.RelayDown` from the manager is fanned out in order,
  each message signed once by this agent and sent to each target identity; a message kind that
  is not manager -> worker, or a body that fails its checks, is dropped and logged.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterator

import zmq

from ms_recover.config import JobConfig
from ms_recover.errors import ProtocolError
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Codec, DropLog, Envelope, message_of
from ms_recover.protocol.relay import DOWN_KINDS, UP_KINDS, ack_run, rank_of, relay_acks
from ms_recover.protocol.replay import ReplayGuard
from ms_recover.protocol.transport import SLACK, relay_router, send_frames

log = logging.getLogger("ms_recover.agent")

DRAIN_BUDGET = 4096  # frames read per drain: a bound, not a limit that real traffic reaches


def ready_frames(sock: zmq.Socket[bytes]) -> Iterator[list[bytes]]:
    """Each message waiting on a member-facing ROUTER now (at most DRAIN_BUDGET)."""
    for _ in range(DRAIN_BUDGET):
        try:
            yield sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return


def opened(frames: list[bytes], codec: Codec, drops: DropLog, where: str) -> Envelope | None:
    """The envelope of a ROUTER message (identity, frame), or None: a bad frame is dropped
    and logged with its reason and the sender's identity."""
    try:
        return codec.decode(frames[1:])
    except ProtocolError as exc:
        drops.drop(str(exc), f"{where} {frames[0][:16]!r}")
        return None


def _run(env: Envelope) -> tuple[str, int] | None:
    return ack_run(env.msg, env.epoch)


def next_report_at(now: float, report_s: float, beat_s: float) -> float:
    """When an agent's heartbeat next carries its ranks' steps, after one that did at ``now``:
    a report period on, less half a beat, so the first beat at or after it carries them."""
    return now + report_s - beat_s / 2


class LocalRelay:
    """The ROUTER the node's ranks connect to, and what they sent since the last batch."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], config: JobConfig) -> None:
        self.config = config
        self.node_rank = config.node_rank
        self.sock, self.endpoint = relay_router(ctx, config, "127.0.0.1")
        self.codec = Codec(config.job_id, config.effective_secret(), config.max_frame_bytes)
        self.replay = ReplayGuard(max_senders=4 * config.proc_per_node + 64)
        self.drops = DropLog(log)
        self.mine = frozenset(config.ranks_of(config.node_rank))
        self._seq = itertools.count()
        self._items: list[tuple[bytes, Envelope, int]] = []  # (identity, envelope, bytes)
        self._steps: dict[int, tuple[bytes, int]] = {}  # rank -> (identity, committed step)
        self._health: dict[int, list[float]] = {}  # rank -> its last heartbeat's health
        self.health: dict[int, list[float]] = {}  # of the ranks in the last take_steps()
        self._latest: dict[int, bytes] = {}  # rank -> the identity it last wrote from
        self.stepped: set[int] = set()  # ranks whose heartbeat named a committed step
        self._urgent: dict[bytes, int] = {}  # identity -> the step its RESUME named
        self._report_at = -math.inf  # when the next heartbeat carries the steps (see report)
        self._stops: dict[bytes, int] = {}  # identity -> the epoch of the last STOP it was sent

    def adopt(self, config: JobConfig) -> None:
        """A spare node took ``config.node_rank``: relay that node's ranks from now on."""
        self.config, self.node_rank = config, config.node_rank
        self.mine = frozenset(config.ranks_of(config.node_rank))

    # ------------------------------------------------------------------ ranks -> manager
    def drain(self) -> bool:
        """Read every frame that is ready; True if anything is now waiting to be relayed."""
        for frames in ready_frames(self.sock):
            self._accept(frames)
        return bool(self._items)

    def _accept(self, frames: list[bytes]) -> None:
        ident = frames[0]
        env = opened(frames, self.codec, self.drops, "local")
        if env is None:
            return
        if env.msg.KIND not in UP_KINDS:
            self.drops.drop(f"{env.msg.KIND.decode()} is not relayed to the manager", env.sender)
            return
        rank = rank_of(env.msg)
        if rank not in self.mine:
            self.drops.drop(f"rank {rank} is not on node {self.node_rank}", env.sender)
            return
        replayed = self.replay.check(env.sender, env.nonce, env.seq)
        if replayed:
            self.drops.drop(replayed, env.sender)
            return
        self._latest[rank] = ident
        msg = env.msg
        if isinstance(msg, M.WorkerHeartbeat):
            if msg.committed_step >= 0:
                self.stepped.add(rank)
            if not msg.urgent and not self._due(ident, msg.committed_step):
                self._steps[rank] = (ident, msg.committed_step)
                if msg.health:
                    self._health[rank] = msg.health
                return
        self._items.append((ident, env, sum(map(len, frames[1:]))))

    def _due(self, ident: bytes, step: int) -> bool:
        """Whether this heartbeat closes a RESUME (relayed at once instead of folded)."""
        resume = self._urgent.get(ident)
        if resume is None or step < resume:
            return False
        del self._urgent[ident]
        return True

    def batches(self) -> list[M.RelayUp | M.RelayAcks]:
        """What arrived since the last call, in order, as messages under the frame limit: a
        run of one answer kind and epoch (:func:`~ms_recover.protocol.relay.ack_run`) as
        one RelayAcks, anything else as RelayUp."""
        out: list[M.RelayUp | M.RelayAcks] = []
        items, self._items = self._items, []
        limit = self.codec.max_bytes - SLACK
        start, size = 0, 0
        for i, (_, env, n) in enumerate(items):
            if i > start and (size + n > limit or _run(env) != _run(items[start][1])):
                out.append(self._batch(items[start:i]))
                start, size = i, 0
            size += n + 64
        if start < len(items):
            out.append(self._batch(items[start:]))
        return out

    def _batch(self, items: list[tuple[bytes, Envelope, int]]) -> M.RelayUp | M.RelayAcks:
        idents = [ident for ident, _, _ in items]
        envs = [env for _, env, _ in items]
        run = _run(envs[0])
        if run is not None:
            heads = [(i, e.sender, e.nonce, e.seq) for i, e in zip(idents, envs, strict=True)]
            return relay_acks(self.node_rank, *run, heads, [e.msg for e in envs])
        return M.RelayUp(
            self.node_rank,
            idents,
            [e.sender for e in envs],
            [e.nonce for e in envs],
            [e.seq for e in envs],
            [e.epoch for e in envs],
            [e.msg.KIND.decode() for e in envs],
            [e.msg.to_wire() for e in envs],
        )

    def report(self, now: float) -> dict[int, int]:
        """What the agent's heartbeat at ``now`` carries: the folded heartbeats
        (:meth:`take_steps`) once per ``JobConfig.rank_report_s``, else nothing (the beat is
        then the node's liveness alone, and the steps wait for the next report)."""
        if now < self._report_at:
            return {}
        self._report_at = next_report_at(
            now, self.config.rank_report_s, self.config.agent_heartbeat_s
        )
        return self.take_steps()

    def take_steps(self) -> dict[int, int]:
        """The folded heartbeats since the last call: each rank's committed step, from the
        process that last wrote (an exited incarnation's beat is not passed on)."""
        steps = {r: s for r, (ident, s) in self._steps.items() if self._latest.get(r) == ident}
        health, self._steps, self._health = self._health, {}, {}
        self.health = {r: h for r, h in health.items() if r in steps}
        return steps

    # ------------------------------------------------------------------ manager -> ranks
    def deliver(self, msg: M.RelayDown, led: bool = False) -> int:
        """Fan a RelayDown out to its targets, in order; how many frames were sent. ``led``:
        it came through the heartbeat group's leader, which passes STOPs only: a rank that
        was sent a STOP of that epoch already (the manager sent it again directly, the
        leader's came late) is not sent the leader's."""
        lists = (msg.kinds, msg.epochs, msg.targets, msg.bodies)
        if len({len(x) for x in lists}) != 1:
            self.drops.drop("relay batch with lists of unequal length", "manager")
            return 0
        sent = 0
        for kind, epoch, targets, body in zip(*lists, strict=True):
            sent += self._deliver_one(kind.encode(), epoch, targets, body, led)
        return sent

    def _deliver_one(
        self, kind: bytes, epoch: int, targets: list[bytes], body: dict[str, object], led: bool
    ) -> int:
        if kind not in DOWN_KINDS:
            self.drops.drop(f"{kind[:32]!r} may not be relayed to a rank", "manager")
            return 0
        try:
            message = message_of(kind, body)
        except ProtocolError as exc:
            self.drops.drop(f"relayed {exc}", "manager")
            return 0
        if isinstance(message, M.Resume):
            self._urgent.update(dict.fromkeys(targets, message.step))
        elif isinstance(message, M.Stop):
            stops = self._stops
            if led:
                targets = [t for t in targets if stops.get(t, -1) < epoch]
            if len(stops) > 4 * len(self.mine) + 64:  # old incarnations' identities
                stops.clear()
            stops.update(dict.fromkeys(targets, epoch))
        return self._send(message, epoch, targets)

    def _send(self, message: M.Message, epoch: int, targets: list[bytes]) -> int:
        try:
            frames = self.codec.encode(message, epoch, "manager", next(self._seq))
        except ProtocolError as exc:
            self.drops.drop(str(exc), "manager")
            return 0
        for target in targets:
            try:
                send_frames(self.sock, [target, *frames])
            except zmq.ZMQError as exc:
                log.warning("relay to local rank %r failed: %s", target, exc)
        return len(targets)

    def rejoin_all(self, reason: str) -> None:
        """The manager was restarted and asked this agent to register again: ask every local
        rank that has spoken to do the same (their folded heartbeats cannot)."""
        self._send(M.Rejoin(reason), 0, sorted(set(self._latest.values())))

    def close(self) -> None:
        self.sock.close(0)
