"""The manager's side of heartbeat groups (docs/design.md §1c): one frame per group, not per node.

At scale (``JobConfig.group_size`` > 1: about sqrt(nodes) nodes per group from
``GROUP_FROM_NODES`` nodes on) the agent of each group's first node leads it
(:mod:`ms_recover.agent.group`): the group's other agents beat to it, and it sends the manager
their heartbeats as one :class:`~ms_recover.protocol.messages.GroupBeats` batch every quarter
beat. Everything else (hellos, exits, relayed rank frames, commands) still goes straight
between each agent and the manager.

* **Open.** A leader says where it listens (``GroupOpen``) after every welcome; the manager
  tells each registered member of its group (``GroupAt``), and tells a member that registers
  later in its welcome's wake, while the leader is alive.
* **Beats.** Each item of a batch is handled exactly as that agent's own heartbeat would be
  (:meth:`~ms_recover.manager.agents.AgentSide._agent_beat`: its identity must be the node's
  registered agent's, its ranks' steps folded), except that it is not answered: the manager
  answers the leader, once per batch, and the leader tells its members that it heard the
  manager (``GroupAck``). A batch from anyone but a registered leader, or an item for a node
  outside the leader's group, is dropped and logged. The node is noted as heard through its
  leader (``AgentInfo.via``) until it beats directly again.
* **Stops.** A stop-all's STOP to a node heard through its leader (and the leader heard
  within an agent beat) goes to the leader instead, one ``GroupStop`` per group
  (:meth:`~ms_recover.manager.relay.ManagerRelay.flush`), which passes it on to each member
  as a RelayDown of its own; the members' STOPPED come back the same way, one
  ``GroupStopped`` per leader wake-up, recorded column by column
  (:meth:`~ms_recover.manager.acks.FastAcks.stopped`) after the same checks as a member's
  own RelayAcks. Only a node's first STOP of an epoch takes this path (a STOP is the first
  command of an epoch, so nothing sent directly before it can be overtaken; everything after
  it waits for its STOPPED); a survivor reached that way that has not answered after two
  agent beats is sent the STOP again directly
  (:func:`~ms_recover.manager.progress.stop_again`), and its agent passes a rank at most one
  STOP of an epoch from the leader.
* **A leader lost.** Its members notice that their beats go unanswered and beat to the manager
  directly (:class:`~ms_recover.agent.group.GroupLink`); once the manager declares the
  leader lost (or tells it to leave) it also tells them to stop trying it (``GroupAt`` with
  no endpoint) until a new incarnation opens the group again. Meanwhile a node heard through a
  leader that went quiet is not judged silent until two agent beats after the leader's own last
  frame (:func:`~ms_recover.manager.decide.detect_silence`), so one lost leader never takes its
  whole group with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import zmq

from ms_recover.config import JobConfig
from ms_recover.manager.acks import FastAcks
from ms_recover.manager.cadence import Cadence, SharedBeat
from ms_recover.manager.model import JobModel
from ms_recover.manager.relay import ManagerRelay
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import DropLog, Envelope


class GroupSide:
    """The handlers of group leaders' frames (see the module docstring). The attributes are
    the server's (:class:`~ms_recover.manager.server.ManagerServer` sets them)."""

    config: JobConfig
    model: JobModel
    clock: Callable[[], float]
    drops: DropLog
    frames_out: int
    _agent_ids: dict[int, bytes]
    _beat: SharedBeat
    _sock: zmq.Socket[bytes]
    _group_at: dict[int, str]  # leader node -> where it takes its group's heartbeats
    _agent_ok: Callable[[bytes, int], bool]
    _agent_beat: Callable[..., None]
    _acks: FastAcks
    cadence: Cadence
    relay: ManagerRelay
    send: Callable[[Sequence[bytes], M.Message], None]

    def _on_group_open(self, ident: bytes, env: Envelope, msg: M.GroupOpen) -> None:
        if not self._agent_ok(ident, msg.node_rank):
            return
        if not self.config.group_members(msg.node_rank):
            self.drops.drop(f"node {msg.node_rank} leads no heartbeat group", env.sender)
            return
        self._group_at[msg.node_rank] = msg.endpoint
        members = self._members(msg.node_rank)
        if members:
            self.send(members, M.GroupAt(msg.node_rank, msg.endpoint))

    def _group_welcome(self, ident: bytes, node: int) -> None:
        """A member agent was just welcomed: where its group's leader listens, if it is alive."""
        leader = self.config.group_leader(node)
        if node not in self.config.group_members(leader):
            return
        at = self._group_at.get(leader)
        if at and self.model.agents[leader].alive:
            self.send([ident], M.GroupAt(leader, at))

    def settle_groups(self) -> None:
        """A leader declared lost or told to leave: its members beat to the manager from now
        on (``GroupAt`` with no endpoint), until a new incarnation of it opens again."""
        for leader in [n for n in self._group_at if not self.model.agents[n].alive]:
            del self._group_at[leader]
            members = self._members(leader)
            if members:
                self.send(members, M.GroupAt(leader, ""))

    def _members(self, leader: int) -> list[bytes]:
        """The identities of the live registered agents of ``leader``'s group but itself."""
        agents = self.model.agents
        return [
            self._agent_ids[n]
            for n in self.config.group_members(leader)
            if agents[n].alive and n in self._agent_ids
        ]

    def _leading(self, ident: bytes, env: Envelope, leader: int) -> range | None:
        """The members of ``leader``'s group if ``ident`` is its registered agent and it
        leads one, else None (dropped and logged)."""
        if not self._agent_ok(ident, leader):
            return None
        members = self.config.group_members(leader)
        if not members:
            self.drops.drop(f"node {leader} leads no heartbeat group", env.sender)
            return None
        return members

    def _on_group_beats(self, ident: bytes, env: Envelope, msg: M.GroupBeats) -> None:
        leader = msg.node_rank
        members = self._leading(ident, env, leader)
        if members is None:
            return
        n = len(msg.nodes)
        if not len(msg.idents) == len(msg.steps) == len(msg.health) == n:
            self.drops.drop("group_beats columns of different lengths", env.sender)
            return
        agents, now = self.model.agents, self.clock()
        agents[leader].last_seen = now  # the batch says the leader is alive too
        for node, member, steps, health in zip(
            msg.nodes, msg.idents, msg.steps, msg.health, strict=True
        ):
            if node not in members:
                self.drops.drop(f"node {node} is not in node {leader}'s group", env.sender)
                continue
            self._agent_beat(member, node, steps, health, leader, now)
        self.frames_out += self._beat.send(self._sock, ident, force=True)

    def _routes(self) -> dict[bytes, tuple[int, int, bytes]]:
        """Agent identity -> (its node, its group's leader, the leader's identity), for each
        live node whose last heartbeat came through a leader that is alive, has its group open
        and was heard within an agent beat: where a STOP goes through the leader."""
        agents, ids, now = self.model.agents, self._agent_ids, self.clock()
        beat = self.config.agent_heartbeat_s
        leaders = {
            leader: ids[leader]
            for leader in self._group_at
            if leader in ids and agents[leader].alive and now - agents[leader].last_seen < beat
        }
        if not leaders:
            return {}
        return {
            ident: (node, agent.via, leaders[agent.via])
            for node, ident in ids.items()
            if (agent := agents[node]).via in leaders and agent.alive
        }

    def _on_group_stopped(self, ident: bytes, env: Envelope, msg: M.GroupStopped) -> None:
        leader = msg.node_rank
        members = self._leading(ident, env, leader)
        if members is None:
            return
        n, total = len(msg.nodes), len(msg.ranks)
        if not (
            len(msg.idents) == len(msg.counts) == n
            and len(msg.locals) == len(msg.steps) == len(msg.digests) == total == sum(msg.counts)
        ):
            self.drops.drop("group_stopped columns of different lengths", env.sender)
            return
        model = self.model
        agents, ids, now = model.agents, self._agent_ids, self.clock()
        agents[leader].last_seen = now
        if msg.epoch != model.epoch:
            self.drops.drop(f"{total} STOPPED of epoch {msg.epoch} (now {model.epoch})", env.sender)
            return
        per, start, done = self.config.proc_per_node, 0, 0
        for node, member, count in zip(msg.nodes, msg.idents, msg.counts, strict=True):
            end = start + count
            agent = agents.get(node)
            if node in members and agent is not None and agent.alive and ids.get(node) == member:
                agent.last_seen = now
                mine = range(node * per, (node + 1) * per)
                done += self._acks.stopped(
                    self.relay.prefix(member), mine, msg.epoch, msg, start, end
                )
            start = end
        if done < total:
            self.drops.drop(f"{total - done} of {total} STOPPED not recorded", env.sender)
        self.relay.items_in += done
        self.relay.group_stopped += done
        self.cadence.heard(M.Stopped, msg.epoch, done)
