"""A node agent and its manager(s): when it gives up on a silent manager, when it leaves its
manager for the next one of ``MS_RECOVER_MANAGERS`` (docs/manager-takeover.md), and how it
registers again with a manager that does not know it.

:class:`ManagerLinkState` is the state of the link to the current manager, kept from the
connection's monitor events, and the rule, pure; :class:`ManagerSide` is the part of
:class:`~ms_recover.agent.agent.Agent` (which inherits it) that acts on them."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

import zmq

from ms_recover.agent.hands import Exited, RankHands
from ms_recover.agent.leaving import PlannedStop
from ms_recover.agent.relay import LocalRelay
from ms_recover.config import JobConfig
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Envelope
from ms_recover.protocol.transport import DealerChannel, monitor_event

log = logging.getLogger("ms_recover.agent")

#: What a manager tells an agent to do: never carried out from an older epoch (``_stale``).
_COMMANDS = (M.KillRanks, M.StartRanks, M.AgentExit, M.GroupStop)


@dataclasses.dataclass
class ManagerLinkState:
    """The link to the manager the agent went to at ``since`` (monotonic seconds)."""

    since: float
    connected: bool = False
    down_since: float | None = None  # when the connection, once up, went down
    held: bool = False  # the manager answered the hello with a beat: active, holding it

    def note(self, connected: bool, now: float) -> None:
        """A monitor event: the connection came up or went down at ``now``. A connection that
        went down stays "down" when ZeroMQ reconnects to the same address, until a manager
        there welcomes the agent (:meth:`welcomed`): the process behind it is another one (a
        recreated node 0 whose manager stands by), which the agent must not take for the one
        that went away."""
        self.connected = connected
        if not connected:
            self.down_since = self.down_since or now

    def welcomed(self) -> None:
        """A manager at this address welcomed the agent: the link is up again."""
        self.down_since = None

    def answered(self) -> None:
        """The manager at this address answered the agent's hello without welcoming it yet
        (a beat: it holds the hello, as for a hot switch's new pod); a standby answers no
        member, so this one is active and the agent waits for it."""
        self.held = True
        self.down_since = None

    def why_leave(self, now: float, welcomed: bool, cfg: JobConfig) -> str:
        """Why the agent should move on now, or "": the connection, once up, has been down for
        ``heartbeat_s`` (the manager's process or machine is gone: ZeroMQ's heartbeat ends a
        silent connection after ``silence_s``), or this manager has not welcomed the agent
        within ``2 * silence_s`` of its arrival (a standby that is not taking over) nor said
        that it holds it (:meth:`answered`)."""
        if self.down_since is not None and now - self.down_since >= cfg.heartbeat_s:
            return f"unreachable for {now - self.down_since:.1f}s"
        if not welcomed and not self.held and now - self.since >= 2 * cfg.silence_s:
            return f"did not answer within {now - self.since:.1f}s"
        return ""


class ManagerSide:
    """The agent's side of its link to the manager (see the module docstring). The
    attributes are the agent's (:class:`~ms_recover.agent.agent.Agent` sets them)."""

    config: JobConfig
    chan: DealerChannel
    relay: LocalRelay | None
    ranks: RankHands
    spare: bool
    _failover: bool
    _monitor: zmq.Socket[bytes] | None
    _link: ManagerLinkState
    _welcomed: bool
    _endpoints: tuple[str, ...]
    _at: int
    _ident: bytes
    _poller: zmq.Poller
    _last_heard: float
    _exits: dict[int, tuple[Exited, bool]]
    _leaving: PlannedStop | None
    _epoch: int
    _manager_nonce: int
    _manager_epoch: int
    hello: Callable[[], None]
    _send_exit: Callable[[Exited, bool], None]

    def _manager_alive(self) -> bool:
        """False once the manager has been silent for the grace. Meanwhile the DEALER keeps
        its socket: ZeroMQ reconnects to a restarted manager on the same address by itself,
        which then answers with ``Rejoin``. Recreating the socket under the same identity
        could be refused by a live but slow manager's ROUTER (the identity still in use), and
        a healthy node would then be declared lost."""
        quiet = time.monotonic() - self._last_heard
        grace = self.config.lost_manager_grace_s
        if quiet > grace:
            log.error(
                "manager at %s silent for %.0fs: stopping this node",
                self.config.manager_endpoint,
                grace,
            )
            return False
        return True

    def _watch_link(self) -> zmq.Socket[bytes] | None:
        """A monitor of the manager connection's ups and downs (with standbys only)."""
        if not self._failover:
            return None
        return self.chan.sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)

    def _fail_over(self) -> None:
        """Move to the next manager of the list (see the module docstring)."""
        if self._monitor is None:
            return
        now = time.monotonic()
        while True:
            try:
                event = monitor_event(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            self._link.note(event == zmq.EVENT_CONNECTED, now)
        why = self._link.why_leave(now, self._welcomed, self.config)
        if not why:
            return
        old = self._endpoints[self._at]
        self._at = (self._at + 1) % len(self._endpoints)
        self._poller.unregister(self.chan.sock)
        self.chan.sock.disable_monitor()
        self._monitor.close(0)
        self.chan.endpoint = self._endpoints[self._at]
        self.chan.reconnect(self._ident + f".m{self._at}.{int(now * 1000)}".encode())
        self._poller.register(self.chan.sock, zmq.POLLIN)
        self._monitor = self._watch_link()
        self._link = ManagerLinkState(now)
        self._rejoin(f"manager at {old} {why}: moving to {self.chan.endpoint}")

    def _rejoin(self, reason: str) -> None:
        """A restarted manager does not know this node: register again, then report the last
        exit of each local rank that is not running (it may have died while no one listened)."""
        log.warning("%s: registering again", reason)
        self._welcomed = False
        if self.spare:  # its wait offers it to the new manager (SpareHello), no node hello
            self._link.since = time.monotonic()
            return
        self.hello()
        if self.relay is not None:
            self.relay.rejoin_all(reason)
        running = self.ranks.pids()
        for rank, (exited, requested) in sorted(self._exits.items()):
            if rank not in running:
                self._send_exit(exited, requested)
        if self._leaving is not None and self._leaving.deadline is not None:  # said again
            msg = self._leaving.message(self.config.node_rank, time.monotonic())
            self.chan.send(msg, self._epoch)

    def _stale(self, env: Envelope) -> bool:
        """A command of an older epoch from the same manager incarnation is never carried out
        (a restarted manager, with a new nonce, starts its own epoch count)."""
        if env.nonce != self._manager_nonce:
            self._manager_nonce, self._manager_epoch = env.nonce, env.epoch
        elif env.epoch < self._manager_epoch and isinstance(env.msg, _COMMANDS):
            self.chan.drops.drop(f"stale {env.msg.KIND.decode()} of epoch {env.epoch}", "manager")
            return True
        self._manager_epoch = max(self._manager_epoch, env.epoch)
        return False
