"""Heartbeat groups, the agent's side (docs/design.md §1c): one agent beats for about sqrt(nodes).

With ``JobConfig.group_size`` > 1 the agent of each group's first node is its leader: it binds a
:class:`GroupLeader` (a ROUTER on ``POD_IP``, an ephemeral port, the manager's CURVE keys when
the job has a secret, the same signed and bounded frames) and tells the manager where
(``GroupOpen``); the manager tells the group's other agents (``GroupAt``), which then send
their heartbeats there through a :class:`GroupLink` instead of to the manager. Everything else
still goes straight to the manager.

Guarantees:

* the leader authenticates and replay-checks every frame; anything but an agent heartbeat from
  a node of its group, sent under that node's name, is dropped and logged (rate limited);
* every heartbeat taken is answered at once (``GroupAck``, with how long ago the leader last
  heard the manager) and sent on within a quarter of an agent beat, as one
  ``GroupBeats`` batch of every node heard meanwhile (a node heard twice: its latest identity,
  the steps and health of both beats merged);
* a stop-all's STOP for the group's nodes may come to the leader as one ``GroupStop``; it
  passes it on at once to each member named, as one RelayDown signed by itself, and the
  members send their ranks' STOPPED back to it (``RelayAcks``, which it checks as a
  heartbeat: a member's own, of its own node), which it sends the manager at once, as one
  ``GroupStopped`` per epoch of what it read in one wake-up;
* a member beats to the manager directly while its last beat through the leader has gone
  unanswered for half an agent beat, or the leader's last answer said it had not heard the
  manager for two agent beats (a leader cut off from the manager, or one the manager let go);
  it tries the leader again every few beats and goes back to it once answered. The manager
  gives the nodes of a leader that went quiet two agent beats to do so before it judges them
  (:func:`~ms_recover.manager.decide.detect_silence`).
"""

from __future__ import annotations

import itertools
import logging
import math

import zmq

from ms_recover.agent.relay import opened, ready_frames
from ms_recover.config import JobConfig
from ms_recover.errors import ProtocolError
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Codec, DropLog
from ms_recover.protocol.replay import ReplayGuard
from ms_recover.protocol.transport import (
    DealerChannel,
    manager_channel,
    relay_router,
    send_frames,
)

log = logging.getLogger("ms_recover.agent")

#: A member tries an unanswering leader again every this many agent beats.
RETRY_BEATS = 5


def add_stopped(
    batch: M.GroupStopped,
    node: int,
    ident: bytes,
    locals_: list[bytes],
    ranks: list[int],
    steps: list[int],
    digests: list[str],
) -> None:
    """Add the STOPPED of node ``node``'s ranks (their identities at its agent, ranks,
    committed steps, digests), relayed by its agent ``ident``, to a leader's batch."""
    batch.nodes.append(node)
    batch.idents.append(ident)
    batch.counts.append(len(ranks))
    batch.locals.extend(locals_)
    batch.ranks.extend(ranks)
    batch.steps.extend(steps)
    batch.digests.extend(digests)


class GroupLeader:
    """The ROUTER of a heartbeat group's leader, and the batch it owes the manager."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], config: JobConfig) -> None:
        self.config = config
        self.node_rank = config.node_rank
        self.members = config.group_members(self.node_rank)
        self.sock, self.endpoint = relay_router(ctx, config, config.pod_ip)
        self.codec = Codec(config.job_id, config.effective_secret(), config.max_frame_bytes)
        self.replay = ReplayGuard(max_senders=4 * config.group_size + 64)
        self.drops = DropLog(log)
        self.flush_s = config.agent_heartbeat_s / 4
        self._sender = f"agent:{self.node_rank}"
        self._seq = itertools.count()
        # node -> (its identity at the manager, steps, health) heard since the last batch
        self._items: dict[int, tuple[bytes, dict[int, int], dict[int, list[float]]]] = {}
        self._flushed = -math.inf
        self._stopped: list[tuple[int, bytes, M.RelayAcks]] = []  # (node, identity, answers)
        self.taken = 0  # heartbeats taken (for tests and the bench)

    def drain(self, epoch: int, manager_age_s: float) -> None:
        """Take every heartbeat that is ready, answering each."""
        for frames in ready_frames(self.sock):
            self._take(frames, epoch, manager_age_s)

    def _take(self, frames: list[bytes], epoch: int, manager_age_s: float) -> None:
        ident = frames[0]
        env = opened(frames, self.codec, self.drops, "group")
        if env is None:
            return
        msg = env.msg
        if not (
            isinstance(msg, M.AgentHeartbeat)
            or (isinstance(msg, M.RelayAcks) and msg.kind == "stopped")
        ):
            self.drops.drop(f"{msg.KIND.decode()} is not a heartbeat or STOPPED", env.sender)
            return
        node = msg.node_rank
        if node not in self.members or env.sender != f"agent:{node}":
            self.drops.drop(f"node {node} is not in this heartbeat group", env.sender)
            return
        replayed = self.replay.check(env.sender, env.nonce, env.seq)
        if replayed:
            self.drops.drop(replayed, env.sender)
            return
        if isinstance(msg, M.RelayAcks):
            self._stopped.append((node, ident, msg))
            return
        self.taken += 1
        held = self._items.get(msg.node_rank)
        if held is not None and held[0] == ident:
            held[1].update(msg.steps)
            held[2].update(msg.health)
        else:
            self._items[msg.node_rank] = (ident, dict(msg.steps), dict(msg.health))
        ack = M.GroupAck(self.node_rank, min(max(manager_age_s, 0.0), 86400.0))
        send_frames(
            self.sock, [ident, *self.codec.encode(ack, epoch, self._sender, next(self._seq))]
        )

    def stopped(self) -> list[M.GroupStopped]:
        """The members' STOPPED taken since the last call, one batch per epoch."""
        out: dict[int, M.GroupStopped] = {}
        taken, self._stopped = self._stopped, []
        for node, ident, acks in taken:
            batch = out.get(acks.epoch)
            if batch is None:
                batch = out[acks.epoch] = M.GroupStopped(
                    self.node_rank, acks.epoch, [], [], [], [], [], [], []
                )
            n = len(acks.ranks)
            if not len(acks.idents) == len(acks.steps) == len(acks.digests) == n:
                self.drops.drop("stopped columns of different lengths", f"agent:{node}")
                continue
            add_stopped(batch, node, ident, acks.idents, acks.ranks, acks.steps, acks.digests)
        return list(out.values())

    def pass_stop(self, msg: M.GroupStop, epoch: int) -> int:
        """Pass a STOP from the manager on to the members it names, one RelayDown each,
        signed by this agent; how many members it went to."""
        n = len(msg.nodes)
        if not len(msg.idents) == len(msg.targets) == n or not set(msg.nodes) <= set(self.members):
            self.drops.drop("a group stop for nodes outside this group", "manager")
            return 0
        body = M.Stop(msg.reason).to_wire()
        for node, ident, targets in zip(msg.nodes, msg.idents, msg.targets, strict=True):
            down = M.RelayDown(["stop"], [epoch], [targets], [body])
            try:  # on failure the manager sends the STOP again, directly
                frames = self.codec.encode(down, epoch, self._sender, next(self._seq))
                send_frames(self.sock, [ident, *frames])
            except (ProtocolError, zmq.ZMQError) as exc:
                log.warning("stop to the agent of node %d failed: %s", node, exc)
        return n

    def due(self, now: float) -> bool:
        """Whether a batch should go to the manager now."""
        return bool(self._items) and now - self._flushed >= self.flush_s

    def batch(self, now: float) -> M.GroupBeats:
        """Everything heard since the last batch, as one (and forget it)."""
        items, self._items, self._flushed = self._items, {}, now
        nodes = sorted(items)
        return M.GroupBeats(
            self.node_rank,
            nodes,
            [items[n][0] for n in nodes],
            [items[n][1] for n in nodes],
            [items[n][2] for n in nodes],
        )

    def close(self) -> None:
        self.sock.close(0)


class GroupLink:
    """A member agent's channel to its heartbeat group's leader, and whether to beat through
    it (see the module docstring)."""

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        config: JobConfig,
        ident: bytes,
        leader: int,
        endpoint: str,
    ) -> None:
        self.leader, self.endpoint = leader, endpoint
        sender = f"agent:{config.node_rank}"
        self.chan: DealerChannel = manager_channel(ctx, config, sender, ident, endpoint)
        beat = config.agent_heartbeat_s
        self.answer_s, self.stale_s, self.retry_s = beat / 2, 2 * beat, RETRY_BEATS * beat
        self._unanswered: float | None = None  # when the oldest unanswered beat went
        self._manager_age = 0.0  # as the leader's last answer said
        self._tried = -math.inf

    def usable(self, now: float) -> bool:
        """Whether to beat through the leader now."""
        late = self._unanswered is not None and now - self._unanswered >= self.answer_s
        return not late and self._manager_age < self.stale_s

    def send(self, beat: M.AgentHeartbeat, epoch: int, now: float) -> bool:
        """Send ``beat`` through the leader if usable, or as a retry every few beats; whether
        the manager still needs it directly."""
        usable = self.usable(now)
        if usable or now - self._tried >= self.retry_s:
            self.chan.send(beat, epoch)
            self._tried = now
            if self._unanswered is None:
                self._unanswered = now
        return not usable

    def answered(self, ack: M.GroupAck, now: float) -> float:
        """The leader's answer; when the manager was last heard, as the leader says."""
        self._unanswered = None
        self._manager_age = ack.manager_age_s
        return now - ack.manager_age_s

    def close(self) -> None:
        self.chan.close()
