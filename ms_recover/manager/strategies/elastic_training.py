"""``elastic-training``: training goes on without the faulty ranks (pure data parallelism, the
global batch kept), while their agents are asked for replacements; when those register, the
job stops once more and grows back (:func:`grow`).
"""

from __future__ import annotations

from ms_recover import exitcodes
from ms_recover.config import JobConfig
from ms_recover.manager.actions import (
    Action,
    Emit,
    MarkLost,
    NextPhase,
    SendAgent,
    SendRanks,
    SetActive,
    StartRound,
    Transition,
)
from ms_recover.manager.commands import rebuild
from ms_recover.manager.model import JobModel, Round
from ms_recover.manager.strategies.base import (
    Incident,
    Launch,
    RecoveryStrategy,
    dead_ranks,
    planned_nodes,
    restart_in_place,
    untrusted_of,
)
from ms_recover.observability.schema import DecisionRecord, FaultKind, JobState
from ms_recover.protocol.messages import AgentExit, Stop
from ms_recover.strategy import Strategy


class ElasticTraining(RecoveryStrategy):
    name = Strategy.ELASTIC_TRAINING
    restarts = True

    def never_applies(self, cfg: JobConfig) -> str | None:
        if cfg.world_size < 2:
            return "elastic-training: a one-rank job has no data-parallel rank to drop"
        return None

    def feasible(self, m: JobModel, incident: Incident) -> tuple[bool, str]:
        if len({i.shard for i in m.ranks.values()}) > 1:
            return False, "needs pure data parallelism (every rank a replica of the others)"
        out = incident.hit | untrusted_of(incident)
        left = sorted(r for r in m.active if r not in out and m.ranks[r].alive)
        if not left:
            return False, "no healthy rank left to continue with"
        return True, f"continue with ranks {left} (global batch kept) until replacements return"

    def launch(self, m: JobModel, incident: Incident, reason: str) -> Launch:
        # Goes on without waiting, but still asks for replacements: in place, or for a node
        # that is leaving (a planned stop) a recreated pod.
        cfg, leaving = m.config, planned_nodes(incident)
        wanted = {
            r
            for r in incident.hit
            if m.agents[cfg.node_of(r)].alive and cfg.node_of(r) not in leaving
        }
        orders = restart_in_place(cfg, wanted - incident.underway, incident.fresh_nodes, reason)
        for f in incident.faults:  # its ranks go with it: no longer alive from now on
            if f.kind is FaultKind.PLANNED_STOP and m.agents[f.node_rank].alive:
                away = AgentExit(exitcodes.RESCHEDULE, reason)
                orders += (
                    MarkLost("node leaving", f, cfg.ranks_of(f.node_rank), False),
                    SendAgent("reschedule pod", f.node_rank, away),
                )
        left_out = frozenset(incident.hit | dead_ranks(m))
        untrusted = untrusted_of(incident) - left_out  # kept in the world, repaired first
        return Launch(left_out=left_out, untrusted=untrusted, orders=orders)

    def after_stop(self, m: JobModel, now: float, survivors: list[int]) -> list[Action]:
        rnd = m.round
        assert rnd is not None
        reason = f"elastic-training: data-parallel world is now ranks {sorted(rnd.world)}"
        return [
            SetActive(reason, rnd.world),
            *rebuild(m, rnd.world),
            NextPhase(reason, now),
            Transition(reason, JobState.REBUILDING),
        ]


def grow(m: JobModel, now: float, joiners: frozenset[int]) -> list[Action]:
    """Replacements registered: stop, rebuild with them, repair, resume."""
    world = m.active | joiners
    reason = f"elastic-training: ranks {sorted(joiners)} are back; grow to ranks {sorted(world)}"
    rnd = Round(
        epoch=m.epoch + 1,
        strategy=Strategy.ELASTIC_TRAINING,
        started=now,
        incident_start=now,
        peak_step=max(i.committed_step for i in m.ranks.values()),
        phase_start=now,
        left_out=frozenset(dead_ranks(m)),
        world=world,
        stop_reason=reason,
    )
    return [
        Emit(reason, DecisionRecord(Strategy.ELASTIC_TRAINING.value, reason, [], [])),
        StartRound(reason, rnd),
        SendRanks("stop to grow", tuple(sorted(world)), Stop(reason)),
        Transition(reason, JobState.STOPPING),
    ]
