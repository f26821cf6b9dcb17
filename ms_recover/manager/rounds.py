"""Starting rounds: a fault's new epoch and strategy, escalation, exit, and elastic growth.

Pure functions of the job model and the clock, returning actions (see ``decide``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ms_recover import exitcodes
from ms_recover.manager.actions import (
    Action,
    Emit,
    FinishRound,
    MarkLost,
    SendAgent,
    SendRanks,
    StartRound,
    Transition,
)
from ms_recover.manager.feasibility import SURVIVABLE, choose_strategy
from ms_recover.manager.model import Fault, JobModel, JobState, Round
from ms_recover.protocol.messages import (
    AgentExit,
    Exit,
    KillRanks,
    StartRanks,
    Stop,
)
from ms_recover.strategy import Strategy


def on_faults(
    m: JobModel, faults: list[Fault], now: float, why: str, exhausted: str = ""
) -> list[Action]:
    """Mark the faults, then start a new round with the first feasible strategy, or exit."""
    cfg = m.config
    actions: list[Action] = []
    hit: set[int] = set()
    for f in faults:
        ranks = cfg.ranks_of(f.node_rank) if f.rank < 0 else (f.rank,)
        hit.update(ranks)
        lost = () if f.kind in SURVIVABLE else tuple(ranks)  # that rank is still alive
        actions.append(MarkLost(f"{f.kind}: {f.detail}", f, lost, f.kind == "node_lost"))
        steps = [m.ranks[r].committed_step for r in ranks]
        actions.append(
            Emit(
                f.detail,
                "fault",
                {
                    "kind": f.kind,
                    "rank": f.rank,
                    "node_rank": f.node_rank,
                    "detail": f.detail,
                    "detect_s": round(f.detect_s, 4),
                    "reported_step": max(steps),
                },
            )
        )
    prev = m.round if m.in_recovery else None
    if prev is not None:
        hit |= prev.replace_ranks
    all_faults = (prev.faults if prev else []) + faults
    lost_nodes = {f.node_rank for f in all_faults if f.kind == "node_lost"}
    if prev is not None:
        lost_nodes |= {n for n in prev.reschedule_nodes if not m.agents[n].alive}
    strategy, reason = choose_strategy(m, all_faults, hit, lost_nodes, exhausted)
    if strategy is None or strategy is Strategy.EXIT:
        return actions + exit_job(m, exitcodes.JOB_EXIT, f"{why}; {reason}")
    if why != "fault detected":
        reason = f"{why}; {reason}"
    return actions + _new_round(m, now, strategy, all_faults, hit, lost_nodes, prev, reason)


def _new_round(
    m: JobModel,
    now: float,
    strategy: Strategy,
    faults: list[Fault],
    hit: set[int],
    lost_nodes: set[int],
    prev: Round | None,
    reason: str,
) -> list[Action]:
    cfg = m.config
    epoch = m.epoch + 1
    restarts = strategy in (Strategy.RECOVER, Strategy.RECOVER_IN_PLACE)
    replace = set(hit) if restarts else set()
    excluded: frozenset[int] = frozenset()
    if strategy in (Strategy.DUMP, Strategy.ELASTIC_TRAINING):
        excluded = frozenset(hit | {r for r, i in m.ranks.items() if not i.alive})
    corrupt = frozenset(f.rank for f in faults if f.corrupt and strategy is Strategy.RETRY)
    nodes: set[int] = set()
    if strategy is Strategy.RECOVER:
        nodes = {cfg.node_of(r) for r in hit} | lost_nodes
        for node in nodes:
            replace.update(cfg.ranks_of(node))
    first = faults[0] if faults else Fault("escalation", -1, -1, reason, now, 0.0)
    peak = max(i.committed_step for i in m.ranks.values())
    rnd = Round(
        epoch=epoch,
        strategy=strategy,
        faults=faults,
        replace_ranks=frozenset(replace),
        reschedule_nodes=frozenset(nodes),
        started=now,
        incident_start=prev.incident_start if prev else first.ts - first.detect_s,
        detect_s=prev.detect_s if prev else first.detect_s,
        peak_step=max(prev.peak_step, peak) if prev else peak,
        phase_start=now,
        corrupt_ranks=corrupt,
        excluded_ranks=excluded,
        new_active=m.active - excluded,
    )
    survivors = tuple(
        r for r in sorted(m.ranks) if r not in replace | excluded and m.ranks[r].alive
    )
    # A recreated pod already started fresh ranks: its agent needs no command.
    fresh = {f.node_rank for f in faults if f.kind == "node_restarted"}
    actions: list[Action] = [
        Emit(
            reason,
            "decision",
            {
                "strategy": strategy.value,
                "reason": reason,
                "replace": sorted(replace),
                "nodes": sorted(nodes),
            },
        ),
        StartRound(reason, rnd),
        SendRanks("stop survivors", survivors, Stop(reason)),
    ]
    if strategy is Strategy.RECOVER:
        for node in sorted(nodes - fresh):
            if m.agents[node].alive:
                actions.append(
                    SendAgent("reschedule pod", node, AgentExit(exitcodes.RESCHEDULE, reason))
                )
    elif restarts or strategy is Strategy.ELASTIC_TRAINING:
        # Elastic training goes on without waiting, but still asks for replacements.
        todo = replace or {r for r in hit if m.agents[cfg.node_of(r)].alive}
        for node in sorted({cfg.node_of(r) for r in todo} - fresh):
            local = sorted(r for r in todo if cfg.node_of(r) == node)
            actions.append(SendAgent("kill leftovers", node, KillRanks(local, reason)))
            actions.append(SendAgent("restart in place", node, StartRanks(local, reason)))
    actions.append(Transition(reason, JobState.STOPPING))
    return actions


def exit_job(m: JobModel, code: int, reason: str) -> list[Action]:
    """Stop every process of the job with ``code`` (the ``exit`` strategy or the end)."""
    actions: list[Action] = [Emit(reason, "decision", {"strategy": "exit", "reason": reason})]
    if m.round is not None and m.in_recovery:
        actions.append(FinishRound(reason, False))
    actions.append(SendRanks("exit", tuple(m.live_ranks()), Exit(code, reason)))
    for node, agent in sorted(m.agents.items()):
        if agent.alive:
            actions.append(SendAgent("exit", node, AgentExit(code, reason)))
    actions.append(Emit(reason, "job_end", {"exit_code": code, "reason": reason}))
    actions.append(Transition(reason, JobState.EXITING))
    return actions


def escalate(
    m: JobModel, now: float, why: str, stuck: Sequence[int] = (), exhausted: str = ""
) -> list[Action]:
    """A phase failed or timed out: new epoch, same or next strategy (never ``exhausted``)."""
    faults = [Fault("hang", m.config.node_of(r), r, f"{why} (rank {r})", now, 0.0) for r in stuck]
    if not faults and not m.round:
        return exit_job(m, exitcodes.JOB_EXIT, why)
    return on_faults(m, faults, now, why, exhausted)


def grow(m: JobModel, now: float, joiners: frozenset[int]) -> list[Action]:
    """Elastic training: replacements registered; stop, rebuild with them, repair, resume."""
    world = m.active | joiners
    reason = f"elastic-training: ranks {sorted(joiners)} are back; grow to ranks {sorted(world)}"
    rnd = Round(
        epoch=m.epoch + 1,
        strategy=Strategy.ELASTIC_TRAINING,
        started=now,
        incident_start=now,
        peak_step=max(i.committed_step for i in m.ranks.values()),
        phase_start=now,
        excluded_ranks=frozenset(r for r, i in m.ranks.items() if not i.alive),
        new_active=world,
    )
    return [
        Emit(
            reason,
            "decision",
            {"strategy": "elastic-training", "reason": reason, "replace": [], "nodes": []},
        ),
        StartRound(reason, rnd),
        SendRanks("stop to grow", tuple(sorted(world)), Stop(reason)),
        Transition(reason, JobState.STOPPING),
    ]
