"""Planned stops: nodes that leave on purpose (docs/design.md §1d).

Kubernetes stops a pod with SIGTERM and sends SIGKILL ``terminationGracePeriodSeconds``
later (a pod deletion, a node drain, a preemption). The node's agent says so at once
(``NodeLeaving``); the server records the fact (:attr:`JobModel.leaving
<ms_recover.manager.model.JobModel.leaving>`, a ``planned_stop`` event and a
:attr:`~ms_recover.observability.schema.FaultKind.PLANNED_STOP` fault) and ``decide`` acts on it
here:

* one node (or some) leaving: after a short settle (:func:`settle_s`, so that a job deletion
  whose SIGTERMs arrive a few hundred milliseconds apart is seen whole), the planned stop goes
  down the job's strategy list like a fault whose ranks are still alive: ``recover`` and
  ``elastic-training`` send the node's agent away to have its pod recreated and repair its
  replacement from replicas; ``recover-in-place`` never applies (the pod is going); ``dump``
  may use the leaving ranks as writers (they are alive until the round ends);
* every node leaving (:meth:`JobModel.every_node_leaving
  <ms_recover.manager.model.JobModel.every_node_leaving>`), or the manager's own node
  leaving with no standby manager to take over (:meth:`JobModel.stop_reason
  <ms_recover.manager.model.JobModel.stop_reason>`): the job was asked to stop. With
  ``dump`` configured (and a replica of every shard alive) the survivors stop and write a
  final dump; the job then ends with :data:`~ms_recover.exitcodes.STOPPED` and a ``job_end``
  whose reason starts with :data:`~ms_recover.manager.commands.ASKED_TO_STOP`.

Pure: no zmq, numpy or msgpack.
"""

from __future__ import annotations

from ms_recover import exitcodes
from ms_recover.manager.actions import Action
from ms_recover.manager.commands import ASKED_TO_STOP, exit_job
from ms_recover.manager.model import Fault, JobModel, Leaving
from ms_recover.manager.strategies.base import Incident
from ms_recover.manager.strategies.registry import REGISTRY
from ms_recover.observability.schema import FaultKind, JobState
from ms_recover.strategy import Strategy

#: How long the first planned stop waits for other nodes' before it is acted on, at most.
SETTLE_S = 1.0


def note_leaving(
    m: JobModel, node: int, reason: str, deadline_s: float, now: float
) -> Leaving | None:
    """Record that ``node`` is leaving (the server's handler of ``NodeLeaving``): the node in
    :attr:`JobModel.leaving` and a pending planned-stop fault. None when it was known already
    (an agent says it again after a manager restart) and nothing was recorded."""
    if node in m.leaving:
        return None
    leaving = m.leaving[node] = Leaving(node, reason, now, now + deadline_s)
    detail = f"node {node} is leaving ({reason}); its agent leaves in {deadline_s:.1f}s"
    m.pending.append(Fault(FaultKind.PLANNED_STOP, node, -1, detail, now, 0.0))
    return leaving


def settle_s(leaving: Leaving) -> float:
    """How long a planned stop waits before it is acted on: :data:`SETTLE_S`, and never more
    than a quarter of the time its agent gives the manager."""
    return min(SETTLE_S, max(0.0, leaving.deadline - leaving.since) / 4)


def settled(m: JobModel, faults: list[Fault], now: float) -> list[Fault]:
    """``faults`` without the planned stops still settling (they stay pending); all of them
    when another fault is among them: the round it starts takes the planned stops along
    (a new round clears what is pending)."""
    if any(f.kind is not FaultKind.PLANNED_STOP for f in faults):
        return faults
    out = []
    for f in faults:
        leaving = m.leaving.get(f.node_rank) if f.kind is FaultKind.PLANNED_STOP else None
        if leaving is None or now >= leaving.since + settle_s(leaving):
            out.append(f)
    return out


def asked_to_stop(m: JobModel, now: float) -> list[Action] | None:
    """The job's end when it was asked to stop as a whole (:meth:`JobModel.stop_reason`:
    every node leaving, or the manager's node with no standby manager; None otherwise, or
    when its final dump is already under way): a final dump where ``dump`` is configured and
    can be written, else the end at once, with :data:`~ms_recover.exitcodes.STOPPED`."""
    why = m.stop_reason()
    if m.state in (JobState.EXITING, JobState.FINISHED) or not why:
        return None
    if m.in_recovery and m.round is not None and m.round.strategy is Strategy.DUMP:
        return None  # the dump under way ends the job (with STOPPED, see dump.dumping)
    reason = f"{ASKED_TO_STOP}: {why}"
    if Strategy.DUMP not in m.config.strategies:
        return exit_job(m, exitcodes.STOPPED, f"{reason}; no final dump (dump not configured)")
    incident = Incident(
        faults=tuple(m.pending),
        hit=frozenset(),
        lost_nodes=frozenset(),
        prev=m.round if m.in_recovery else None,
    )
    dump = REGISTRY[Strategy.DUMP]
    ok, why = dump.feasible(m, incident)
    if not ok:
        return exit_job(m, exitcodes.STOPPED, f"{reason}; no final dump: {why}")
    return dump.start(m, now, incident, reason, f"final dump: {why}")
