"""Action sequences shared by the phases and the strategies: REBUILD for a world, and the end
of the job by ``exit`` (a normal end is :mod:`~ms_recover.manager.ending`). Pure functions of
the job model.
"""

from __future__ import annotations

from typing import Any

from ms_recover.comm.peers import group_targets, needs_all
from ms_recover.manager import sparenodes
from ms_recover.manager.actions import (
    Action,
    Emit,
    FinishRound,
    SendAgent,
    SendRanks,
    Transition,
)
from ms_recover.manager.model import Ack, JobModel
from ms_recover.observability.schema import DecisionRecord, JobEndRecord, JobState
from ms_recover.protocol.messages import AgentExit, Exit, Peers, Rebuild, runs

#: How the reason of a job asked to stop (every node leaving: SIGTERM) begins.
ASKED_TO_STOP = "asked to stop"


def rebuild(m: JobModel, active: frozenset[int] | None = None) -> list[SendRanks]:
    """REBUILD for every member, one per node (per node and ``full``: see below), with what
    the node's ranks use together and nothing else, so a formation's payload grows with the
    ranks and the group sizes, not with ranks squared, and the manager builds, packs and
    queues one message per node, not per rank:

    * the data endpoints of exactly the peers its ranks send to in this world and their groups
      (:func:`~ms_recover.comm.peers.needs_all`), at most ``2 * log2(n) + 1`` per rank and group;
    * the logged groups one of its ranks is a member of, in log order.

    Each rank keeps its own part (:func:`~ms_recover.comm.peers.own_rebuild`): the endpoints of
    the peers it sends to, the groups it is a member of. ``full`` marks the first REBUILD a
    rank acknowledges in its incarnation (a node's new ranks get their own REBUILD).
    """
    world = sorted(m.active if active is None else active)
    wire_world, entries = runs(world), m.group_log.to_wire()
    wanted = needs_all(world, m.group_log)
    ranks, node_of = m.ranks, m.config.node_of
    key = {r: (node_of(r), ranks[r].acked_epoch(Ack.REBUILD) < 0) for r in world}
    batches: dict[tuple[int, bool], list[int]] = {}  # (node, full) -> its ranks, in order
    for r in world:
        batches.setdefault(key[r], []).append(r)
    logged: dict[tuple[int, bool], list[list[Any]]] = {k: [] for k in batches}
    for entry in entries:  # in log order
        for k in {key[r] for r in entry[1] if r in key}:
            logged[k].append(entry)
    where = {r: ranks[r].endpoint for r in world}
    sends = []
    for k, members in batches.items():
        peers = set().union(*(wanted[r] for r in members))
        endpoints = {q: where[q] for q in sorted(peers)}
        msg = Rebuild(wire_world, endpoints, k[1], logged[k])
        sends.append(SendRanks("rebuild", tuple(members), msg))
    return sends


def peers_of_group(m: JobModel, rank: int, name: str, ranks: list[int]) -> Peers | None:
    """The answer to ``rank``'s GroupCreated: the endpoints it sends to in the new group
    (None for a rank outside the group: it sends nothing there)."""
    if rank not in ranks:
        return None
    wanted = group_targets(ranks, ranks.index(rank)) & m.active
    return Peers(name, {q: m.ranks[q].endpoint for q in sorted(wanted)})


def exit_job(m: JobModel, code: int, reason: str) -> list[Action]:
    """Stop every process of the job with ``code`` (the ``exit`` strategy or the end)."""
    actions: list[Action] = [Emit(reason, DecisionRecord("exit", reason))]
    if m.round is not None and m.in_recovery:
        actions.append(FinishRound(reason, False))
    actions.append(SendRanks("exit", tuple(m.live_ranks()), Exit(code, reason)))
    for node, agent in sorted(m.agents.items()):
        if agent.alive:
            actions.append(SendAgent("exit", node, AgentExit(code, reason)))
    actions.extend(sparenodes.release_all(m, code, reason))
    actions.append(Emit(reason, JobEndRecord(code, reason)))
    actions.append(Transition(reason, JobState.EXITING))
    return actions
