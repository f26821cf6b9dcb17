"""The manager's handlers for what a rank says about itself, direct or relayed by its agent.

Hello (registration, or a rejoin after a manager restart), heartbeats, groups, the phase
acknowledgements (STOPPED, REBUILT, REPAIRED, DUMPED), faults, digests, done, status. Like
every handler they only record facts in the :class:`~ms_recover.manager.model.JobModel`;
``decide`` acts on them. A frame from a rank this manager does not know is dropped and logged,
or, after a manager restart, answered with ``Rejoin`` (at most once per heartbeat interval).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ms_recover.config import JobConfig
from ms_recover.dumpfiles import DumpFile
from ms_recover.errors import CommError, RepairError
from ms_recover.manager import divergence
from ms_recover.manager.commands import peers_of_group
from ms_recover.manager.health import note
from ms_recover.manager.model import Ack, Fault, JobModel, RankInfo, Restore
from ms_recover.manager.slots import Slots
from ms_recover.manager.status import status_of
from ms_recover.observability.events import EventLog
from ms_recover.observability.schema import (
    FaultKind,
    GroupRecord,
    JobState,
    ManagerRestoreRecord,
    MemberRecord,
    RejectRecord,
)
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import DropLog, Envelope

log = logging.getLogger("ms_recover.manager")

#: WorkerFault kinds after which the rank's state cannot be trusted (repaired under retry).
CORRUPTING = frozenset({"corrupt", "device_memory"})
#: WorkerFault kinds after which the rank cannot redo its step (MindSpore's RS_UNKNOWN):
#: the rank stays reachable, but ``retry`` no longer applies.
FATAL = frozenset({"fatal"})

Handler = Callable[[bytes, Envelope, Any], None]


class WorkerHandlers:
    """The rank messages' handlers of one :class:`~ms_recover.manager.server.ManagerServer`
    (which calls them under its lock); ``send(identity, msg)`` answers one member."""

    def __init__(
        self,
        config: JobConfig,
        model: JobModel,
        slots: Slots,
        events: EventLog,
        drops: DropLog,
        clock: Callable[[], float],
        send: Callable[[bytes, M.Message], None],
    ) -> None:
        self.config, self.model, self.slots = config, model, slots
        self.events, self.drops, self.clock, self.send = events, drops, clock, send
        self.rejoin_asked: dict[bytes, float] = {}  # identity -> when Rejoin was last sent
        self._welcomed: M.Welcome | None = None  # the last Welcome sent (see _welcome)

    def handlers(self) -> dict[type[M.Message], Handler]:
        return {
            M.WorkerHello: self.on_hello,
            M.WorkerHeartbeat: self.on_heartbeat,
            M.GroupCreated: self.on_group,
            M.Stopped: self.on_stopped,
            M.StateDigest: self.on_state_digest,
            M.Rebuilt: self.on_rebuilt,
            M.Repaired: self.on_repaired,
            M.WorkerFault: self.on_fault,
            M.WorkerDone: self.on_done,
            M.Dumped: self.on_dumped,
            M.StatusRequest: self.on_status,
        }

    def on_hello(self, ident: bytes, env: Envelope, msg: M.WorkerHello) -> None:
        m, now = self.model, self.clock()
        if self.slots.hold_worker(msg.node_rank, (ident, env)):  # decided with its agent's claim
            self._note_backup(msg.node_rank, now)
            return
        if self._undecided(msg.rank, msg.node_rank):
            self.slots.defer((ident, env))
            return
        reason = self._reject(msg, env.nonce)
        if reason:
            self.send(ident, M.Welcome(False, reason, False, self.config.world_size, []))
            log.warning("rejected worker: %s", reason)
            self.events.write(RejectRecord(reason, rank=msg.rank), epoch=m.epoch)
            return
        info = m.ranks[msg.rank]
        if env.epoch > 0:
            self.note_rejoin(env.epoch, msg.rank)
        self.rejoin_asked.pop(ident, None)
        info.registered = info.alive = True
        info.identity, info.pid, info.incarnation = ident, msg.pid, msg.incarnation
        info.endpoint, info.shard, info.committed_step = (
            msg.data_endpoint,
            msg.shard,
            msg.committed_step,
        )
        info.endpoint_epoch = m.epoch
        self.slots.rank_nonce[msg.rank] = env.nonce
        info.last_seen = info.last_progress = now
        info.acks, info.repair_failure, info.done, info.exit_code = {}, None, False, None
        info.waits = info.released = False
        info.digests = {}  # the old incarnation's digests say nothing about this process
        reboot = m.round is not None and m.in_recovery and msg.rank in m.round.replace_ranks
        self.send(ident, self._welcome(reboot))
        if m.state is JobState.STOPPING and not reboot:
            self.send(ident, M.Stop("joining during recovery"))
        member = MemberRecord(
            "worker", msg.pid, env.epoch > 0, msg.rank, msg.incarnation, reboot=reboot
        )
        self.events.write(member, epoch=m.epoch)

    def _undecided(self, rank: int, node: int) -> bool:
        """Whether a fault naming ``rank`` or its node waits for the next decision. A
        recreated pod's ranks may register before the manager decided on the pod's restart
        (both arrive in one drain); the round that decision starts replaces the node's ranks
        and would drop their registrations, and they never say hello again. A restarted
        manager's faults wait for its members (``phases._restoring``): not then."""
        m = self.model
        if m.restore is not None and m.state is JobState.FORMING:
            return False
        return any(f.rank == rank or (f.rank < 0 and f.node_rank == node) for f in m.pending)

    def _welcome(self, reboot: bool) -> M.Welcome:
        """The Welcome of a registered rank: one object while its content stays the same, so
        the relay sends a node's ranks one item with every target (``ManagerRelay.take``)."""
        groups = self.model.group_log.to_wire()
        last = self._welcomed
        if last is None or last.reboot != reboot or last.group_log != groups:
            last = self._welcomed = M.Welcome(True, "", reboot, self.config.world_size, groups)
        return last

    def _reject(self, msg: M.WorkerHello, nonce: int) -> str:
        """Why a registration is refused, or "" (the slot rule: see :mod:`.slots`)."""
        world = self.config.world_size
        if not 0 <= msg.rank < world:
            return f"rank {msg.rank} is outside the world 0..{world - 1}"
        expected = self.config.node_of(msg.rank)
        if msg.node_rank != expected:
            return f"rank {msg.rank} belongs to node {expected}, not node {msg.node_rank}"
        info = self.model.ranks[msg.rank]
        if self.slots.rank_taken(msg.rank, info.alive, info.pid, msg.pid, nonce):
            return f"rank {msg.rank} is already registered by pid {info.pid}"
        return ""

    def _note_backup(self, node: int, now: float) -> None:
        """A hot switch's new pod is all there once every one of its ranks waits
        (:mod:`~ms_recover.manager.subhealth` then swaps it in)."""
        if node in self.model.switching and len(self.slots.held[node]) >= self.slots.ranks_per_node:
            self.model.backups.setdefault(node, now)

    def note_rejoin(self, epoch: int, rank: int | None) -> None:
        """A member of a running job registered again (at ``epoch`` > 0): this manager was
        restarted. While still FORMING, adopt the job's epoch and rebuild the view from the
        members (:func:`~ms_recover.manager.progress._restoring` decides when it is complete)."""
        m = self.model
        if m.state is not JobState.FORMING or m.round is not None:
            return
        if m.restore is None:
            m.restore = Restore(self.clock())
            log.warning("members of a running job re-register: this manager was restarted")
            self.events.write(ManagerRestoreRecord(), epoch=epoch)
        m.epoch = max(m.epoch, epoch)
        if rank is not None:
            m.restore.epochs[rank] = epoch

    def ask_to_rejoin(self, ident: bytes, who: str) -> None:
        """A signed frame from a member this manager never registered (it was restarted):
        ask it to register again, at most once per heartbeat interval per identity."""
        now = self.clock()
        if now - self.rejoin_asked.get(ident, -1e18) < self.config.heartbeat_s:
            return
        self.rejoin_asked[ident] = now
        log.info("asking the %s to register again", who)
        self.send(ident, M.Rejoin(f"manager restarted: {who} must register again"))

    def _rank(self, ident: bytes, rank: int) -> RankInfo | None:
        info = self.model.ranks.get(rank)
        if info is not None and not info.registered:
            self.ask_to_rejoin(ident, f"rank {rank}")
            return None
        if info is None or not info.alive or info.identity != ident:
            self.drops.drop(f"message from unregistered rank {rank}", repr(ident))
            return None
        info.last_seen = self.clock()
        return info

    def _current(self, env: Envelope, what: str) -> bool:
        if env.epoch != self.model.epoch:
            self.drops.drop(
                f"stale {what} of epoch {env.epoch} (now {self.model.epoch})", env.sender
            )
            return False
        return True

    def on_heartbeat(self, ident: bytes, env: Envelope, msg: M.WorkerHeartbeat) -> None:
        info = self._rank(ident, msg.rank)
        if info is not None and msg.committed_step > info.committed_step:
            info.committed_step, info.last_progress = msg.committed_step, self.clock()
        if info is not None and msg.health:
            note(self.model, msg.rank, msg.committed_step, msg.health, self.clock())

    def on_group(self, ident: bytes, env: Envelope, msg: M.GroupCreated) -> None:
        if self._rank(ident, msg.rank) is None:
            return
        try:
            if self.model.group_log.add(msg.name, msg.ranks):
                self.events.write(GroupRecord(msg.name, msg.ranks), epoch=self.model.epoch)
        except CommError as exc:
            log.warning("rank %d: %s", msg.rank, exc)
            return
        reply = peers_of_group(self.model, msg.rank, msg.name, msg.ranks)
        if reply is not None:  # the rank waits for it before its first call on the group
            self.send(ident, reply)

    def on_stopped(self, ident: bytes, env: Envelope, msg: M.Stopped) -> None:
        info = self._rank(ident, msg.rank)
        if info is not None and self._current(env, "stopped"):
            info.ack(Ack.STOP, env.epoch)
            info.committed_step = msg.committed_step
            info.stop_digest = msg.digest

    def on_state_digest(self, ident: bytes, env: Envelope, msg: M.StateDigest) -> None:
        """Steady-state replica check (see :func:`~ms_recover.manager.divergence.on_digest`):
        a minority that differs becomes a ``diverged`` fault, decided on at the next tick."""
        if self._rank(ident, msg.rank) is None:
            return
        m = self.model
        for verdict in divergence.on_digest(m, msg.rank, msg.step, msg.digest, self.clock()):
            log.warning("epoch=%d %s", m.epoch, verdict.reason)
            self.events.write(verdict.record(), epoch=m.epoch, state=m.state.value)

    def on_rebuilt(self, ident: bytes, env: Envelope, msg: M.Rebuilt) -> None:
        info = self._rank(ident, msg.rank)
        if info is not None and self._current(env, "rebuilt"):
            info.ack(Ack.REBUILD, env.epoch)

    def on_repaired(self, ident: bytes, env: Envelope, msg: M.Repaired) -> None:
        info = self._rank(ident, msg.rank)
        if info is None or not self._current(env, "repaired"):
            return
        if msg.ok:
            info.ack(Ack.REPAIR, env.epoch, msg.attempt)
            info.committed_step = msg.committed_step
        else:
            info.repair_failure = (msg.attempt, msg.failed_peer, msg.reason)

    def on_fault(self, ident: bytes, env: Envelope, msg: M.WorkerFault) -> None:
        info = self._rank(ident, msg.rank)
        if info is not None:
            self.model.pending.append(
                Fault(
                    FaultKind.WORKER_FATAL if msg.kind in FATAL else FaultKind.WORKER_ERROR,
                    info.node_rank,
                    msg.rank,
                    f"rank {msg.rank} {msg.kind}: {msg.message}",
                    self.clock(),
                    0.0,
                    corrupt=msg.kind in CORRUPTING | FATAL,
                )
            )

    def on_dumped(self, ident: bytes, env: Envelope, msg: M.Dumped) -> None:
        info = self._rank(ident, msg.rank)
        if info is not None and self._current(env, "dumped"):
            info.dump = msg.to_wire()
            problem = self._unusable(msg) if msg.ok else ""
            if problem:  # a failed dump, not a manifest the executor cannot write
                info.dump |= {"ok": False, "reason": f"rank {msg.rank}'s dump {problem}"}

    def _unusable(self, msg: M.Dumped) -> str:
        """Why a successful dump answer cannot go into the manifest, or ""."""
        rnd = self.model.round
        if rnd is not None and msg.step != rnd.target_step:
            return f"is of step {msg.step}, not the dumped step {rnd.target_step}"
        try:
            DumpFile.from_dict(msg.to_wire())
        except RepairError as exc:
            return f"cannot be recorded: {exc}"
        return ""

    def on_done(self, ident: bytes, env: Envelope, msg: M.WorkerDone) -> None:
        info = self._rank(ident, msg.rank)
        if info is not None:
            info.done, info.committed_step = True, max(info.committed_step, msg.committed_step)
            info.waits = msg.waits  # it stays a member (a repair source) until the end
            if self.model.early_exits.pop(msg.rank, None) is not None:
                info.alive = False  # its exit, reported first, was no fault: it finished

    def on_status(self, ident: bytes, env: Envelope, msg: M.StatusRequest) -> None:
        self.send(ident, M.StatusReply(status_of(self.model, self.clock(), self.events)))
