"""The manager server: a ZeroMQ ROUTER and its message handlers, composed with the executor.

Handlers only record facts in the :class:`JobModel` (registrations, heartbeats, acks, faults).
After every batch of messages, and at least every ``tick_s``, the pure ``decide`` runs and the
:class:`~ms_recover.manager.executor.Executor` applies its actions in order, sending through
this server (:meth:`ManagerServer.send`).
"""

from __future__ import annotations

import functools
import gc
import logging
import threading
import time
import typing
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from ms_recover import exitcodes
from ms_recover.config import JobConfig
from ms_recover.dumpfiles import check_dump_dir
from ms_recover.errors import ProtocolError
from ms_recover.manager.acks import FastAcks
from ms_recover.manager.cadence import Cadence, SharedBeat
from ms_recover.manager.decide import decide
from ms_recover.manager.ending import may_stop
from ms_recover.manager.executor import Executor
from ms_recover.manager.hearing import Hearing
from ms_recover.manager.leaving import note_leaving
from ms_recover.manager.model import Fault, JobModel, Origin, RankInfo, Restore, SpareNode
from ms_recover.manager.relay import ManagerRelay
from ms_recover.manager.slots import Hello, Slots
from ms_recover.manager.status import status_of
from ms_recover.manager.strategies.registry import config_problems
from ms_recover.manager.takeover import OnSigterm, on_sigterm
from ms_recover.manager.workers import Handler, WorkerHandlers
from ms_recover.observability.events import EventLog
from ms_recover.observability.schema import (
    ConfigWarningRecord,
    FaultKind,
    JobState,
    ManagerStartRecord,
    ManagerTakeoverRecord,
    MemberRecord,
    PlannedStopRecord,
    RankExitRecord,
    RejectRecord,
    SpareRecord,
    StandDownRecord,
    TakeoverRecord,
)
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Codec, DropLog, Envelope
from ms_recover.protocol.relay import is_virtual
from ms_recover.protocol.replay import ReplayGuard
from ms_recover.protocol.transport import (
    control_server_keys,
    curve_server,
    make_socket,
    recv_frames,
    send_frames,
)
from ms_recover.strategy import Strategy
from ms_recover.subhealth import SubHealthy

#: From this many ranks the manager freezes its heap once per running epoch (see
#: :meth:`ManagerServer._freeze_when_running`).
FREEZE_MIN_RANKS = 1024

log = logging.getLogger("ms_recover.manager")
_BEAT = M.AgentHeartbeat.KIND
LISTEN_BACKLOG = 8192  # connections waiting to be accepted (see __init__)

INSECURE_WARNING = (
    "INSECURE: no job secret, so anyone who can reach port %d can drive this job (frames are "
    "signed with a key derived from the job id); set MS_RECOVER_SECRET or "
    "MS_RECOVER_SECRET_FILE, and MS_RECOVER_REQUIRE_SECRET=1 to refuse to run without one"
)


class ManagerServer:
    """Owns the job model. ``serve()`` runs until the job finishes or exits, or ``stop()``."""

    #: Frames handled per wake-up before the next decision is due.
    DRAIN_BUDGET = 20000

    def __init__(
        self,
        config: JobConfig,
        events: EventLog | None = None,
        clock: Callable[[], float] = time.time,
        tick_s: float = 0.02,
        bind: str | None = None,
    ) -> None:
        if Strategy.DUMP in config.strategies or config.sub_healthy is SubHealthy.GRACE_EXIT:
            check_dump_dir(config.effective_dump_dir())  # now, not at the fault that needs it
        self.config = config
        self.events = events or EventLog(config.events_path)
        self.events.job_id = self.events.job_id or config.job_id  # on every event line
        self.clock = clock
        self.tick_s = tick_s
        self.model = JobModel(config)
        self.codec = Codec(config.job_id, config.effective_secret(), config.max_frame_bytes)
        self.drops = DropLog(log)
        self.replay = ReplayGuard()
        self.errors = DropLog(log, interval_s=10.0)  # unexpected errors: a traceback per 10 s
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._sock = make_socket(self._ctx, zmq.ROUTER, config.max_frame_bytes)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        # Every node's agent connects at once when a large job starts: a listen queue of
        # ZeroMQ's default 100 would drop most of 2,048 connects (a retry costs each a second
        # or more). The kernel caps it at net.core.somaxconn.
        self._sock.setsockopt(zmq.BACKLOG, LISTEN_BACKLOG)
        if config.control_curve:
            curve_server(self._sock, control_server_keys(config.secret, config.job_id))
        host = bind or config.manager_host
        if config.manager_port == 0:
            self.port = self._sock.bind_to_random_port(f"tcp://{host}")
        else:
            self._sock.bind(f"tcp://{host}:{config.manager_port}")
            self.port = config.manager_port
        if config.tft_port and config.tft_port != self.port:
            # MindSpore's MindIO processors connect to MS_TFT_IP:MS_TFT_PORT (8000 in
            # MindCluster's samples): the same ROUTER serves them there.
            self._sock.bind(f"tcp://{host}:{config.tft_port}")
        self._stop = threading.Event()
        self._agent_ids: dict[int, bytes] = {}
        self.executor = Executor(self.model, self.events, clock, self, self._agent_ids)
        self.slots = Slots(config.agent_heartbeat_s, config.proc_per_node)
        self._failing_since: float | None = None  # monotonic time decide/execute began failing
        self._seq = 0
        self._frozen_epoch = -1  # the last epoch whose RUNNING state froze the heap
        # Takeover (docs/manager-takeover.md): a standby serves status requests only; after a
        # takeover, (lost node, when detected) until every survivor is back.
        self.standby = False
        #: Why this active manager hands over to a standby ("" while it does not): it then
        #: decides nothing more, and says so in its status (:meth:`sigterm`).
        self.handing_over = ""
        #: The standby managers of ``MS_RECOVER_MANAGERS``, and whether one answers now or
        #: took over (the takeover watch's; ``manager.main`` sets both).
        self.standbys = 0
        self.successor_answering: Callable[[], bool] = lambda: False
        self._sigterm: str | None = None  # a SIGTERM's reason, until the loop takes it up
        self._forced_exit: int | None = None
        self._coordinating: tuple[int, float] | None = None
        self.cadence = Cadence(self.model, tick_s)
        # Silence is judged as of the last empty read, never across the manager's own stall.
        beat = config.heartbeat_s
        self.hearing = Hearing(self.model, clock, limit_s=beat / 4, hold_s=beat / 2)
        self._poller = zmq.Poller()  # one, not one per wake-up (``Socket.poll`` builds one)
        self._poller.register(self._sock, zmq.POLLIN)
        self._beat = SharedBeat(self.model, self.codec, lambda: self._seq, self._next_seq)
        # Ranks behind a node agent: their frames arrive batched per node (docs/design.md §1c).
        self.relay = ManagerRelay(
            self.model, self.slots, self.codec, self._sock, self._next_seq, clock
        )
        self._acks = FastAcks(self.model, self.replay, self.drops, self.cadence, clock)
        # Frames received (dispatched) and sent (one per identity): plain counters, read by
        # ``bench controlplane`` for the manager's message rate.
        self.frames_in = 0
        self.frames_out = 0
        self._lock = threading.Lock()
        self.workers = WorkerHandlers(
            config, self.model, self.slots, self.events, self.drops, clock, self._send
        )
        self._handlers: dict[type[M.Message], Handler] = {
            M.AgentHello: self._on_agent_hello,
            M.SpareHello: self._on_spare_hello,
            M.AgentHeartbeat: self._on_agent_heartbeat,
            M.RankExited: self._on_rank_exited,
            M.RankFrozen: self._on_rank_frozen,
            M.NodeLeaving: self._on_node_leaving,
            M.RelayUp: self._on_relay_up,
            M.RelayAcks: self._on_relay_acks,
            **self.workers.handlers(),
        }
        described = config.replace(manager_port=self.port).describe()
        self.events.write(ManagerStartRecord(self.port, described), epoch=0)
        if config.insecure:
            log.warning(INSECURE_WARNING, self.port)
        for problem in config_problems(config):  # reported now, not when a fault happens
            log.warning("recover-strategy %s", problem)
            self.events.write(ConfigWarningRecord(problem), epoch=0)

    # ------------------------------------------------------------------ loop
    def serve(self, end_grace_s: float = 1.0) -> int:
        """Run until the job ends (plus a grace to flush) or stop(); returns the exit code."""
        ended_at: float | None = None
        rest = 0.0
        self.hearing.start()
        try:
            while not self._stop.is_set():
                wait_ms = self.cadence.poll_ms()
                ready = self._poller.poll(wait_ms)
                self.hearing.mark(wait_ms / 1000 + rest)
                if ready:
                    self._drain()
                else:
                    self.hearing.vouch()  # nothing unread: silence is silence
                with self._lock:
                    if self._sigterm is not None or self.handing_over:
                        self._take_sigterm(self._sigterm)
                    if not self.handing_over:  # refuse new work: the successor decides
                        self.cadence.run(self._decide_and_execute)  # when due (see .cadence)
                    if self._coordinating is not None:
                        self._note_coordinated()
                    self.relay.flush()  # what handlers and decide sent to relayed ranks
                    done = self.model.state in (JobState.FINISHED, JobState.EXITING)
                    self._freeze_when_running()
                    rest = self.cadence.rest_s()
                if rest:
                    self._stop.wait(rest)
                if done and ended_at is None:
                    ended_at = time.monotonic()
                if ended_at is not None and self._ended(time.monotonic() - ended_at, end_grace_s):
                    break
        finally:
            self.close()
        return self.exit_code()

    def _freeze_when_running(self) -> None:
        """Once per epoch that reaches RUNNING, move every object alive to Python's permanent
        GC generation (``gc.freeze``): the job model (a RankInfo per rank, their maps) then
        costs the cyclic collector nothing. At 16,384 ranks a full collection took ~45 ms, and
        one that fell inside a stop-all delayed it by that much. Frozen objects are still
        freed by reference counting; the young generations are collected first, so only
        cyclic garbage that had already grown old is kept."""
        epoch = self.model.epoch
        if self.config.world_size < FREEZE_MIN_RANKS:
            return  # a small job's heap costs the collector little: leave the process as it is
        if self._frozen_epoch != epoch and self.model.state is JobState.RUNNING:
            self._frozen_epoch = epoch
            gc.collect(1)
            gc.freeze()

    def _decide_and_execute(self) -> None:
        """One decide + execute. An unexpected error is logged (rate limited) and the next tick
        decides again from the model; only if every tick fails for ``phase_timeout_s`` does the
        manager stop (its members then stop too), rather than leave the job hanging."""
        try:
            self.executor.execute(decide(self.model, self.clock()))
            for ident, env in self.slots.take_released():
                self.workers.on_hello(ident, env, typing.cast(M.WorkerHello, env.msg))
            self._failing_since = None
        except Exception as exc:
            self.errors.drop(f"decide/execute failed: {type(exc).__name__}: {exc}", "-", exc)
            now = time.monotonic()
            self._failing_since = self._failing_since or now
            if now - self._failing_since > self.config.phase_timeout_s:
                log.error("decide/execute failed for %.0fs: stopping", now - self._failing_since)
                self._stop.set()

    def _ended(self, waited: float, grace_s: float) -> bool:
        """After the job's end: the grace passed and :func:`~.ending.may_stop` agrees."""
        if waited <= grace_s:
            return False
        with self._lock:
            return may_stop(self.model, self.clock(), waited - grace_s)

    def exit_code(self) -> int:
        if self._forced_exit is not None:
            return self._forced_exit
        return self.executor.exit_code()

    # ------------------------------------------------------------------ takeover
    def set_role(self, role: str, term: int, seen_active: bool) -> None:
        """Record this manager's role (:mod:`.takeover`); a standby serves status only."""
        with self._lock:
            self.standby = role != "active"
            self.model.manager = {
                "role": role,
                "term": term,
                "node": self.config.node_rank,
                "seen_active": seen_active,
            }

    def sigterm(self, reason: str) -> None:
        """SIGTERM came (safe from a signal handler: it only records the fact). The serve
        loop acts on it at its next turn (:meth:`_take_sigterm`)."""
        self._sigterm = reason

    def _take_sigterm(self, reason: str | None) -> None:
        """Apply :func:`~.takeover.on_sigterm` to a new SIGTERM (``reason``), and again on
        every turn of a handover (``None``): stop at once, hand over to the standby that
        answers, or end the job cleanly (``JobModel.stop_asked``), also when the standby
        stopped answering before it took over. Under the lock."""
        self._sigterm = None
        m, node = self.model, self.config.node_rank
        role = "standby" if self.standby else "active"
        ended = m.state in (JobState.FINISHED, JobState.EXITING)
        plan, why = on_sigterm(role, ended, self.standbys, self.successor_answering())
        if reason is None and plan is OnSigterm.HAND_OVER:
            return  # handing over: the watch stands this manager down once it landed
        if reason is not None:
            log.warning("manager of node %d, %s: %s (%s)", node, reason, plan.value, why)
        if plan is OnSigterm.STOP:
            self._stop.set()
            return
        asked = f"node {node}, which hosts the manager, was asked to stop ({reason or 'SIGTERM'}"
        if plan is OnSigterm.HAND_OVER and not self.handing_over:
            self.handing_over = f"{asked}: its pod deleted or its node drained)"
            m.manager = {**m.manager, "handing_over": self.handing_over}
        elif plan is OnSigterm.END_JOB and not m.stop_asked:
            if self.handing_over:
                log.warning("manager of node %d: the handover failed (%s)", node, why)
            self.handing_over = ""
            m.manager = {k: v for k, v in m.manager.items() if k != "handing_over"}
            m.stop_asked = f"{asked}: its pod deleted or its node drained); {why}"

    def take_over(
        self, lost_node: int, term: int, detected_at: float, reason: str, handover: bool = False
    ) -> None:
        """Become the active manager with ``term``, and adopt the members that come here as
        a restarted manager does (``phases._restoring``). After a loss the old active
        manager's node is lost (recovered like any other node); after a ``handover`` nothing
        is lost: every member comes here, and the old manager's node says itself that it is
        leaving (its agent's planned stop)."""
        with self._lock:
            m, now = self.model, self.clock()
            self.standby = False
            m.manager = {"role": "active", "term": term, "node": self.config.node_rank}
            if m.state is JobState.FORMING and m.round is None and m.restore is None:
                m.restore = Restore(now)
            if not handover:
                detail = f"node {lost_node} lost with the active manager: {reason}"
                m.pending.append(
                    Fault(FaultKind.NODE_LOST, lost_node, -1, detail, now, self.config.silence_s)
                )
            self._coordinating = (-1 if handover else lost_node, detected_at)
            record = TakeoverRecord(term, lost_node, reason, handover=handover or None)
            self.events.write(record, epoch=m.epoch)

    def stand_down(self, code: int, reason: str) -> None:
        """Stop serving with ``code`` (the job ended, or a higher term is active)."""
        self.events.write(StandDownRecord(code, reason), epoch=self.model.epoch)
        self._forced_exit = code
        self._stop.set()

    def _note_coordinated(self) -> None:
        """After a takeover: once every survivor (agent and rank off the lost node, and off
        the nodes that are leaving) is registered here, write ``manager_takeover`` with the
        seconds since the detection."""
        assert self._coordinating is not None
        lost, detected_at = self._coordinating
        m = self.model
        # Survivors: off the lost node, and (after a handover) off nodes leaving or sent away.
        gone = {lost, *m.leaving, *(m.round.reschedule_nodes if m.round is not None else ())}
        agents = all(a.alive for n, a in m.agents.items() if n not in gone)
        if agents and all(i.alive or i.done for i in m.ranks.values() if i.node_rank not in gone):
            took = round(self.clock() - detected_at, 4)
            self.events.write(ManagerTakeoverRecord(lost, took), epoch=m.epoch)
            self._coordinating = None

    def start_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve, name="ms-recover-manager", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._sock.close(0)
        self._ctx.term()
        self.events.close()

    def status(self) -> dict[str, Any]:
        with self._lock:
            return status_of(self.model, self.clock(), self.events)

    def _drain(self) -> None:
        """Handle every queued frame (up to :attr:`DRAIN_BUDGET`) before the next ``decide``: at
        scale, deciding once per large batch instead of per thousand frames halves stop-all
        time. Only a drain that emptied the queue moves ``model.heard_at`` (see
        :func:`~ms_recover.manager.decide.detect_silence` and :mod:`.hearing`)."""
        for _ in range(self.DRAIN_BUDGET):
            try:
                frames = recv_frames(self._sock)
            except zmq.Again:
                self.hearing.vouch()
                return
            self.dispatch(frames)
            # A phase's last answer, or a fault once a decision is due: decide before reading
            # on (heartbeats that keep coming would otherwise hold the decision back).
            if self.cadence.answered or (self.model.pending and self.cadence.due()):
                return

    def dispatch(self, frames: list[bytes]) -> None:
        """Decode, replay-check and handle one ROUTER message. Never raises: whatever a frame
        holds, it is handled or dropped and logged (rate limited)."""
        identity, body = frames[0], frames[1:]
        self.frames_in += 1
        if is_virtual(identity):  # the manager's own names for relayed ranks: never a peer's
            self.drops.drop("a peer identity in the relay's reserved form", repr(identity[:16]))
            return
        if len(body) == 1 and self._quick_beat(identity, body[0]):
            return
        try:
            env = self.codec.decode(body)
        except ProtocolError as exc:
            self.drops.drop(str(exc), repr(identity[:16]))
            return
        except Exception as exc:  # a codec bug must not end the manager either
            self.errors.drop(f"undecodable frame: {type(exc).__name__}", repr(identity[:16]), exc)
            return
        with self._lock:
            self._handle(identity, env)

    def _handle(self, identity: bytes, env: Envelope) -> None:
        """Replay-check and handle one decoded frame (or relayed item), under the lock."""
        replayed = self.replay.check(env.sender, env.nonce, env.seq)
        if replayed:
            self.drops.drop(replayed, env.sender[:64])
            return
        if self.standby and not isinstance(env.msg, M.StatusRequest):
            return  # a standby serves nobody (docs/manager-takeover.md)
        handler = self._handlers.get(type(env.msg))
        self.cadence.heard(type(env.msg), env.epoch)
        if handler is None:  # a manager -> member kind sent to the manager
            self.drops.drop(f"{env.msg.KIND.decode()} is not for the manager", env.sender)
            return
        try:
            handler(identity, env, env.msg)
        except Exception as exc:  # a valid frame with nonsense content: drop, go on
            what = f"handler for {env.msg.KIND.decode()} failed: {type(exc).__name__}"
            self.errors.drop(what, env.sender, exc)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _send(self, identity: bytes, msg: M.Message) -> None:
        self.send([identity], msg)

    def send(self, identities: Sequence[bytes], msg: M.Message) -> None:
        """Encode once (one seq for the whole broadcast), send to every identity; relayed
        ranks' share goes out per node at the next :meth:`ManagerRelay.flush`."""
        self.cadence.owed(type(msg), len(identities))
        identities = self.relay.take(identities, msg, self.model.epoch)
        if not identities:
            return
        self._seq += 1
        try:
            frames = self.codec.encode(msg, self.model.epoch, "manager", self._seq)
        except ProtocolError as exc:
            self.errors.drop(str(exc), "manager")
            return
        for identity in identities:
            self.frames_out += 1
            try:
                send_frames(self._sock, [identity, *frames])
            except zmq.ZMQError as exc:
                log.warning("send %s to %r failed: %s", msg.KIND.decode(), identity, exc)

    # ------------------------------------------------------------------ agent handlers
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
    ) -> None:
        claims = self.slots.claims  # almost always empty: no slot-claim checks then
        claim = self.slots.claimant(node_rank, ident) if claims else None
        if claim is not None:  # the claimant: is the old one gone now?
            self._on_agent_hello(ident, claim[1], typing.cast(M.AgentHello, claim[1].msg))
            return
        if not self._agent_ok(ident, node_rank):
            return
        if claims and node_rank not in self.model.switching:  # a hot switch's new pod waits
            self._refuse_claims(node_rank)
        now = self.model.agents[node_rank].last_seen = self.clock()
        self.relay.fold(ident, steps, now, health)
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
