"""Action sequences shared by the phases and the strategies: REBUILD for a world, and the end
of the job. Pure functions of the job model.
"""

from __future__ import annotations

from ms_recover import exitcodes
from ms_recover.manager.actions import (
    Action,
    Emit,
    FinishRound,
    SendAgent,
    SendRanks,
    Transition,
)
from ms_recover.manager.model import Ack, JobModel, JobState
from ms_recover.manager.records import DecisionRecord, JobEndRecord
from ms_recover.protocol.messages import AgentExit, Exit, Rebuild, runs


def rebuild(m: JobModel, active: frozenset[int] | None = None) -> list[SendRanks]:
    """REBUILD for every member: each gets the endpoints registered since its last rebuild
    (a rank that never acknowledged one, in this incarnation, gets all of them)."""
    world = sorted(m.active if active is None else active)
    wire_world, group_log = runs(world), m.group_log.to_wire()
    by_known: dict[int, list[int]] = {}
    for r in world:
        by_known.setdefault(m.ranks[r].acked_epoch(Ack.REBUILD), []).append(r)
    sends = []
    for known, ranks in sorted(by_known.items()):
        full = known < 0
        endpoints = {
            q: m.ranks[q].endpoint for q in world if full or m.ranks[q].endpoint_epoch >= known
        }
        msg = Rebuild(wire_world, endpoints, full, group_log)
        sends.append(SendRanks("rebuild", tuple(ranks), msg))
    return sends


def exit_job(m: JobModel, code: int, reason: str) -> list[Action]:
    """Stop every process of the job with ``code`` (the ``exit`` strategy or the end)."""
    actions: list[Action] = [Emit(reason, DecisionRecord("exit", reason))]
    if m.round is not None and m.in_recovery:
        actions.append(FinishRound(reason, False))
    actions.append(SendRanks("exit", tuple(m.live_ranks()), Exit(code, reason)))
    for node, agent in sorted(m.agents.items()):
        if agent.alive:
            actions.append(SendAgent("exit", node, AgentExit(code, reason)))
    actions.append(Emit(reason, JobEndRecord(code, reason)))
    actions.append(Transition(reason, JobState.EXITING))
    return actions


def finish_job(m: JobModel, reason: str) -> list[Action]:
    """Every rank finished training: release the agents and end the job with 0."""
    actions: list[Action] = [
        SendAgent(reason, n, AgentExit(exitcodes.OK, reason))
        for n, a in sorted(m.agents.items())
        if a.alive
    ]
    return actions + [
        Emit(reason, JobEndRecord(0, reason)),
        Transition(reason, JobState.FINISHED),
    ]
