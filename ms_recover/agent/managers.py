"""When a node agent leaves its manager for the next one of ``MS_RECOVER_MANAGERS``
(docs/manager-takeover.md): the state of its link to the current manager, kept from the
connection's monitor events, and the rule, pure."""

from __future__ import annotations

import dataclasses

from ms_recover.config import JobConfig


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
