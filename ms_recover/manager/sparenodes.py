"""Spare nodes: a lost node's place goes to a pod started ahead of time (docs/design.md §1f).

A spare node is a pod whose agent runs ``ms-recover agent --spare``: it holds the node's rank
processes pre-warmed (the training script run up to ``ms_recover.init()``, its ``warm_up``
compiled there) and no node rank, and offers itself to the manager (``SpareHello``, again on
every heartbeat interval). The server's handler records it in ``JobModel.spares`` (a fact).

When a recovery round waits for nodes sent to be rescheduled (``recover``: a node lost, or
its pod told to leave; elastic training shrinks instead, and a hot switch has its own new
pod), the decision here gives each such node whose agent is gone to the oldest live spare at
once, instead of waiting for the recreated pod: the executor sends the spare
``SpareAssign(node)``, the spare's agent registers as that node's agent and starts its ranks
from the warm processes, which register and are repaired from replicas like any replacement.
A recreated pod that comes back later for that node is told to become a spare (the server's
hello handler), as is a new spare pod.

Without a spare nothing changes: the round waits for the recreated pod as before.

Pure: reads the model and the clock, returns actions; no zmq, numpy or msgpack.
"""

from __future__ import annotations

from ms_recover.manager.actions import Action, PromoteSpare, ReleaseSpare
from ms_recover.manager.model import JobModel, SpareNode


def act(m: JobModel, now: float) -> list[Action]:
    """Spares that stopped answering are forgotten; nodes the round waits for get a spare."""
    return [*dropouts(m, now), *promotions(m, now)]


def _silence_limit(m: JobModel, now: float) -> float:
    """Heard before this is silent: judged as of ``m.heard_at`` when earlier than ``now``, as
    :func:`~ms_recover.manager.decide.detect_silence` judges agents (a spare's hello waiting
    unread in a busy manager's queue is not silence)."""
    return min(now, m.heard_at) - m.config.silence_s


def live_spares(m: JobModel, now: float) -> list[SpareNode]:
    """Spares heard within ``silence_s``, oldest first (the longest warm)."""
    limit = _silence_limit(m, now)
    live = [s for s in m.spares.values() if s.last_seen >= limit]
    return sorted(live, key=lambda s: (s.since, s.pid))


def waiting_nodes(m: JobModel, now: float) -> list[int]:
    """The nodes the current recovery round waits for a new pod for (never the scheduler's),
    whose agent is gone and which no spare was given within the last ``silence_s`` (a promoted
    spare registers within milliseconds; one that did not is given up, and the next spare may
    take the node)."""
    r = m.round
    if r is None or r.strategy is None or not m.in_recovery:
        return []
    out = []
    # Node 0 (the scheduler's) is rescheduled only after a manager takeover, whose recreated
    # pod brings a standby manager along: a spare does not take its place (not built).
    for node in sorted(r.reschedule_nodes - {m.config.sched_node_rank}):
        given = m.promoted.get(node)
        if m.agents[node].alive or (given is not None and now - given[1] < m.config.silence_s):
            continue
        out.append(node)
    return out


def promotions(m: JobModel, now: float) -> list[Action]:
    """Each waiting node (lowest first) to a live spare (oldest first), as far as they go."""
    r = m.round
    nodes = waiting_nodes(m, now)
    if r is None or not nodes:
        return []
    waited = now - r.incident_start
    return [
        PromoteSpare(
            f"node {node}'s pod is gone: spare node (agent pid {spare.pid} on "
            f"{spare.pod_ip or '?'}, {spare.warm} warm) takes its place",
            node,
            spare.identity,
            waited,
        )
        for node, spare in zip(nodes, live_spares(m, now), strict=False)
    ]


def dropouts(m: JobModel, now: float) -> list[Action]:
    """Spares silent for ``silence_s``: forgotten (a spare that speaks again registers anew)."""
    limit = _silence_limit(m, now)
    return [
        ReleaseSpare(f"spare (agent pid {s.pid}) silent for {now - s.last_seen:.1f}s", ident, None)
        for ident, s in m.spares.items()
        if s.last_seen < limit
    ]


def release_all(m: JobModel, code: int, reason: str) -> list[Action]:
    """The job ended (``code``): every spare exits too."""
    return [ReleaseSpare(reason, ident, code) for ident in m.spares]
