"""The worker's background link to the manager (through its node agent's relay when the agent
set ``MS_RECOVER_RELAY_ENDPOINT``: :mod:`ms_recover.agent.relay`; else a direct connection).

A direct link (msrun's ranks) to a job with standby managers (``MS_RECOVER_MANAGERS``,
docs/manager-takeover.md) follows a takeover as a node agent does: ZeroMQ's PING/PONG ends a
connection silent for ``silence_s``, a connection monitor sees it go down, and after
``heartbeat_s`` down (or, after a move, ``2 * silence_s`` without a welcome from a standby that
does not take over) the link moves to the next manager of the list on a fresh DEALER and
registers again there. The training thread is not disturbed. Its first manager is never left
for not answering (a first hello may wait for its node's claim to be decided): the taskd
agent starts its workers with the manager that welcomed it first in their list.

A daemon thread owns the DEALER socket: it registers, heartbeats with the last committed step,
sends what the training thread queued, and latches the manager's commands. It never raises
into the training thread and never runs training code. On STOP or EXIT it calls the
``on_abort`` callback at once (the backend's ``abort()``), so a collective blocked on a dead
peer returns and the training thread reaches its safe point.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable

import zmq

from ms_recover.agent.managers import ManagerLinkState
from ms_recover.config import JobConfig
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Envelope
from ms_recover.protocol.transport import manager_channel, monitor_event

log = logging.getLogger("ms_recover.worker")


class ManagerLink:
    """Thread-safe mailbox between the training thread and the manager."""

    def __init__(
        self, config: JobConfig, rank: int, identity: bytes, on_abort: Callable[[], None]
    ) -> None:
        self.config = config
        self.rank = rank
        self._on_abort = on_abort
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        # Through the node agent's relay when an agent launched this rank (docs/design.md §1c),
        # else (msrun's ranks, a standalone worker) straight to the manager, following its
        # standbys if there are any.
        self._endpoints = config.manager_endpoints
        self._at = 0
        self._failover = not config.relay_endpoint and len(self._endpoints) > 1
        beats: dict[int, int] = {
            zmq.HEARTBEAT_IVL: int(config.heartbeat_s * 1000),
            zmq.HEARTBEAT_TIMEOUT: int(config.silence_s * 1000),
        }
        self._chan = manager_channel(
            self._ctx,
            config,
            f"rank:{rank}",
            identity,
            config.relay_endpoint or self._endpoints[0],
            beats if self._failover else None,
        )
        self._state = ManagerLinkState(time.monotonic())
        self._monitor: zmq.Socket[bytes] | None = None
        self._here_welcomed = False  # the manager at the current endpoint welcomed this rank
        self._at_moved = False  # the link left its first manager (see _fail_over)
        self._out: queue.SimpleQueue[tuple[M.Message, int | None]] = queue.SimpleQueue()
        #: Latched commands, oldest first; the training thread tests it without the lock (a
        #: deque's truth is one atomic read under the GIL), Session.steps on every step.
        self.inbox: collections.deque[Envelope] = collections.deque()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self.epoch = 0
        self.committed = -1
        self.last_heard = time.monotonic()
        #: What to send to register again with a restarted manager (hello, then the group
        #: log); set by the session. Called on the link thread.
        self.registration: Callable[[], Iterable[M.Message]] | None = None
        self._rejoining = False
        self._welcomed = False  # a Welcome reached the training thread
        #: Called on the link thread with each Peers (the endpoints of a new group's peers).
        self.on_peers: Callable[[M.Peers], None] | None = None
        #: The heartbeat's step timing and urgency (``StepClock.report``); set by the session.
        self.health: Callable[[float, int], tuple[list[float], bool]] | None = None
        self._identity, self._generation = identity, 0
        self._poller = zmq.Poller()
        # The thread sleeps in poll() until the manager writes, a message is queued (a byte on
        # this pipe) or the next heartbeat is due: no busy ticking on the training's CPU.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(
            target=self._loop, name=f"ms-recover-link-{rank}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def send(self, msg: M.Message, epoch: int | None = None) -> None:
        """Queue a message (an ack carries the epoch of its command); the thread sends it now."""
        self._out.put((msg, epoch))
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:  # the pipe is full: the thread is awake anyway
            pass

    def next_command(self, timeout_s: float) -> Envelope | None:
        """The oldest latched command, waiting up to ``timeout_s``."""
        with self._cond:
            if not self.inbox:
                self._cond.wait(timeout_s)
            return self.inbox.popleft() if self.inbox else None

    def has_command(self) -> bool:
        """Whether a command is latched; no lock (polled every step: a deque's truth is one
        atomic read under the GIL, and a command latched just after is seen next time)."""
        return bool(self.inbox)

    def close(self, flush_s: float = 0.0) -> None:
        """Stop the thread; with ``flush_s`` > 0, queued messages are sent and given that long
        to leave (a last WorkerDone), else they are dropped."""
        self._stop.set()
        self._wake()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._unwatch()
        self._chan.close(int(flush_s * 1000))
        self._ctx.term()

    def _loop(self) -> None:
        next_beat = 0.0
        poller = self._poller
        poller.register(self._chan.sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        self._watch()
        while True:
            while True:  # send what is queued, also on the way out
                try:
                    msg, epoch = self._out.get_nowait()
                except queue.Empty:
                    break
                self._chan.send(msg, self.epoch if epoch is None else epoch)
            if self._stop.is_set():
                return
            now = time.monotonic()
            if now >= next_beat:
                self._chan.send(self._beat(now), self.epoch)
                next_beat = now + self.config.heartbeat_s
            ready = dict(poller.poll(max(1, int((next_beat - time.monotonic()) * 1000))))
            if self._wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
            env = self._chan.recv_ready() if self._chan.sock in ready else None
            while env is not None:
                self._latch(env)
                env = self._chan.recv_ready()
            if self._failover:
                self._fail_over()

    def _beat(self, now: float) -> M.WorkerHeartbeat:
        if self.health is None:
            return M.WorkerHeartbeat(self.rank, self.committed)
        values, urgent = self.health(now, self.epoch)
        return M.WorkerHeartbeat(self.rank, self.committed, values, urgent)

    def _latch(self, env: Envelope) -> None:
        self.last_heard = time.monotonic()
        if isinstance(env.msg, M.StatusReply):
            return
        if isinstance(env.msg, M.Peers):  # an answer, not a command: no epoch, no inbox
            if self.on_peers is not None:
                self.on_peers(env.msg)
            return
        if isinstance(env.msg, M.Rejoin):
            self._rejoin(env.msg.reason)
            return
        if isinstance(env.msg, M.Welcome) and env.msg.ok:  # this manager serves us
            self._here_welcomed = True
            self._state.welcomed()
        if isinstance(env.msg, M.Welcome) and self._rejoining:
            self._rejoining = False
            # Re-registered: the training thread never needs to know, unless it still waits
            # for its first Welcome (its hello went to a standby manager that dropped it).
            if env.msg.ok and self._welcomed:
                log.info("rank %d registered again with the restarted manager", self.rank)
                return
        if isinstance(env.msg, M.Welcome) and env.msg.ok:
            self._welcomed = True
        if env.epoch < self.epoch:
            self._chan.drops.drop(f"stale {env.msg.KIND.decode()} of epoch {env.epoch}", "manager")
            return
        self.epoch = env.epoch
        if isinstance(env.msg, (M.Stop, M.Exit)):
            self._on_abort()
        with self._cond:
            self.inbox.append(env)
            self._cond.notify_all()

    def _rejoin(self, reason: str) -> None:
        """The manager does not know this rank (it was restarted): recreate the DEALER socket
        under a new identity, dropping frames queued for the old one (Paranoid Pirate), and
        register again with the current committed step, data endpoint and group log.
        Training is not disturbed."""
        if self.registration is None:
            return
        log.warning("rank %d: %s", self.rank, reason)
        self._reconnect()
        for msg in self.registration():
            self._chan.send(msg, self.epoch)
        self._rejoining = True

    def _reconnect(self) -> None:
        """A fresh DEALER to the current endpoint under a new identity (with its monitor)."""
        self._unwatch()
        self._poller.unregister(self._chan.sock)
        self._generation += 1
        self._chan.reconnect(self._identity + f".{self._generation}".encode())
        self._poller.register(self._chan.sock, zmq.POLLIN)
        self._watch()

    def _watch(self) -> None:
        """Follow the connection's ups and downs (with standby managers only)."""
        if self._failover:
            events = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
            self._monitor = self._chan.sock.get_monitor_socket(events)
            self._poller.register(self._monitor, zmq.POLLIN)

    def _unwatch(self) -> None:
        if self._monitor is not None:
            self._poller.unregister(self._monitor)
            self._chan.sock.disable_monitor()
            self._monitor.close(0)
            self._monitor = None

    def _fail_over(self) -> None:
        """Move to the next manager when :class:`ManagerLinkState` says so, and register
        there (its answer is handled as a restarted manager's)."""
        now = time.monotonic()
        while self._monitor is not None:
            try:
                event = monitor_event(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            self._state.note(event == zmq.EVENT_CONNECTED, now)
        # A first hello may be held for a while by the active manager (its node's claim is
        # being decided): only a rank that moved gives up on a manager that does not answer.
        why = self._state.why_leave(now, self._here_welcomed or not self._at_moved, self.config)
        if not why or self.registration is None:
            return
        old = self._endpoints[self._at]
        self._at = (self._at + 1) % len(self._endpoints)
        self._chan.endpoint = self._endpoints[self._at]
        self._state, self._here_welcomed, self._at_moved = ManagerLinkState(now), False, True
        self._rejoin(f"manager at {old} {why}: moving to {self._chan.endpoint}")
