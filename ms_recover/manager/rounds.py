"""The fault path: faults (new ones, or a failed phase) start a new epoch under the first
feasible strategy of the job's list, or end the job.

Pure functions of the job model and the clock, returning actions (see ``decide``). A failed
phase reaches this path only through :func:`escalate`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ms_recover import exitcodes
from ms_recover.manager import budget
from ms_recover.manager.actions import Action, Emit, Exhaust, MarkLost
from ms_recover.manager.commands import exit_job
from ms_recover.manager.model import Fault, JobModel, Round
from ms_recover.manager.strategies.base import FAULT_DETECTED, SURVIVABLE, Incident
from ms_recover.manager.strategies.registry import choose
from ms_recover.observability.schema import FaultKind, FaultRecord
from ms_recover.strategy import Strategy

#: Faults a rank reported itself: it is still alive (and reachable).
#: (Those ``retry`` can handle, and a fatal error: MindSpore's RS_UNKNOWN.) A planned stop's
#: ranks are alive too, until the round sends their agent away.
REPORTED = SURVIVABLE | {FaultKind.WORKER_FATAL, FaultKind.PLANNED_STOP}


@dataclasses.dataclass(frozen=True)
class Failure:
    """A recovery phase failed: why, the ranks to blame (they are replaced), the strategy it
    ends for this incident (if any), the actions to apply before the new round, and faults
    the phase found (replicas that diverged with no majority) to decide on with the culprits."""

    why: str
    culprits: tuple[int, ...] = ()
    exhausted: Strategy | None = None
    first: tuple[Action, ...] = ()
    faults: tuple[Fault, ...] = ()


def on_faults(
    m: JobModel,
    faults: list[Fault],
    now: float,
    why: str = FAULT_DETECTED,
    exhausted: Strategy | None = None,
) -> list[Action]:
    """Mark the faults, then start a new round with the first feasible strategy, or exit."""
    actions: list[Action] = []
    hit: set[int] = set()
    for f in faults:
        ranks = _ranks_of(m, f)
        hit.update(ranks)
        actions += _mark(m, f, ranks)
    prev = m.round if m.in_recovery else None
    underway = _underway(m, prev, hit)
    all_faults = (prev.faults if prev else []) + faults
    lost_nodes = {f.node_rank for f in all_faults if f.kind is FaultKind.NODE_LOST}
    new, before = frozenset(hit), _incident_ranks(m, prev)
    if prev is not None:
        hit |= prev.replace_ranks
        lost_nodes |= {n for n in prev.reschedule_nodes if not m.agents[n].alive}
    incident = Incident(
        faults=tuple(all_faults),
        hit=frozenset(hit),
        lost_nodes=frozenset(lost_nodes),
        underway=frozenset(underway),
        fresh_nodes=frozenset(
            f.node_rank for f in all_faults if f.kind is FaultKind.NODE_RESTARTED
        ),
        prev=prev,
        # Only a fault of ranks the incident had not hit widens the round; a failed phase
        # (``escalate``) or a faulty rank's replacement failing again uses up a try.
        widens=prev is not None and why == FAULT_DETECTED and bool(new) and not new & before,
        fresh=new - before,
        over_budget=budget.spent(m, new - before, now),
    )
    strategy, reason = choose(m, incident, exhausted)
    if strategy is None:
        return actions + exit_job(m, exitcodes.JOB_EXIT, f"{why}; {reason}")
    return actions + strategy.start(m, now, incident, why, reason)


def _ranks_of(m: JobModel, f: Fault) -> tuple[int, ...]:
    """The ranks a fault hits: its rank, or every rank of its node."""
    return tuple(m.config.ranks_of(f.node_rank)) if f.rank < 0 else (f.rank,)


def _incident_ranks(m: JobModel, prev: Round | None) -> frozenset[int]:
    """The ranks the incident of ``prev`` (the round under way) has hit so far: faulty,
    replaced or left out."""
    if prev is None:
        return frozenset()
    faulty = {r for f in prev.faults for r in _ranks_of(m, f)}
    return frozenset(faulty | prev.replace_ranks | prev.left_out)


def _mark(m: JobModel, f: Fault, ranks: tuple[int, ...]) -> list[Action]:
    lost = () if f.kind in REPORTED else ranks  # that rank is still alive
    record = FaultRecord(
        kind=f.kind.value,
        rank=f.rank,
        node_rank=f.node_rank,
        detail=f.detail,
        detect_s=round(f.detect_s, 4),
        reported_step=max(m.ranks[r].committed_step for r in ranks),
        **_origin(f),
    )
    mark = MarkLost(f"{f.kind.value}: {f.detail}", f, lost, f.kind is FaultKind.NODE_LOST)
    if f.kind is FaultKind.PLANNED_STOP:  # not a fault: its planned_stop event is written
        return [mark]
    return [mark, Emit(f.detail, record)]


def _origin(f: Fault) -> dict[str, Any]:
    """The fault record's fields of a dead rank's origin (none without one)."""
    o = f.origin
    if o is None:
        return {}
    return {
        "host": o.host or None,
        "pid": o.pid,
        "exit_code": o.exit_code,
        "signal": o.signal,
        "log_tail": o.log_tail or None,
    }


def _underway(m: JobModel, prev: Round | None, faulty: set[int]) -> set[int]:
    """Ranks whose replacement the previous round already started and that are not faulty
    again: the new round waits for them instead of killing them while they start.

    In place, that is a restarted rank not registered yet, on a node whose agent lives; for a
    rescheduled node, every rank of a recreated pod (its agent registered again) while none of
    them has registered yet.
    """
    if prev is None or prev.strategy not in (Strategy.RECOVER_IN_PLACE, Strategy.RECOVER):
        return set()
    cfg = m.config
    if prev.strategy is Strategy.RECOVER:
        underway: set[int] = set()
        for node in prev.reschedule_nodes:
            ranks = set(cfg.ranks_of(node))
            starting = not any(m.ranks[r].alive for r in ranks) and not ranks & faulty
            if m.agents[node].alive and starting:
                underway |= ranks
        return underway
    return {
        r
        for r in prev.replace_ranks - faulty
        if not m.ranks[r].alive and m.agents[cfg.node_of(r)].alive
    }


def escalate(m: JobModel, now: float, failure: Failure) -> list[Action]:
    """The one way back into the fault path for a failed or timed-out phase: new epoch, same
    or next strategy (never the exhausted one); the culprits are replaced."""
    why = failure.why
    first = list(failure.first)
    if failure.exhausted is not None:
        first.append(Exhaust(why, failure.exhausted))
    faults = list(failure.faults) + [
        Fault(FaultKind.HANG, m.config.node_of(r), r, f"{why} (rank {r})", now, 0.0)
        for r in failure.culprits
    ]
    if not faults and not m.round:
        return first + exit_job(m, exitcodes.JOB_EXIT, why)
    return first + on_faults(m, faults, now, why, failure.exhausted)
