"""The manager's agent-facing handlers: node agents' hellos, heartbeats and reports, spare nodes'
hellos, and the checks that a frame comes from a node's registered agent.

A part of :class:`~ms_recover.manager.server.ManagerServer` (which inherits it), kept apart by
concept: the server owns the socket, the loop and the composition; these handlers only record
facts in the model (docs/design.md §2), as the workers' handlers do
(:mod:`~ms_recover.manager.workers`).
"""

from __future__ import annotations

import functools
import logging
import threading
import typing
from collections.abc import Callable

import zmq

from ms_recover import exitcodes
from ms_recover.config import JobConfig
from ms_recover.manager.acks import FastAcks
from ms_recover.manager.cadence import Cadence, SharedBeat
from ms_recover.manager.leaving import note_leaving
from ms_recover.manager.model import Fault, JobModel, Origin, RankInfo, SpareNode
from ms_recover.manager.relay import ManagerRelay
from ms_recover.manager.slots import Hello, Slots
from ms_recover.manager.workers import WorkerHandlers
from ms_recover.observability.events import EventLog
from ms_recover.observability.schema import (
    FaultKind,
    JobState,
    MemberRecord,
    PlannedStopRecord,
    RankExitRecord,
    RejectRecord,
    SpareRecord,
)
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Codec, DropLog, Envelope
from ms_recover.protocol.replay import ReplayGuard

log = logging.getLogger("ms_recover.manager")

_BEAT = M.AgentHeartbeat.KIND


class AgentSide:
    """The handlers of what node agents send (see the module docstring). The attributes are
    the server's (:class:`~ms_recover.manager.server.ManagerServer` sets them)."""

    config: JobConfig
    model: JobModel
    clock: Callable[[], float]
    slots: Slots
    events: EventLog
    drops: DropLog
    errors: DropLog
    codec: Codec
    replay: ReplayGuard
    cadence: Cadence
    relay: ManagerRelay
    workers: WorkerHandlers
    standby: bool
    standbys: int  # how many standby managers the job has
    frames_out: int
    _agent_ids: dict[int, bytes]
    _acks: FastAcks
    _beat: SharedBeat
    _sock: zmq.Socket[bytes]
    _lock: threading.Lock
    _send: Callable[[bytes, M.Message], None]
    _handle: Callable[[bytes, Envelope], None]
    _group_welcome: Callable[[bytes, int], None]
    sigterm: Callable[[str], None]

    def _on_agent_hello(self, ident: bytes, env: Envelope, msg: M.AgentHello) -> None:
        m, now = self.model, self.clock()
        if not 0 <= msg.node_rank < self.config.node_nums:
            reason = f"node_rank {msg.node_rank} is outside 0..{self.config.node_nums - 1}"
            self._send(ident, M.AgentWelcome(False, reason))
            log.warning("rejected agent: %s", reason)
            return
        agent = m.agents[msg.node_rank]
        if self._taken_by_spare(ident, env, msg):
            return
        verdict = self.slots.agent_hello(
            msg.node_rank, (ident, env), agent.alive, now - agent.last_seen
        )
        if verdict is Hello.HOLD:
            # Heard and held, not welcomed: a beat tells the agent that this manager is the
            # active one, so it waits here instead of moving on to a standby.
            self._send(ident, M.ManagerBeat(m.state.value))
        if verdict is Hello.HOLD and msg.node_rank in m.switching:
            log.info(
                "node %d: its new pod's agent (pid %d) waits for the hot switch",
                msg.node_rank,
                msg.pid,
            )
            return
        if verdict is Hello.HOLD:
            self.drops.drop(
                f"hello of a new agent incarnation for node {msg.node_rank} while its agent "
                f"(pid {agent.pid}) was heard {now - agent.last_seen:.1f}s ago: held until "
                "that one is gone",
                env.sender,
            )
            return
        if verdict is Hello.TAKEOVER:
            # The pod was recreated before its loss was noticed: its old ranks are gone.
            m.pending.append(
                Fault(
                    FaultKind.NODE_RESTARTED,
                    msg.node_rank,
                    -1,
                    f"agent of node {msg.node_rank} restarted (pid {agent.pid} -> {msg.pid})",
                    now,
                    now - agent.last_seen,
                )
            )
            for rank in self.config.ranks_of(msg.node_rank):
                m.ranks[rank].alive, m.ranks[rank].identity = False, b""
        agent.registered = agent.alive = True
        agent.released = False
        m.leaving.pop(msg.node_rank, None)  # a new pod, or one that says so again (Rejoin)
        agent.pid, agent.pod_ip, agent.is_scheduler = msg.pid, msg.pod_ip, msg.is_scheduler
        agent.last_seen = now
        self._agent_ids[msg.node_rank] = ident
        self.slots.agent_registered(msg.node_rank, env.nonce)  # its held ranks: after decide
        rejoin = self.workers.rejoin_asked.pop(ident, None) is not None or env.epoch > 0
        if rejoin:
            self.workers.note_rejoin(env.epoch, None)
        self._send(ident, M.AgentWelcome(True, ""))
        self._group_welcome(ident, msg.node_rank)
        member = MemberRecord("agent", msg.pid, rejoin, node_rank=msg.node_rank, pod_ip=msg.pod_ip)
        self.events.write(member, epoch=m.epoch)

    def _taken_by_spare(self, ident: bytes, env: Envelope, msg: M.AgentHello) -> bool:
        """A new agent incarnation for a node a spare node took meanwhile (its recreated pod
        came back late): it is told to become a spare (docs/design.md §1f)."""
        node, agent = msg.node_rank, self.model.agents[msg.node_rank]
        held = self.slots.agent_nonce.get(node)
        if node not in self.model.promoted or not agent.alive or held in (None, env.nonce):
            return False
        reason = f"node {node} was taken by a spare node (agent pid {agent.pid}): stay a spare"
        log.info("agent pid %d of node %d: %s", msg.pid, node, reason)
        self._send(ident, M.BecomeSpare(reason))
        return True

    def _on_spare_hello(self, ident: bytes, env: Envelope, msg: M.SpareHello) -> None:
        """Record a spare node's agent (or its beat), and answer it; after the job's end it
        is sent away instead (the executor releases those it knew of)."""
        m, now = self.model, self.clock()
        if m.state is JobState.EXITING:
            code = m.exit_code if m.exit_code is not None else exitcodes.FAILED
            self._send(ident, M.AgentExit(code, "the job already ended"))
            return
        spare = m.spares.get(ident)
        if spare is None:
            spare = SpareNode(ident, msg.pid, msg.pod_ip, now, now, msg.warm)
            m.spares[ident] = spare
            log.info("spare node: agent pid %d on %s, %d warm", msg.pid, msg.pod_ip, msg.warm)
            record = SpareRecord(msg.pid, msg.pod_ip, False, "registered")
            self.events.write(record, epoch=m.epoch)
        spare.last_seen, spare.warm = now, msg.warm
        self._send(ident, M.ManagerBeat(m.state.value))

    def settle_claims(self) -> None:
        """A held claim on a node whose agent is now gone (a hot switch's old pod told to leave)
        is registered at once, its ranks' held hellos with it, instead of at the claimant's
        next heartbeat (up to ``agent_heartbeat_s`` later: most of a swap's pause)."""
        for node, (ident, env) in list(self.slots.claims.items()):
            if not self.model.agents[node].alive:
                self._on_agent_hello(ident, env, typing.cast(M.AgentHello, env.msg))

    def _refuse_claims(self, node_rank: int) -> None:
        """The registered agent of ``node_rank`` spoke: a pending claim on its slot is false."""
        refused = self.slots.refuse(node_rank)
        if not refused:
            return
        reason = f"node {node_rank} has a live agent (pid {self.model.agents[node_rank].pid})"
        log.warning("refused a new agent incarnation for node %d: %s", node_rank, reason)
        self.events.write(RejectRecord(reason, node_rank=node_rank), epoch=self.model.epoch)
        self._send(refused[0], M.AgentWelcome(False, reason))
        for ident in refused[1:]:
            self._send(ident, M.Welcome(False, reason, False, self.config.world_size, []))

    def _agent_ok(self, ident: bytes, node_rank: int) -> bool:
        agent = self.model.agents.get(node_rank)
        if agent is not None and agent.alive and self._agent_ids.get(node_rank) == ident:
            return True  # the registered agent (the common case, checked first)
        if agent is not None and not agent.alive and self._agent_ids.get(node_rank) == ident:
            log.debug("ignoring agent of node %d: it was told to exit or declared lost", node_rank)
            return False
        if agent is not None and node_rank not in self._agent_ids:
            self.workers.ask_to_rejoin(ident, f"agent of node {node_rank}")
            return False
        if agent is None or not agent.alive or self._agent_ids.get(node_rank) != ident:
            self.drops.drop(f"message from unregistered agent of node {node_rank}", repr(ident))
            return False
        return True

    def _relay_ok(self, ident: bytes, node_rank: int) -> bool:
        """``_agent_ok``, and after a normal end also the agent released then: it is draining,
        and its ranks (a pod that came back late) must still hear that the job is over."""
        agent = self.model.agents.get(node_rank)
        if (
            self.model.state is JobState.FINISHED
            and agent is not None
            and agent.released
            and self._agent_ids.get(node_rank) == ident
        ):
            return True
        return self._agent_ok(ident, node_rank)

    def _on_agent_heartbeat(self, ident: bytes, env: Envelope, msg: M.AgentHeartbeat) -> None:
        self._agent_beat(ident, msg.node_rank, msg.steps, msg.health)

    def _quick_beat(self, ident: bytes, frame: bytes) -> bool:
        """An agent heartbeat handled without the envelope and message objects (the
        manager's commonest frame: one per node every ``agent_heartbeat_s``), exactly as
        :meth:`dispatch` would; False if ``frame`` is anything else or fails a check, for
        :meth:`dispatch` to handle or drop with its reason."""
        got = self.codec.quick(frame, _BEAT)
        if got is None:
            return False
        epoch, sender, seq, nonce, body = got
        if self.standby:
            return True  # a standby serves nobody (docs/manager-takeover.md)
        with self._lock:
            replayed = self.replay.check(sender, nonce, seq)
            if replayed:
                self.drops.drop(replayed, sender)
                return True
            self.cadence.heard(M.AgentHeartbeat, epoch)
            try:
                self._agent_beat(ident, body["node_rank"], body["steps"], body["health"])
            except Exception as exc:  # as _handle: drop, go on
                self.errors.drop(f"handler for agent_hb failed: {type(exc).__name__}", sender, exc)
        return True

    def _agent_beat(
        self,
        ident: bytes,
        node_rank: int,
        steps: dict[int, int],
        health: dict[int, list[float]] | None = None,
        via: int = -1,
        now: float | None = None,
    ) -> None:
        """An agent's heartbeat: directly (answered when due), or through the leader of its
        heartbeat group ``via`` (not answered: :mod:`~ms_recover.manager.groups`), heard at
        ``now`` (the clock's if None; a leader's batch reads it once)."""
        claims = self.slots.claims  # almost always empty: no slot-claim checks then
        claim = self.slots.claimant(node_rank, ident) if claims else None
        if claim is not None:  # the claimant: is the old one gone now?
            self._on_agent_hello(ident, claim[1], typing.cast(M.AgentHello, claim[1].msg))
            return
        if not self._agent_ok(ident, node_rank):
            return
        if claims and node_rank not in self.model.switching:  # a hot switch's new pod waits
            self._refuse_claims(node_rank)
        agent = self.model.agents[node_rank]
        now = agent.last_seen = self.clock() if now is None else now
        agent.via = via
        if steps:  # most beats carry none (rank_report_s): 12,000 a second at 65,536 ranks
            self.relay.fold(ident, steps, now, health)
        if via < 0:
            self.frames_out += self._beat.send(self._sock, ident)

    def _on_relay_up(self, ident: bytes, env: Envelope, msg: M.RelayUp) -> None:
        self.relay.on_relay_up(
            ident, msg, lambda: self._relay_ok(ident, msg.node_rank), self._handle, self._acks.take
        )

    def _on_relay_acks(self, ident: bytes, env: Envelope, msg: M.RelayAcks) -> None:
        ok = functools.partial(self._relay_ok, ident, msg.node_rank)
        self.relay.on_relay_acks(ident, msg, ok, self._handle, self._acks.columns)

    def _on_rank_exited(self, ident: bytes, env: Envelope, msg: M.RankExited) -> None:
        m, now = self.model, self.clock()
        if m.state is JobState.FINISHED and msg.rank in m.ranks:
            self._final_exit(ident, msg)
            return
        if not self._agent_ok(ident, msg.node_rank) or msg.rank not in m.ranks:
            return
        m.agents[msg.node_rank].last_seen = now
        info = m.ranks[msg.rank]
        how = f"signal {msg.signal}" if msg.signal else f"exit code {msg.exit_code}"
        # Expected: the exit of a process already declared lost, or one the manager had killed
        # (requested; perhaps a replacement that never registered). A process that never
        # registered (another pid) and died on its own crashed before joining: a fault too.
        expected = msg.requested or (not info.alive and msg.pid == info.pid)
        if msg.requested and msg.pid == info.pid:
            info.alive, info.identity = False, b""  # it registered just before the kill
        exited = RankExitRecord(
            msg.rank, msg.pid, msg.exit_code, msg.signal, expected, requested=msg.requested
        )
        self.events.write(exited, epoch=m.epoch)
        if msg.pid == info.pid:
            info.exit_code = msg.exit_code
        if msg.exit_code == 0 and msg.signal == 0 and not expected:
            self._left(info, now, max(0.0, now - msg.observed_at))
        elif not expected:
            if not info.alive:  # a repeated report of this exit (after a rejoin) is expected
                info.pid = msg.pid
            m.pending.append(
                Fault(
                    FaultKind.RANK_EXIT,
                    msg.node_rank,
                    msg.rank,
                    f"rank {msg.rank} died ({how})" + (f" on {msg.host}" if msg.host else ""),
                    now,
                    max(0.0, now - msg.observed_at),
                    origin=Origin(msg.host, msg.pid, msg.exit_code, msg.signal, msg.log_tail),
                )
            )

    def _on_rank_frozen(self, ident: bytes, env: Envelope, msg: M.RankFrozen) -> None:
        """A rank's agent saw its process stopped by a signal for ``frozen_s``: a hang whose
        culprit is known, declared now (docs/design.md §1e). Only for the registered process
        of a live member: a stopped process the job no longer counts on is nobody's hang."""
        m, now = self.model, self.clock()
        if m.state is JobState.FINISHED or not self._agent_ok(ident, msg.node_rank):
            return
        m.agents[msg.node_rank].last_seen = now
        info = m.ranks.get(msg.rank)
        if info is None or not info.alive or info.done or info.pid != msg.pid:
            return
        where = f" on {msg.host}" if msg.host else ""
        why = (
            f"rank {msg.rank} (pid {msg.pid}{where}) stopped by a signal (process state T) "
            f"for {msg.stopped_s:.1f}s, seen by its agent; it was at step {info.committed_step}"
        )
        m.pending.append(Fault(FaultKind.HANG, msg.node_rank, msg.rank, why, now, msg.stopped_s))

    def _on_node_leaving(self, ident: bytes, env: Envelope, msg: M.NodeLeaving) -> None:
        """A node's agent got SIGTERM (a planned stop): record it and write the
        ``planned_stop`` event now; ``decide`` acts on it (:mod:`~ms_recover.manager.leaving`)."""
        m, now, node = self.model, self.clock(), msg.node_rank
        if m.state is JobState.FINISHED or not self._agent_ok(ident, node):
            return
        m.agents[node].last_seen = now
        leaving = note_leaving(m, node, msg.reason, msg.deadline_s, now)
        if leaving is None:  # said once already
            return
        log.warning("planned stop: node %d is leaving (%s)", node, msg.reason)
        stop = PlannedStopRecord(
            node, msg.reason, round(leaving.deadline, 3), round(msg.deadline_s, 3)
        )
        self.events.write(stop, epoch=m.epoch)
        if node == self.config.sched_node_rank and self.standbys and not self.standby:
            # This manager's own pod is going, also where the SIGTERM reached only the agent
            # (a start script that passes it on, the hook's detached manager): hand over.
            self.sigterm("SIGTERM to its agent")

    def _left(self, info: RankInfo, now: float, latency: float) -> None:
        """A rank's process exited 0 on its own. It finished if it said so (WorkerDone);
        otherwise it left early, a fault once its WorkerDone is not just late
        (:func:`~ms_recover.manager.decide.detect_early_exits`; until then it counts as alive,
        so that a late WorkerDone is still heard). A restarted manager cannot tell (the
        WorkerDone went to its predecessor): the exit counts as finished."""
        if info.done or self.model.restore is not None:
            info.done, info.alive = True, False
            return
        self.model.early_exits[info.rank] = (now, now - latency)

    def _final_exit(self, ident: bytes, msg: M.RankExited) -> None:
        """A rank left after the job finished (its agent was told to exit, and waits for it)."""
        info = self.model.ranks[msg.rank]
        # A process started after the end that never registered (its agent ended it) is the
        # rank's too: the only one without a registered process.
        if self._agent_ids.get(msg.node_rank) != ident or (msg.pid != info.pid and info.alive):
            self.drops.drop(f"exit of rank {msg.rank} pid {msg.pid} after the end", repr(ident))
            return
        info.exit_code = msg.exit_code
        exited = RankExitRecord(msg.rank, msg.pid, msg.exit_code, msg.signal, True)
        self.events.write(exited, epoch=self.model.epoch)
