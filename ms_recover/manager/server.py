"""The manager server: a ZeroMQ ROUTER and its message handlers, composed with the executor.

Handlers only record facts in the :class:`JobModel` (registrations, heartbeats, acks, faults).
After every batch of messages, and at least every ``tick_s``, the pure ``decide`` runs and the
:class:`~ms_recover.manager.executor.Executor` applies its actions in order, sending through
this server (:meth:`ManagerServer.send`).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
import typing
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from ms_recover.config import JobConfig
from ms_recover.dumpfiles import check_dump_dir
from ms_recover.errors import ProtocolError
from ms_recover.manager.acks import FastAcks
from ms_recover.manager.agents import AgentSide
from ms_recover.manager.cadence import Cadence, SharedBeat
from ms_recover.manager.decide import decide
from ms_recover.manager.ending import may_stop
from ms_recover.manager.executor import Executor
from ms_recover.manager.groups import GroupSide
from ms_recover.manager.hearing import Hearing
from ms_recover.manager.model import JobModel
from ms_recover.manager.relay import ManagerRelay
from ms_recover.manager.role import RoleSide
from ms_recover.manager.slots import Slots
from ms_recover.manager.status import status_of
from ms_recover.manager.strategies.registry import config_problems
from ms_recover.manager.workers import Handler, WorkerHandlers
from ms_recover.observability.events import EventLog
from ms_recover.observability.schema import (
    ConfigWarningRecord,
    JobState,
    ManagerStartRecord,
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


class ManagerServer(AgentSide, GroupSide, RoleSide):
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
        self._group_at: dict[int, str] = {}  # heartbeat group leader -> its endpoint
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
        if config.group_size > 1:  # a stop-all's STOP goes through the groups' leaders
            self.relay.router = self._routes
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
            M.GroupOpen: self._on_group_open,
            M.GroupBeats: self._on_group_beats,
            M.GroupStopped: self._on_group_stopped,
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

    def _decide_and_execute(self, judge: bool = True) -> None:
        """One decide + execute (``judge``: see :meth:`Cadence.run`). An unexpected error is
        logged (rate limited) and the next tick decides again from the model; only if every
        tick fails for ``phase_timeout_s`` does the manager stop (its members then stop too),
        rather than leave the job hanging."""
        try:
            self.executor.execute(decide(self.model, self.clock(), judge))
            if self.slots.claims:
                self.settle_claims()
            if self._group_at:
                self.settle_groups()
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
