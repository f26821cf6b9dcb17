"""The manager's executor: the one place that applies ``decide``'s actions to the job.

It changes the job model, sends messages, and writes events (phases, recoveries, the dump
manifest). :class:`~ms_recover.manager.server.ManagerServer` mixes it in.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from ms_recover import exitcodes
from ms_recover.config import JobConfig
from ms_recover.dumpfiles import DumpFile, write_manifest
from ms_recover.events import EventLog
from ms_recover.manager import actions as A
from ms_recover.manager.model import JobModel, JobState
from ms_recover.protocol import messages as M

log = logging.getLogger("ms_recover.manager")

PHASES = ("detect", "stop", "replace", "rebuild", "repair", "resume")


class Executor:
    """Applies actions; the server provides the model, the config, events and ``_send_to``."""

    model: JobModel
    config: JobConfig
    events: EventLog
    clock: Callable[[], float]
    _agent_ids: dict[int, bytes]

    def _send_to(self, identities: list[bytes], msg: M.Message) -> None:
        raise NotImplementedError

    def execute(self, actions: list[A.Action]) -> None:
        """Apply ``decide``'s actions, in order. The only place that changes the job state."""
        for action in actions:
            self._log_action(action)
            self._apply(action)

    def _apply(self, action: A.Action) -> None:
        m = self.model
        if isinstance(action, A.SendRanks):
            idents = [m.ranks[r].identity for r in action.ranks if m.ranks[r].identity]
            self._send_to(idents, action.msg)
        elif isinstance(action, A.SendAgent):
            ident = self._agent_ids.get(action.node_rank)
            if ident is not None:
                self._send_to([ident], action.msg)
            if isinstance(action.msg, M.AgentExit):
                m.agents[action.node_rank].alive = False  # it is on its way out
        elif isinstance(action, A.MarkLost):
            self._mark_lost(action)
        elif isinstance(action, A.StartRound):
            self._start_round(action)
        elif isinstance(action, A.UpdateRound):
            assert m.round is not None
            m.round = dataclasses.replace(m.round, **action.changes)
        elif isinstance(action, A.Transition):
            m.transition(action.to)
            if action.to is JobState.EXITING and m.exit_code is None:
                m.exit_code = exitcodes.JOB_EXIT
        elif isinstance(action, A.FinishRound):
            self._finish_round(action.ok, action.reason)
        elif isinstance(action, A.SetActive):
            m.active = action.ranks
            self.events.write("world", epoch=m.epoch, active=sorted(action.ranks))
        elif isinstance(action, A.Exhaust):
            m.tries[action.strategy] = self.config.max_tries
        elif isinstance(action, A.WriteManifest):
            self._write_manifest()
        elif isinstance(action, A.Emit):
            self.events.write(action.event, epoch=m.epoch, state=m.state.value, **action.fields)
            if action.event == "job_end":
                m.exit_code = int(action.fields["exit_code"])

    def _write_manifest(self) -> None:
        m = self.model
        assert m.round is not None
        files = [DumpFile.from_dict(m.ranks[r].dump or {}) for r in m.round.dump_ranks]
        shards = {r: i.shard for r, i in m.ranks.items()}
        path = write_manifest(
            self.config.effective_dump_dir(),
            self.config.job_id,
            m.round.target_step,
            self.config.world_size,
            files,
            shards,
        )
        self.events.write(
            "dump",
            epoch=m.epoch,
            step=m.round.target_step,
            manifest=path,
            files=[f.file for f in files],
        )

    def _mark_lost(self, action: A.MarkLost) -> None:
        m = self.model
        if action.fault in m.pending:
            m.pending.remove(action.fault)
        for rank in action.ranks:
            m.ranks[rank].alive = False
            m.ranks[rank].identity = b""
        if action.agent:
            m.agents[action.fault.node_rank].alive = False

    def _start_round(self, action: A.StartRound) -> None:
        m, rnd = self.model, action.round
        m.round, m.epoch = rnd, rnd.epoch
        m.pending.clear()
        if rnd.strategy is not None:
            m.tries[rnd.strategy.value] = m.tries.get(rnd.strategy.value, 0) + 1
        for rank in rnd.replace_ranks:
            info = m.ranks[rank]
            info.alive, info.identity, info.committed_step, info.done = False, b"", -1, False
        for info in m.ranks.values():
            info.repair_failure, info.dump = None, None

    def _finish_round(self, ok: bool, reason: str) -> None:
        m, now = self.model, self.clock()
        rnd = m.round
        assert rnd is not None
        phases = {
            "detect": rnd.detect_s,
            "stop": (rnd.stop_done or now) - rnd.started if rnd.strategy else 0.0,
            "replace": (rnd.replace_done or now) - rnd.started if rnd.strategy else 0.0,
            **rnd.phases,
        }
        phases = {p: round(phases.get(p, 0.0), 4) for p in PHASES}
        if rnd.strategy is None:
            if ok:
                self.events.write("job_start", epoch=m.epoch, phases=phases)
            return
        record = {
            "ok": ok,
            "strategy": rnd.strategy.value,
            "reason": reason,
            "mttr_s": round(now - rnd.incident_start, 4),
            "phases": phases,
            "target_step": rnd.target_step,
            "lost_steps": max(0, rnd.peak_step - rnd.target_step) if ok else None,
            "faults": [f.detail for f in rnd.faults],
            "replaced": sorted(rnd.replace_ranks),
        }
        for phase in PHASES:
            self.events.write("phase", epoch=m.epoch, phase=phase, duration_s=phases[phase])
        m.last_recovery = self.events.write("recovery", epoch=m.epoch, **record)
        if ok:
            m.recoveries += 1
            m.tries.clear()

    def _log_action(self, action: A.Action) -> None:
        if isinstance(action, (A.SendRanks, A.SendAgent)) and log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%s epoch=%d state=%s %s",
                type(action).__name__,
                self.model.epoch,
                self.model.state.value,
                action.reason,
            )
        elif not isinstance(action, (A.SendRanks, A.SendAgent, A.UpdateRound)):
            rank = getattr(getattr(action, "fault", None), "rank", "-")
            log.info(
                "%s epoch=%d rank=%s state=%s reason=%s",
                type(action).__name__,
                self.model.epoch,
                rank,
                self.model.state.value,
                action.reason,
            )
