"""The interface every recovery strategy implements, and how a strategy opens its round.

A strategy answers three questions, all pure functions of the job model:

* :meth:`RecoveryStrategy.feasible`: can it handle this incident (with the reason either way)?
* :meth:`RecoveryStrategy.launch`: which ranks and nodes its round replaces, repairs or leaves
  out, and what it tells the agents (kill and restart in place, reschedule a pod...);
* the phase points where strategies differ: what happens once the survivors stopped
  (:meth:`~RecoveryStrategy.after_stop`), how long replacements may take
  (:meth:`~RecoveryStrategy.replace_limit`) and whether being late ends the strategy for this
  incident (:attr:`~RecoveryStrategy.exhausted_when_late`).

Everything else (stop, rebuild, repair, resume, escalation) is shared. Adding a strategy means
one module that subclasses :class:`RecoveryStrategy`, registered in
:mod:`~ms_recover.manager.strategies.registry`.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

from ms_recover.config import JobConfig
from ms_recover.manager.actions import (
    Action,
    Emit,
    NextPhase,
    SendAgent,
    SendRanks,
    StartRound,
    Transition,
)
from ms_recover.manager.commands import rebuild
from ms_recover.manager.model import Fault, JobModel, Round
from ms_recover.observability.schema import DecisionRecord, FaultKind, JobState
from ms_recover.protocol.messages import KillRanks, StartRanks, Stop
from ms_recover.strategy import Strategy

#: The reason a round starts when a fault (not a failed phase) was detected.
FAULT_DETECTED = "fault detected"
#: Fault kinds a rank survives, alive: it reported the error itself, or only its state is
#: wrong (a replica whose digest differs). ``retry`` handles only these, and the fault path
#: does not mark such a rank lost.
SURVIVABLE = frozenset({FaultKind.WORKER_ERROR, FaultKind.DIVERGED})


@dataclasses.dataclass(frozen=True)
class Incident:
    """What a strategy sees when a round must start.

    ``hit`` holds the faulty ranks and the previous round's replacements; ``underway`` the
    replacements the previous round already started that are not faulty again (they are
    waited for, never killed while they start); ``fresh_nodes`` the nodes whose pod was
    recreated (their agent already started fresh ranks).

    ``widens``: the new faults are of ranks this incident had not hit, detected while its
    round ran; the new round widens it and, under the same strategy, uses up no try
    (:meth:`continues`). ``fresh`` holds the faulty ranks this incident restarts for the first
    time (each counts against its restart budget), ``over_budget`` those whose budget is used
    up, with their restart counts (see :mod:`~ms_recover.manager.budget`).
    """

    faults: tuple[Fault, ...]
    hit: frozenset[int]
    lost_nodes: frozenset[int]
    underway: frozenset[int] = frozenset()
    fresh_nodes: frozenset[int] = frozenset()
    prev: Round | None = None
    widens: bool = False
    fresh: frozenset[int] = frozenset()
    over_budget: tuple[tuple[int, int], ...] = ()

    def continues(self, name: Strategy) -> bool:
        """Whether a round of ``name`` goes on with the current try (no try is used up)."""
        return self.widens and self.prev is not None and self.prev.strategy is name


@dataclasses.dataclass(frozen=True)
class Launch:
    """How a strategy's round starts: the rank sets of the round, and the agents' orders
    (sent after the survivors' Stop)."""

    replace: frozenset[int] = frozenset()
    nodes: frozenset[int] = frozenset()
    untrusted: frozenset[int] = frozenset()
    left_out: frozenset[int] = frozenset()
    orders: tuple[Action, ...] = ()


class RecoveryStrategy(abc.ABC):
    """One strategy of the ``recover-strategy`` list."""

    name: ClassVar[Strategy]
    #: Whether ``max_tries`` bounds it (every strategy but ``exit``).
    bounded: ClassVar[bool] = True
    #: Whether replacements that are late (``replace_limit``) end it for this incident.
    exhausted_when_late: ClassVar[bool] = False
    #: Whether its round restarts the faulty ranks (the restart budget bounds it).
    restarts: ClassVar[bool] = False

    def never_applies(self, cfg: JobConfig) -> str | None:
        """Why this strategy can never apply to this job (reported at start), or None."""
        if cfg.world_size < 2:
            return f"{self.name.value}: a one-rank job has no replica to repair from"
        return None

    @abc.abstractmethod
    def feasible(self, m: JobModel, incident: Incident) -> tuple[bool, str]:
        """Whether it can handle ``incident`` now, with the reason either way."""

    @abc.abstractmethod
    def launch(self, m: JobModel, incident: Incident, reason: str) -> Launch:
        """The rank sets and agent orders of its round (called only when feasible)."""

    def start(
        self, m: JobModel, now: float, incident: Incident, why: str, reason: str
    ) -> list[Action]:
        """Start its round for ``incident`` (``why``: what triggered it)."""
        if why != FAULT_DETECTED:
            reason = f"{why}; {reason}"
        return open_round(m, now, self, incident, reason)

    def after_stop(self, m: JobModel, now: float, survivors: list[int]) -> list[Action]:
        """Survivors stopped and replacements registered: by default, rebuild everyone."""
        rnd = m.round
        assert rnd is not None
        reason = f"survivors stopped, ranks {sorted(rnd.replace_ranks)} replaced"
        return [*rebuild(m), NextPhase(reason, now), Transition(reason, JobState.REBUILDING)]

    def replace_limit(self, cfg: JobConfig) -> float:
        """How long replacements may take to register."""
        return cfg.phase_timeout_s


def open_round(
    m: JobModel, now: float, strategy: RecoveryStrategy, incident: Incident, reason: str
) -> list[Action]:
    """A new epoch under ``strategy``: record the decision, stop the survivors, give the
    agents their orders, and wait in STOPPING."""
    launch = strategy.launch(m, incident, reason)
    prev, faults = incident.prev, list(incident.faults)
    first = faults[0] if faults else Fault(FaultKind.ESCALATION, -1, -1, reason, now, 0.0)
    peak = max(i.committed_step for i in m.ranks.values())
    rnd = Round(
        epoch=m.epoch + 1,
        strategy=strategy.name,
        faults=faults,
        replace_ranks=launch.replace,
        reschedule_nodes=launch.nodes,
        started=now,
        incident_start=prev.incident_start if prev else first.ts - first.detect_s,
        detect_s=prev.detect_s if prev else first.detect_s,
        peak_step=max(prev.peak_step, peak) if prev else peak,
        phase_start=now,
        untrusted=launch.untrusted,
        left_out=launch.left_out,
        world=m.active - launch.left_out,
        stop_reason=reason,
    )
    out = launch.replace | launch.left_out
    survivors = tuple(r for r in sorted(m.ranks) if r not in out and m.ranks[r].alive)
    decision = DecisionRecord(
        strategy.name.value, reason, sorted(launch.replace), sorted(launch.nodes)
    )
    restarted = (launch.replace | launch.left_out) & incident.fresh
    start = StartRound(
        reason,
        rnd,
        uses_try=not incident.continues(strategy.name),
        restarts=restarted if strategy.restarts else frozenset(),
    )
    return [
        Emit(reason, decision),
        start,
        SendRanks("stop survivors", survivors, Stop(reason)),
        *launch.orders,
        Transition(reason, JobState.STOPPING),
    ]


def planned_nodes(incident: Incident) -> frozenset[int]:
    """The incident's nodes that are leaving on purpose (a planned stop: SIGTERM to the
    agent), whose pod is going away and will be recreated."""
    return frozenset(f.node_rank for f in incident.faults if f.kind is FaultKind.PLANNED_STOP)


def untrusted_of(incident: Incident) -> frozenset[int]:
    """The incident's ranks whose state cannot be trusted (a device memory error, a diverged
    replica): alive, but never a repair source; a round that keeps them repairs them too."""
    return frozenset(f.rank for f in incident.faults if f.corrupt and f.rank >= 0)


def no_source(m: JobModel, incident: Incident, out: frozenset[int] | set[int]) -> str | None:
    """Why a repairing strategy is infeasible: some shard has no replica left to copy from once
    the ranks ``out`` (replaced, or left out of the world), the untrusted ranks and the ranks
    that finished and left are set aside ("no healthy replica left for shard N"), or a rank
    that left would have to be rebuilt; None if every shard keeps one."""
    gone = finished_and_gone(m)
    orphan = orphan_shard(m, set(out) | untrusted_of(incident) | gone)
    if orphan is not None:
        return orphan + (f"; ranks {sorted(gone)} finished training and left" if gone else "")
    stay = sorted(gone - set(out))
    if stay:
        return (
            f"ranks {stay} finished training and left, so the world cannot be rebuilt "
            "(a finished rank stays a member only while it waits in session.finish())"
        )
    return None


def finished_and_gone(m: JobModel) -> set[int]:
    """Ranks that finished training and whose process is gone (no longer a replica)."""
    return {r for r, i in m.ranks.items() if i.done and not i.alive}


def orphan_shard(m: JobModel, unusable: set[int]) -> str | None:
    """A reason if some shard has no usable replica left (only once training has begun)."""
    if all(i.committed_step < 0 for i in m.ranks.values()):
        return None
    # Only a shard with an unusable rank can be orphaned; the lowest such shard is reported.
    hit = {m.ranks[r].shard for r in unusable if r in m.ranks}
    healthy = {i.shard for r, i in m.ranks.items() if i.shard in hit and r not in unusable}
    for shard in sorted(hit - healthy):
        members = [r for r, i in m.ranks.items() if i.shard == shard]
        return f"no healthy replica left for shard {shard} (ranks {members})"
    return None


def dead_ranks(m: JobModel) -> set[int]:
    return {r for r, i in m.ranks.items() if not i.alive}


def restart_in_place(
    cfg: JobConfig, ranks: set[int], skip_nodes: frozenset[int], reason: str
) -> tuple[Action, ...]:
    """Orders for the agents: kill what is left of ``ranks``, then start them again (agents
    carry the two out in order). Nodes in ``skip_nodes`` already start fresh ranks."""
    orders: list[Action] = []
    for node in sorted({cfg.node_of(r) for r in ranks} - skip_nodes):
        local = sorted(r for r in ranks if cfg.node_of(r) == node)
        orders.append(SendAgent("kill leftovers", node, KillRanks(local, reason)))
        orders.append(SendAgent("restart in place", node, StartRanks(local, reason)))
    return tuple(orders)
