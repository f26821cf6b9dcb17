"""The executor: the one place that applies ``decide``'s actions to the job.

It is built from the job model, the event log, the clock and a :class:`Sender`, and has one
small handler per action type: it changes the model, sends messages, and writes events
(phases, recoveries, the dump manifest). The server composes it with its ROUTER as the
sender; the tests compose it with a fake sender and no socket.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ms_recover import exitcodes
from ms_recover.dumpfiles import DumpFile, write_manifest
from ms_recover.manager import actions as A
from ms_recover.manager import budget
from ms_recover.manager.model import JobModel
from ms_recover.observability.events import EventLog
from ms_recover.observability.goodput import GoodputLedger
from ms_recover.observability.schema import (
    PHASES,
    DumpRecord,
    FlaggedRecord,
    JobEndRecord,
    JobStartRecord,
    JobState,
    Phase,
    PhaseRecord,
    RecoveryRecord,
    SparePromotedRecord,
    SpareRecord,
    WorldRecord,
)
from ms_recover.protocol.messages import AgentExit, Exit, Message, SpareAssign, StartRanks

log = logging.getLogger("ms_recover.manager")

__all__ = ["PHASES", "Executor", "Sender"]


class Sender(Protocol):
    """Sends one message to each of the given peer identities (ROUTER identities)."""

    def send(self, identities: Sequence[bytes], msg: Message) -> None: ...


class Executor:
    """Applies actions to ``model``. ``agent_ids`` maps a node to its agent's identity (the
    server fills it in as agents register)."""

    def __init__(
        self,
        model: JobModel,
        events: EventLog,
        clock: Callable[[], float],
        sender: Sender,
        agent_ids: dict[int, bytes] | None = None,
    ) -> None:
        self.model = model
        self.config = model.config
        self.events = events
        self.clock = clock
        self.sender = sender
        self.agent_ids: dict[int, bytes] = {} if agent_ids is None else agent_ids
        self.goodput = GoodputLedger()
        events.subscribe(self.goodput.on_event)
        self._handlers: dict[type[A.Action], Callable[[Any], None]] = {
            A.SendRanks: self._send_ranks,
            A.SendAgent: self._send_agent,
            A.MarkLost: self._mark_lost,
            A.StartRound: self._start_round,
            A.StopDone: self._stop_done,
            A.StopAgain: self._stop_again,
            A.ReplaceDone: self._replace_done,
            A.NextPhase: self._next_phase,
            A.Distrust: self._distrust,
            A.SetTarget: self._set_target,
            A.RetryRepair: self._retry_repair,
            A.ChooseWriters: self._choose_writers,
            A.Transition: self._transition,
            A.FinishRound: self._finish_round,
            A.SetActive: self._set_active,
            A.Exhaust: self._exhaust,
            A.WriteManifest: self._write_manifest,
            A.Emit: self._emit,
            A.Judged: self._judged,
            A.SubHealthStep: self._sub_health_step,
            A.PromoteSpare: self._promote_spare,
            A.ReleaseSpare: self._release_spare,
        }

    def execute(self, actions: list[A.Action]) -> None:
        """Apply ``decide``'s actions, in order. The only place that changes the job state."""
        for action in actions:
            self._log_action(action)
            self._handlers[type(action)](action)

    def exit_code(self) -> int:
        """The job's exit code so far (0 once finished)."""
        m = self.model
        if m.state is JobState.FINISHED:
            return exitcodes.OK
        return m.exit_code if m.exit_code is not None else exitcodes.FAILED

    # ------------------------------------------------------------------ messages
    def _send_ranks(self, action: A.SendRanks) -> None:
        ranks = self.model.ranks
        idents = [ranks[r].identity for r in action.ranks if ranks[r].identity]
        self.sender.send(idents, action.msg)
        if isinstance(action.msg, Exit):
            for r in action.ranks:
                ranks[r].released = True

    def _send_agent(self, action: A.SendAgent) -> None:
        ident = self.agent_ids.get(action.node_rank)
        if ident is not None:
            self.sender.send([ident], action.msg)
        if isinstance(action.msg, AgentExit):
            agent = self.model.agents[action.node_rank]
            agent.alive = False  # it is on its way out
            agent.released = action.msg.code != exitcodes.RESCHEDULE  # for good
        elif isinstance(action.msg, StartRanks) and ident is not None:
            for rank in action.msg.ranks:  # a new process: its exit is yet to be reported
                self.model.ranks[rank].exit_code = None

    # ------------------------------------------------------------------ members and rounds
    def _mark_lost(self, action: A.MarkLost) -> None:
        m = self.model
        if action.fault in m.pending:
            m.pending.remove(action.fault)
        for rank in action.ranks:
            m.ranks[rank].alive = False
            m.ranks[rank].identity = b""
            m.early_exits.pop(rank, None)  # its early exit is this fault (or part of it)
        if action.agent:
            m.agents[action.fault.node_rank].alive = False

    def _start_round(self, action: A.StartRound) -> None:
        m, rnd = self.model, action.round
        m.round, m.epoch = rnd, rnd.epoch
        m.pending.clear()
        if rnd.strategy is not None and action.uses_try:
            m.tries[rnd.strategy.value] = m.tries.get(rnd.strategy.value, 0) + 1
        budget.record(m, action.restarts, rnd.started)
        for rank in rnd.replace_ranks:
            info = m.ranks[rank]
            info.alive, info.identity, info.committed_step, info.done = False, b"", -1, False
            m.early_exits.pop(rank, None)  # replaced anyway: its exit is no fault of its own
        for info in m.ranks.values():
            info.repair_failure, info.dump = None, None

    def _update(self, **changes: Any) -> None:
        assert self.model.round is not None, "a round update needs a round"
        self.model.round = dataclasses.replace(self.model.round, **changes)

    def _stop_done(self, action: A.StopDone) -> None:
        self._update(stop_done=action.at)

    def _stop_again(self, action: A.StopAgain) -> None:
        self._update(stop_again=action.at)

    def _replace_done(self, action: A.ReplaceDone) -> None:
        self._update(replace_done=action.at)

    def _next_phase(self, action: A.NextPhase) -> None:
        rnd = self.model.round
        assert rnd is not None
        phases = dict(rnd.phases)
        if action.done is not None:
            phases[action.done] = action.at - rnd.phase_start
        self._update(phases=phases, phase_start=action.at)

    def _distrust(self, action: A.Distrust) -> None:
        rnd = self.model.round
        assert rnd is not None
        self._update(untrusted=rnd.untrusted | action.ranks)

    def _set_target(self, action: A.SetTarget) -> None:
        self._update(target_step=action.step, repair_attempt=0)

    def _retry_repair(self, action: A.RetryRepair) -> None:
        self._update(repair_attempt=action.attempt, bad_sources=action.bad_sources)

    def _choose_writers(self, action: A.ChooseWriters) -> None:
        self._update(dump_ranks=action.ranks, target_step=action.step, phase_start=action.at)

    # ------------------------------------------------------------------ the job
    def _transition(self, action: A.Transition) -> None:
        m = self.model
        m.transition(action.to)
        if action.to is JobState.EXITING and m.exit_code is None:
            m.exit_code = exitcodes.JOB_EXIT

    def _set_active(self, action: A.SetActive) -> None:
        self.model.active = action.ranks
        self._write(WorldRecord(sorted(action.ranks)))

    def _exhaust(self, action: A.Exhaust) -> None:
        self.model.tries[action.strategy.value] = self.config.max_tries

    def _emit(self, action: A.Emit) -> None:
        m = self.model
        e = self.events.write(action.record, epoch=m.epoch, state=m.state.value)
        if isinstance(action.record, JobEndRecord):
            m.exit_code = action.record.exit_code
            self.events.write(self.goodput.record(e["ts"]), epoch=m.epoch)
        if isinstance(action.record, FlaggedRecord):
            m.flagged[action.record.rank] = action.record.step

    def _judged(self, action: A.Judged) -> None:
        self.model.judged_rev = action.rev

    def _sub_health_step(self, action: A.SubHealthStep) -> None:
        m = self.model
        m.settled_nodes.add(action.node)
        if action.switching is None:
            m.switching.pop(action.node, None)
            m.backups.pop(action.node, None)
        else:
            m.switching[action.node] = action.switching

    # ------------------------------------------------------------------ spare nodes
    def _promote_spare(self, action: A.PromoteSpare) -> None:
        m = self.model
        spare = m.spares.pop(action.identity)
        self.sender.send([action.identity], SpareAssign(action.node, action.reason))
        m.promoted[action.node] = (action.identity, self.clock())
        record = SparePromotedRecord(
            action.node, spare.pid, spare.pod_ip, round(action.waited_s, 3), len(m.spares)
        )
        self.events.write(record, epoch=m.epoch, state=m.state.value)

    def _release_spare(self, action: A.ReleaseSpare) -> None:
        spare = self.model.spares.pop(action.identity, None)
        if spare is None:
            return
        if action.code is not None:
            self.sender.send([action.identity], AgentExit(action.code, action.reason))
        self._write(SpareRecord(spare.pid, spare.pod_ip, True, action.reason))

    def _write(
        self, record: PhaseRecord | WorldRecord | DumpRecord | JobStartRecord | SpareRecord
    ) -> None:
        self.events.write(record, epoch=self.model.epoch)

    def _write_manifest(self, action: A.WriteManifest) -> None:
        m, cfg = self.model, self.config
        assert m.round is not None
        files = [DumpFile.from_dict(m.ranks[r].dump or {}) for r in m.round.dump_ranks]
        shards = {r: i.shard for r, i in m.ranks.items()}
        step = m.round.target_step
        where = cfg.effective_dump_dir()
        path = write_manifest(where, cfg.job_id, step, cfg.world_size, files, shards)
        self._write(DumpRecord(step, path, [f.file for f in files]))

    def _finish_round(self, action: A.FinishRound) -> None:
        m, now = self.model, self.clock()
        rnd = m.round
        assert rnd is not None
        measured = {
            Phase.DETECT: rnd.detect_s,
            Phase.STOP: (rnd.stop_done or now) - rnd.started if rnd.strategy else 0.0,
            Phase.REPLACE: (rnd.replace_done or now) - rnd.started if rnd.strategy else 0.0,
            **rnd.phases,
        }
        phases = {p.value: round(measured.get(p, 0.0), 4) for p in Phase}
        if rnd.strategy is None:
            if action.ok:
                self._write(JobStartRecord(phases))
            return
        record = RecoveryRecord(
            ok=action.ok,
            strategy=rnd.strategy.value,
            reason=action.reason,
            mttr_s=round(now - rnd.incident_start, 4),
            phases=phases,
            target_step=rnd.target_step,
            lost_steps=max(0, rnd.peak_step - rnd.target_step) if action.ok else None,
            faults=[f.detail for f in rnd.faults],
            replaced=sorted(rnd.replace_ranks),
        )
        for phase in PHASES:
            self._write(PhaseRecord(phase, phases[phase]))
        m.last_recovery = self.events.write(record, epoch=m.epoch)
        if action.ok:
            m.recoveries += 1
            m.tries.clear()

    def _log_action(self, action: A.Action) -> None:
        quiet = (A.SendRanks, A.SendAgent, A.Judged)
        if isinstance(action, quiet) and log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%s epoch=%d state=%s %s",
                type(action).__name__,
                self.model.epoch,
                self.model.state.value,
                action.reason,
            )
        elif not isinstance(action, quiet + _ROUND_UPDATES):
            rank = getattr(getattr(action, "fault", None), "rank", "-")
            log.info(
                "%s epoch=%d rank=%s state=%s reason=%s",
                type(action).__name__,
                self.model.epoch,
                rank,
                self.model.state.value,
                action.reason,
            )


#: Round bookkeeping, not worth a log line each (as the one UpdateRound was not).
_ROUND_UPDATES = (
    A.StopDone,
    A.ReplaceDone,
    A.NextPhase,
    A.SetTarget,
    A.RetryRepair,
    A.ChooseWriters,
)
