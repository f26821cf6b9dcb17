"""The manager's role among the job's managers, as the server lives it: active or standby, a
SIGTERM's handover, a takeover and standing down (docs/manager-takeover.md).

A part of :class:`~ms_recover.manager.server.ManagerServer` (which inherits it), kept apart by
concept. The rules are pure functions in :mod:`~ms_recover.manager.takeover` (``on_sigterm``);
the standby's watch of the active manager is there too. These methods apply them to this
server: its model (``JobModel.manager``, ``stop_asked``, a takeover's node fault), its loop
(``_stop``) and its events.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ms_recover.config import JobConfig
from ms_recover.manager.model import Fault, JobModel, Restore
from ms_recover.manager.takeover import OnSigterm, on_sigterm
from ms_recover.observability.events import EventLog
from ms_recover.observability.schema import (
    FaultKind,
    JobState,
    ManagerTakeoverRecord,
    StandDownRecord,
    TakeoverRecord,
)

log = logging.getLogger("ms_recover.manager")


class RoleSide:
    """Active or standby, handing over, taking over (see the module docstring). The
    attributes are the server's (:class:`~ms_recover.manager.server.ManagerServer` sets
    them)."""

    config: JobConfig
    model: JobModel
    clock: Callable[[], float]
    events: EventLog
    standby: bool
    handing_over: str
    standbys: int
    successor_answering: Callable[[], bool]
    _lock: threading.Lock
    _stop: threading.Event
    _sigterm: str | None
    _forced_exit: int | None
    _coordinating: tuple[int, float] | None

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
