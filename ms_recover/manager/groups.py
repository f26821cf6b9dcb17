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
from ms_recover.manager.cadence import SharedBeat
from ms_recover.manager.model import JobModel
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

    def _on_group_beats(self, ident: bytes, env: Envelope, msg: M.GroupBeats) -> None:
        leader = msg.node_rank
        if not self._agent_ok(ident, leader):
            return
        members = self.config.group_members(leader)
        if not members:
            self.drops.drop(f"node {leader} leads no heartbeat group", env.sender)
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
            self._agent_beat(member, node, steps, health, leader)
        self.frames_out += self._beat.send(self._sock, ident, force=True)
