"""The manager's side of the node relay (docs/design.md §1c): one frame per node, both ways.

Ranks launched by ``ms-recover agent`` reach the manager through their node's agent
(:mod:`ms_recover.agent.relay`). This module keeps the manager's handlers, epochs, replay rules
and job model exactly as they are for a directly connected rank:

* **Up.** A :class:`~ms_recover.protocol.messages.RelayUp` batch from a registered agent is
  unwrapped item by item; each item is checked again (:func:`~ms_recover.protocol.relay.check_item`)
  and handled by the server's ordinary path (replay check, handler) under the rank's **virtual
  identity**, which names the agent and the rank's identity at the agent. A bad item is dropped
  and logged; the others are still handled. A claimant agent (a new pod incarnation whose slot
  is not yet decided) may only relay registrations, which the slot rule then holds. A
  :class:`~ms_recover.protocol.messages.RelayAcks` batch (one answer kind, column by column)
  is recorded in one pass where each item's outcome is known
  (:meth:`~ms_recover.manager.acks.FastAcks.columns`); its other items take the same
  per-item path as a RelayUp's.
* **Heartbeats.** The ranks' heartbeats arrive folded into their agent's heartbeat
  (``AgentHeartbeat.steps``): :meth:`ManagerRelay.fold` records them for ranks registered
  through that very agent, as the rank's own heartbeat would.
* **Down.** :meth:`ManagerRelay.take` queues what the server sends to virtual identities;
  :meth:`ManagerRelay.flush` (after each batch of frames and each decide) sends every node's
  queue as one :class:`~ms_recover.protocol.messages.RelayDown` frame, in order, a broadcast as
  one item with its targets, a per-rank payload as its own item. Each distinct message body is
  packed once per flush, whatever the number of nodes it goes to. A node heard through its
  heartbeat group's leader gets its first STOP of an epoch through that leader: one
  ``GroupStop`` per group (``router``, :mod:`~ms_recover.manager.groups`).

Processes with no relaying agent (msrun's ranks under the TaskD shim, a standalone worker, the
status client) keep their direct DEALER connection; both kinds of member mix in one job.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container, Sequence
from typing import Any

import msgpack
import zmq

from ms_recover.errors import ProtocolError
from ms_recover.manager.health import note
from ms_recover.manager.model import JobModel
from ms_recover.manager.slots import Slots
from ms_recover.observability.schema import JobState
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Codec, DropLog, Envelope
from ms_recover.protocol.relay import (
    PREFIX,
    UNEQUAL,
    RawItem,
    ack_columns,
    ack_item,
    check_item,
    rank_of,
    raw_items,
    split_identity,
    virtual_identity,
)
from ms_recover.protocol.transport import SLACK, send_frames

log = logging.getLogger("ms_recover.manager")

Handle = Callable[[bytes, Envelope], None]
Fast = Callable[[bytes, Container[int], RawItem], bool]
#: Agent identity -> (its node, its group's leader, the leader's identity), for the nodes whose
#: STOP goes through their leader (:meth:`GroupSide._routes
#: <ms_recover.manager.groups.GroupSide._routes>`).
Router = Callable[[], dict[bytes, tuple[int, int, bytes]]]
Columns = Callable[[bytes, Container[int], M.RelayAcks], list[int]]
_Item = list[Any]  # [message, epoch, [local identities]]


class ManagerRelay:
    """Unwraps relayed batches into per-rank dispatch and batches per-node sends."""

    def __init__(
        self,
        model: JobModel,
        slots: Slots,
        codec: Codec,
        sock: zmq.Socket[bytes],
        next_seq: Callable[[], int],
        clock: Callable[[], float],
    ) -> None:
        self.model = model
        self.slots = slots
        self.codec = codec
        self._sock = sock
        self._next_seq = next_seq
        self._clock = clock
        self.drops = DropLog(log)
        self._out: dict[bytes, list[_Item]] = {}  # agent identity -> queued items, in order
        # Virtual identity -> (agent, local), parsed once: a stop-all addresses every rank.
        self._parts: dict[bytes, tuple[bytes, bytes] | None] = {}
        self._prefixes: dict[bytes, bytes] = {}  # agent identity -> its ranks' virtual prefix
        self._pack = msgpack.Packer(use_bin_type=True)
        self.router: Router | None = None  # set by a job with heartbeat groups
        self.items_in = 0  # relayed rank messages handled (plus folded heartbeats)
        self.items_out = 0  # rank deliveries sent inside RelayDown frames
        self.frames_out = 0
        self.group_stops = 0  # GroupStop frames sent to heartbeat groups' leaders
        self.group_stopped = 0  # STOPPED recorded from the leaders' GroupStopped batches

    # ------------------------------------------------------------------ up
    def on_relay_up(
        self,
        ident: bytes,
        msg: M.RelayUp,
        agent_ok: Callable[[], bool],
        handle: Handle,
        fast: Fast | None = None,
    ) -> None:
        """Handle each item of a batch from the agent ``ident`` as its rank's own frame.

        ``agent_ok`` is the server's check that ``ident`` is the registered agent of the
        node (it asks an unknown one to register again); ``handle`` the server's per-frame
        path (replay check, handler); ``fast`` may take an item whose outcome on that path
        is known (:class:`~ms_recover.manager.acks.FastAcks`), in the same order."""
        node = msg.node_rank
        claimant = self.slots.claimant(node, ident) is not None
        if not claimant and not self._heard_from(node, agent_ok):
            return
        raw = raw_items(msg)
        if raw is None:
            self.drops.drop(UNEQUAL, f"agent of node {node}")
            return
        mine = self._mine(node)
        prefix = self.prefix(ident)
        for one in raw:
            if fast is not None and not claimant and fast(prefix, mine, one):
                self.items_in += 1
                continue
            self._general(ident, node, mine, claimant, one, handle)

    def on_relay_acks(
        self,
        ident: bytes,
        msg: M.RelayAcks,
        agent_ok: Callable[[], bool],
        handle: Handle,
        columns: Columns,
    ) -> None:
        """Handle a RelayAcks batch from the agent ``ident``: ``columns`` records the items
        whose outcome is known (:meth:`FastAcks.columns
        <ms_recover.manager.acks.FastAcks.columns>`), the others take :meth:`on_relay_up`'s
        general path, each as its own RelayUp item would."""
        node = msg.node_rank
        if self.slots.claimant(node, ident) is not None:  # may only relay registrations
            self.drops.drop("answers relayed by an agent whose slot is undecided", f"node {node}")
            return
        if not self._heard_from(node, agent_ok):
            return
        bad = ack_columns(msg)
        if bad is not None:
            self.drops.drop(bad, f"agent of node {node}")
            return
        mine = self._mine(node)
        left = columns(self.prefix(ident), mine, msg)
        self.items_in += len(msg.ranks) - len(left)
        for i in left:
            self._general(ident, node, mine, False, ack_item(msg, i), handle)

    def _heard_from(self, node: int, agent_ok: Callable[[], bool]) -> bool:
        if not agent_ok():
            return False
        self.model.agents[node].last_seen = self._clock()
        return True

    def prefix(self, ident: bytes) -> bytes:
        """The first bytes of the virtual identities of agent ``ident``'s ranks."""
        prefix = self._prefixes.get(ident)
        if prefix is None:
            if len(self._prefixes) > 2 * len(self.model.agents) + 64:  # old incarnations' names
                self._prefixes.clear()
            prefix = self._prefixes[ident] = PREFIX + bytes([len(ident)]) + ident
        return prefix

    def _mine(self, node: int) -> Container[int]:
        """The ranks of ``node`` (a range: a node's ranks are consecutive), none for a node
        outside the job."""
        per = self.model.config.proc_per_node
        return range(node * per, (node + 1) * per) if node in self.model.agents else range(0)

    def _general(
        self,
        ident: bytes,
        node: int,
        mine: Container[int],
        claimant: bool,
        one: RawItem,
        handle: Handle,
    ) -> None:
        """One relayed item as its rank's own frame: checked, then ``handle``d or dropped."""
        local, item = one[0], check_item(self.codec.job_id, one)
        if isinstance(item, str):
            self.drops.drop(item, f"agent of node {node}")
        elif rank_of(item.msg) not in mine:
            self.drops.drop(f"rank {rank_of(item.msg)} relayed by node {node}", item.sender)
        elif claimant and not isinstance(item.msg, M.WorkerHello):
            self.drops.drop("relayed by an agent whose slot is undecided", item.sender)
        else:
            self.items_in += 1
            handle(virtual_identity(ident, local), item)

    def fold(
        self,
        ident: bytes,
        steps: dict[int, int],
        now: float | None = None,
        health: dict[int, list[float]] | None = None,
    ) -> None:
        """The heartbeats of ranks registered through agent ``ident``, folded into its own:
        the rank was heard, and its committed step only grows. Entries for other ranks (a
        rank not, or no longer, registered through this agent) are ignored: it registers
        again when asked (the agent passes a ``Rejoin`` on to its ranks). Their step timing
        (``health``) is recorded while the job runs only: no rule reads it during a recovery,
        when its cost would delay the recovery (a stop-all hears every node's beats)."""
        if not steps:
            return
        if health and self.model.state is not JobState.RUNNING:
            health = None  # only a running job's timing is judged: not read during a recovery
        now = self._clock() if now is None else now
        get, heard = self.model.ranks.get, 0
        prefix = self.prefix(ident)
        for rank, step in steps.items():
            info = get(rank)
            if info is not None and info.alive and info.identity.startswith(prefix):
                heard += 1
                info.last_seen = now
                if step > info.committed_step:
                    info.committed_step = step
                    info.last_progress = now
                if health and rank in health:
                    note(self.model, rank, step, health[rank], now)
        self.items_in += heard

    # ------------------------------------------------------------------ down
    def take(self, identities: Sequence[bytes], msg: M.Message, epoch: int) -> list[bytes]:
        """Queue ``msg`` for every virtual identity; returns the direct ones (sent as before).
        Consecutive sends of one message, or of equal ones (a repair plan with nothing to copy
        sends every rank the same REPAIR), to one node share an item."""
        direct: list[bytes] = []
        cache = self._parts
        if len(cache) > 4 * len(self.model.ranks) + 1024:  # old incarnations' names pile up
            cache.clear()
        out = self._out
        agent_now: bytes | None = None  # the agent of the run of identities being read
        locals_now: list[bytes] = []  # and the target list they join
        for identity in identities:
            try:
                parts = cache[identity]
            except KeyError:
                parts = cache[identity] = split_identity(identity)
            if parts is None:
                direct.append(identity)
                continue
            agent, local = parts
            if agent == agent_now:  # a broadcast: a node's ranks come in a row
                locals_now.append(local)
                continue
            queue = out.setdefault(agent, [])
            last = queue[-1] if queue else None
            if last is not None and last[1] == epoch and (last[0] is msg or last[0] == msg):
                locals_now = last[2]
            else:
                locals_now = []
                queue.append([msg, epoch, locals_now])
            locals_now.append(local)
            agent_now = agent
        return direct

    def flush(self) -> None:
        """Send every node's queue as RelayDown frames (one per node unless it would exceed
        the frame limit), each distinct body packed once."""
        if not self._out:
            return
        out, self._out = self._out, {}
        for leader, epoch, group in self._by_leader(out):
            self._send_group(leader, epoch, group)
        packed: dict[int, bytes] = {}  # id(message) -> its packed body, for this flush
        limit = self.codec.max_bytes - SLACK
        for agent, items in out.items():
            batch: list[tuple[_Item, bytes]] = []
            size = 0
            for item in items:
                body = packed.get(id(item[0]))
                if body is None:
                    body = packed[id(item[0])] = msgpack.packb(item[0].to_wire(), use_bin_type=True)
                if batch and size + len(body) > limit:
                    self._send(agent, batch)
                    batch, size = [], 0
                batch.append((item, body))
                size += len(body) + 16 * len(item[2])
            self._send(agent, batch)

    def _by_leader(self, out: dict[bytes, list[_Item]]) -> list[tuple[bytes, int, M.GroupStop]]:
        """Take out of ``out`` each node whose whole queue is its first STOP of an epoch and
        whose STOP goes through its group's leader (``router``), noting it in
        ``JobModel.led_stops``; those as (leader's identity, epoch, GroupStop), one per leader,
        epoch and STOP."""
        stop = M.Stop
        stops = [
            agent for agent, items in out.items() if len(items) == 1 and type(items[0][0]) is stop
        ]
        routes = self.router() if stops and self.router is not None else {}
        led = self.model.led_stops
        groups: dict[tuple[bytes, int, str], M.GroupStop] = {}
        for agent in stops:
            route = routes.get(agent)
            epoch = out[agent][0][1]
            if route is None or led.get(route[0], -1) >= epoch:  # the second: directly
                continue
            node, leader, leader_ident = route
            [(msg, _, targets)] = out.pop(agent)
            led[node] = epoch
            key = (leader_ident, epoch, msg.reason)
            group = groups.get(key)
            if group is None:
                group = groups[key] = M.GroupStop(leader, msg.reason, [], [], [])
            group.nodes.append(node)
            group.idents.append(agent)
            group.targets.append(targets)
        return [(ident, epoch, group) for (ident, epoch, _), group in groups.items()]

    def _send_group(self, leader: bytes, epoch: int, msg: M.GroupStop) -> None:
        try:
            frames = self.codec.encode(msg, epoch, "manager", self._next_seq())
        except ProtocolError as exc:  # beyond the frame limit: not at any group size in use
            log.warning("group stop to %r not sent: %s", leader, exc)
            return
        self.frames_out += 1
        self.group_stops += 1
        self.items_out += sum(map(len, msg.targets))
        try:
            send_frames(self._sock, [leader, *frames])
        except zmq.ZMQError as exc:
            log.warning("group stop to %r failed: %s", leader, exc)

    def _send(self, agent: bytes, batch: list[tuple[_Item, bytes]]) -> None:
        pack = self._pack  # autoreset: each call returns its own bytes
        items = [item for item, _ in batch]
        body = b"".join(
            (
                pack.pack_map_header(4),
                pack.pack("kinds"),
                pack.pack([item[0].KIND.decode() for item in items]),
                pack.pack("epochs"),
                pack.pack([item[1] for item in items]),
                pack.pack("targets"),
                pack.pack([item[2] for item in items]),
                pack.pack("bodies"),
                pack.pack_array_header(len(batch)),
                *(b for _, b in batch),
            )
        )
        epoch = max(item[1] for item in items)
        frames = self.codec.encode_packed(
            M.RelayDown.KIND, body, epoch, "manager", self._next_seq()
        )
        self.frames_out += 1
        self.items_out += sum(len(item[2]) for item in items)
        try:
            send_frames(self._sock, [agent, *frames])
        except zmq.ZMQError as exc:
            log.warning("relay to agent %r failed: %s", agent, exc)
