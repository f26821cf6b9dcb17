"""How a node agent's ranks end and how the agent itself ends: each rank's exit reported to the
manager (``RankExited``, and ``RankFrozen`` for a rank stopped by a signal), a planned stop's
deadline (SIGTERM: the pod deleted or drained, :mod:`~ms_recover.agent.leaving`), and the
drain at the job's end. A part of :class:`~ms_recover.agent.agent.Agent` (which inherits it)."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable

from ms_recover.agent.frozen import FreezeWatch
from ms_recover.agent.hands import Exited, RankHands
from ms_recover.agent.leaving import LEFT_AT_DEADLINE, PlannedStop
from ms_recover.config import JobConfig
from ms_recover.protocol import messages as M
from ms_recover.protocol.transport import DealerChannel

log = logging.getLogger("ms_recover.agent")


class RankEnds:
    """Rank exits and stops reported, the node's own end (see the module docstring). The
    attributes are the agent's (:class:`~ms_recover.agent.agent.Agent` sets them)."""

    config: JobConfig
    chan: DealerChannel
    ranks: RankHands
    exit_code: int | None
    _epoch: int
    _welcomed: bool
    _exits: dict[int, tuple[Exited, bool]]
    _drain: tuple[float, int] | None
    _leaving: PlannedStop | None
    _frozen: FreezeWatch
    _wait: Callable[[float], None]

    def _planned_stop(self, leaving: PlannedStop) -> bool:
        """SIGTERM came: announce the node's leaving once; at the deadline kill the ranks and
        end (True). Until then the ranks run on, and the manager decides."""
        now = time.monotonic()
        if leaving.deadline is None:
            if not self._welcomed:  # a welcome already here counts: read it before deciding
                self._wait(0)
            how = leaving.begin(self.config.termination_grace_s, self._welcomed, now)
            node = self.config.node_rank
            log.warning(
                "%s: node %d is leaving (pod deletion or drain), %s", leaving.reason, node, how
            )
            self.chan.send(leaving.message(node, now), self._epoch)
        if not leaving.due(now):
            return False
        log.warning(
            "node %d: planned-stop deadline reached before the manager released it: killing "
            "ranks %s",
            self.config.node_rank,
            self.ranks.pids(),
        )
        self._report(self.ranks.kill(list(self.ranks.pids())), requested=True)
        self.exit_code = LEFT_AT_DEADLINE
        return True

    def _drained(self) -> None:
        """At the job's end: exit once every rank left on its own, or kill the rest at the
        deadline (their exits are reported as they are); a leaving node's deadline first."""
        assert self._drain is not None
        deadline, code = self._drain
        if self._leaving is not None and self._leaving.deadline is not None:
            deadline = min(deadline, self._leaving.deadline)
        if self.ranks.pids() and time.monotonic() < deadline:
            return
        if self.ranks.pids():
            log.warning("ranks %s still running at the end of the job: killing", self.ranks.pids())
            self._report(self.ranks.kill(list(self.ranks.pids())), requested=True)
        self.exit_code = code

    def _all_done(self) -> bool:
        """Every local rank's latest process exited cleanly and none is running."""
        mine = self.config.ranks_of(self.config.node_rank)
        return not self.ranks.pids() and all(
            r in self._exits and self._exits[r][0].exit_code == 0 and not self._exits[r][0].signal
            for r in mine
        )

    def _report(self, exited: list[Exited], requested: bool = False) -> None:
        """Report exits; ``requested``: this agent ended them on the manager's command."""
        for e in exited:
            log.info("rank %d exited code=%d signal=%d", e.rank, e.exit_code, e.signal)
            self._exits[e.rank] = (e, requested)
            self._send_exit(e, requested)

    def _report_frozen(self) -> None:
        """Tell the manager of each rank stopped by a signal for ``frozen_s`` (once a stop)."""
        for rank, pid, stopped_s in self._frozen.sample(self.ranks.pids(), time.monotonic()):
            log.warning("rank %d (pid %d) stopped by a signal for %.2fs", rank, pid, stopped_s)
            node = self.config.node_rank
            frozen = M.RankFrozen(node, rank, pid, round(stopped_s, 3), socket.gethostname())
            self.chan.send(frozen, self._epoch)

    def _send_exit(self, e: Exited, requested: bool) -> None:
        self.chan.send(
            M.RankExited(
                self.config.node_rank,
                e.rank,
                e.pid,
                e.exit_code,
                e.signal,
                e.observed_at,
                requested,
                e.host,
                e.log_tail,
            ),
            self._epoch,
        )
