"""A spare node's agent while it waits for a node (``ms-recover agent --spare``,
docs/design.md §1f).

The pod holds one pre-warmed process per local rank (the rank command run up to
``ms_recover.init()``, its ``warm_up`` compiled there: :meth:`RankSet.hold_warm
<ms_recover.agent.ranks.RankSet.hold_warm>`) and no node rank. Every ``agent_heartbeat_s`` it
offers itself to the manager (``SpareHello``, with how many processes are warm) and replaces a
warm process that died. It waits until the manager gives it a lost node's place
(``SpareAssign``): the agent then registers as that node's agent and starts the node's ranks in
the warm processes. With standby managers (``MS_RECOVER_MANAGERS``) it moves to the next one
as the agent does (docs/manager-takeover.md) and offers itself there. It ends instead when the
job ends (``AgentExit``), on SIGTERM (nothing to hand over: exit 143 at once), or when no
manager has answered for ``lost_manager_grace_s`` (exit 1).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable

from ms_recover import exitcodes
from ms_recover.agent.hands import Exited, RankHands
from ms_recover.agent.leaving import PlannedStop
from ms_recover.agent.managers import ManagerLinkState
from ms_recover.agent.ranks import RankSet
from ms_recover.agent.relay import LocalRelay
from ms_recover.config import JobConfig
from ms_recover.protocol import messages as M
from ms_recover.protocol.transport import DealerChannel

log = logging.getLogger("ms_recover.agent")

WAIT_MS = 100  # the longest the loop sleeps on the manager channel


@dataclasses.dataclass
class SpareWait:
    """One wait for a node; :meth:`run` returns the node rank, or None with ``exit_code``."""

    config: JobConfig
    chan: DealerChannel
    ranks: RankSet
    stop: threading.Event
    leaving: Callable[[], bool]  # SIGTERM came
    #: With standby managers: move to the next one when this one is gone or does not answer
    #: (the agent's own rule, docs/manager-takeover.md); a no-op with one manager.
    fail_over: Callable[[], None] = lambda: None
    answered: Callable[[], None] = lambda: None  # a manager answered this spare
    exit_code: int | None = None

    def run(self) -> int | None:
        cfg = self.config
        next_beat = 0.0
        heard = time.monotonic()
        while not self.stop.is_set():
            endpoint = self.chan.endpoint
            self.fail_over()
            if self.chan.endpoint != endpoint:  # a new manager: say hello to it at once
                next_beat, heard = 0.0, time.monotonic()
            now = time.monotonic()
            if self.leaving():
                log.warning("spare node got SIGTERM: leaving (no node to hand over)")
                self.exit_code = exitcodes.STOPPED
                return None
            if now - heard > cfg.lost_manager_grace_s:
                log.error(
                    "manager at %s silent for %.0fs: spare node ends",
                    self.chan.endpoint,
                    cfg.lost_manager_grace_s,
                )
                self.exit_code = exitcodes.FAILED
                return None
            if now >= next_beat:
                self.ranks.poll()  # a warm process that died is replaced
                self.chan.send(M.SpareHello(cfg.pod_ip, os.getpid(), self.ranks.warm), 0)
                next_beat = now + cfg.agent_heartbeat_s
            env = self.chan.recv(WAIT_MS)
            if env is None:
                continue
            heard = time.monotonic()
            self.answered()
            node = self._handle(env.msg)
            if node is not None or self.exit_code is not None:
                return node
        return None

    def _handle(self, msg: M.Message) -> int | None:
        """The node this spare was given, if ``msg`` gives one (an out-of-range one is
        refused: the spare waits on); an ``AgentExit`` sets ``exit_code``."""
        if isinstance(msg, M.SpareAssign):
            if 0 <= msg.node_rank < self.config.node_nums:
                log.warning("spare node takes node %d's place: %s", msg.node_rank, msg.reason)
                return msg.node_rank
            log.error(
                "spare node told to take node %d, outside 0..%d: ignored",
                msg.node_rank,
                self.config.node_nums - 1,
            )
        elif isinstance(msg, M.AgentExit):
            log.info("spare node: the manager asks it to exit with %d: %s", msg.code, msg.reason)
            self.exit_code = msg.code
        return None


class SpareSide:
    """The part of :class:`~ms_recover.agent.agent.Agent` (which inherits it) that waits as a
    spare node, and steps down to one when its node was given to a spare meanwhile."""

    config: JobConfig
    chan: DealerChannel
    ranks: RankHands
    relay: LocalRelay | None
    spare: bool
    exit_code: int | None
    _own: RankSet | None
    _link: ManagerLinkState
    _welcomed: bool
    _demoted: bool
    _stop: threading.Event
    _exits: dict[int, tuple[Exited, bool]]
    _fail_over: Callable[[], None]
    _lead: Callable[[], None]
    hello: Callable[[], None]
    _leaving: PlannedStop | None  # a SIGTERM (Agent.leave)

    def _as_spare(self) -> bool:
        """Wait as a spare node until the manager gives this agent a lost node's place; then
        register as that node's agent (True: start its ranks). False when it must end
        instead (the job ended, SIGTERM, the manager gone): ``exit_code`` says how."""
        assert self._own is not None
        self._own.hold_warm()
        log.info("spare node: %d rank processes warming, waiting for a node", self._own.warm)
        self._link = ManagerLinkState(time.monotonic())  # a manager has 2 * silence_s to answer
        self._welcomed = False
        wait = SpareWait(
            self.config,
            self.chan,
            self._own,
            self._stop,
            lambda: self._leaving is not None,
            self._fail_over,
            self._spare_answered,
        )
        node = wait.run()
        if node is None:
            self.exit_code = wait.exit_code
            return False
        self.config = self.config.replace(node_rank=node)
        self._own.adopt(self.config)
        if self.relay is not None:
            self.relay.adopt(self.config)
        self.chan.sender = f"agent:{node}"
        self.spare = False
        self._lead()  # a lost leader's place: this agent leads its group now
        self._welcomed = False
        self.hello()
        return True

    def _spare_answered(self) -> None:
        """A manager answered this spare node: it is the active one (a standby answers
        nobody), so the link stays."""
        self._welcomed = True
        self._link.welcomed()

    def _step_down(self) -> None:
        """The manager said this node was taken by a spare node (this pod came back late): end
        the ranks started for it, and wait as a spare node instead."""
        self._demoted = False
        self.ranks.kill(list(self.ranks.pids()))  # never registered: nothing to report
        self._exits.clear()
        self._welcomed = False
        self.chan.sender = f"spare:{os.getpid()}"
        self.spare = True
        if self._as_spare():
            self.ranks.start_all(self.config.ranks_of(self.config.node_rank))
