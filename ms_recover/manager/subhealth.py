"""The job's sub-health policy (MindCluster's ``subHealthyStrategy``, :mod:`ms_recover.subhealth`)
applied to a flagged node, and the flag of a replica that diverges again soon after a repair.
Pure functions of the :class:`JobModel` and the clock, called by
:func:`~ms_recover.manager.decide.decide`; the executor applies their actions.

A flag names a rank; the policy acts on its node, once per node (``JobModel.settled_nodes``):

* ``ignore``: a ``sub_health`` event saying the flag is reported only;
* ``forceExit``: the job exits at once with :data:`~ms_recover.exitcodes.JOB_EXIT`;
* ``graceExit``: a ``dump`` round: every rank stops at a step boundary, one trusted replica
  per shard writes the last committed step, and the job exits with
  :data:`~ms_recover.exitcodes.DUMPED` (a diverged rank never writes);
* ``hotSwitch``: the node is *switching* (``JobModel.switching``) and its new pod is asked for
  (the ``sub_health`` event ``switch_requested``, a ``status`` line) while training goes on.
  The new pod's agent and ranks say hello and are held, as a recreated pod's are, while the
  old ones run (:mod:`~ms_recover.manager.slots`). Once every rank of the new pod is waiting
  (``JobModel.backups``), the swap is a recovery whose replace phase already happened: the
  survivors stop at a step boundary, the old pod's agent is told to leave
  (:data:`~ms_recover.exitcodes.STOPPED`: its pod is retired, not recreated), the held ranks
  register, and everyone rebuilds and repairs from replicas (:class:`HotSwitch`). A node that
  hosts the scheduler and manager cannot move. If the new pod is not all there within
  ``hot_switch_timeout_s``, the switch is abandoned: the old node stays, training goes on,
  and nothing else happens (MindCluster's ClusterD, too, turns the policy to ``ignore`` when
  its hot switch fails); never a job-level restart. While a node is switching, a hang blamed
  on one of its ranks is held (:func:`hangs_not_held`): the swap replaces that rank anyway.

**Repeat divergence.** A replica whose steady-state digest differed from its replicas' is
repaired (``diverged`` fault). One that differs again within ``diverge_window_s`` of its last
divergence is flagged (``reason`` ``diverged``), and the policy applies to its node.
"""

from __future__ import annotations

from ms_recover import exitcodes
from ms_recover.manager.actions import Action, Emit, MarkLost, SendAgent, SubHealthStep
from ms_recover.manager.commands import exit_job
from ms_recover.manager.model import Fault, JobModel
from ms_recover.manager.strategies.base import FAULT_DETECTED, Incident, Launch
from ms_recover.manager.strategies.dump import Dump
from ms_recover.manager.strategies.recover import Recover
from ms_recover.observability.schema import FaultKind, FaultRecord, FlaggedRecord, SubHealthRecord
from ms_recover.protocol.messages import AgentExit
from ms_recover.subhealth import SubHealthy

#: Divergences of one rank within ``diverge_window_s`` that flag it.
REPEATS = 2


class HotSwitch(Recover):
    """``recover`` for a node whose new pod is already up and waiting: the old pod's agent is
    told to leave for good (its pod is retired, not recreated); its ranks' replacements are
    the new pod's, held until now."""

    def launch(self, m: JobModel, incident: Incident, reason: str) -> Launch:
        launch = super().launch(m, incident, reason)
        leave = AgentExit(exitcodes.STOPPED, f"{reason}: this pod is retired")
        orders = tuple(SendAgent("retire pod", n, leave) for n in sorted(launch.nodes))
        return Launch(replace=launch.replace, nodes=launch.nodes, orders=orders)


def divergence_flags(m: JobModel, now: float) -> list[FlaggedRecord]:
    """Ranks whose replica diverged :data:`REPEATS` times within ``diverge_window_s``, not
    flagged before."""
    out = []
    window = m.config.diverge_window_s
    for rank, times in sorted(m.diverged_at.items()):
        recent = [t for t in times if now - t <= window]
        if rank in m.flagged or len(recent) < REPEATS:
            continue
        info = m.ranks[rank]
        agent = m.agents.get(info.node_rank)
        gap = recent[-1] - recent[-2]
        out.append(
            FlaggedRecord(
                rank=rank,
                node=info.node_rank,
                host=agent.pod_ip if agent is not None else "",
                step=info.committed_step,
                reason="diverged",
                detail=(
                    f"its replica's state digest differed from its replicas' {len(recent)} "
                    f"times within {window:g}s (the last two {gap:.1f}s apart), after a repair"
                ),
                score=float(len(recent)),
            )
        )
    return out


def act(m: JobModel, flags: list[FlaggedRecord], now: float) -> tuple[list[Action], bool]:
    """The policy's actions for the nodes of ``flags`` not settled yet, and whether they end
    the running state (a round or the job's end: nothing else is decided this time)."""
    actions: list[Action] = []
    acted: set[int] = set()
    for flag in flags:
        node = flag.node
        if node in m.settled_nodes or node in acted or node in m.switching:
            continue
        acted.add(node)
        more, ends = _apply(m, flag, now)
        actions += more
        if ends:
            return actions, True
    return actions, False


def _apply(m: JobModel, flag: FlaggedRecord, now: float) -> tuple[list[Action], bool]:
    policy, node = m.config.sub_healthy, flag.node
    ranks = list(m.config.ranks_of(node))
    why = f"rank {flag.rank} of node {node} flagged {flag.reason}"

    def note(action: str, reason: str) -> Emit:
        return Emit(reason, SubHealthRecord(policy.value, node, ranks, action, reason))

    settle = SubHealthStep(f"{policy.value}: node {node} settled", node, None)
    if policy is SubHealthy.IGNORE:
        return [note("reported", f"{why}: {policy.value}, reported only"), settle], False
    if policy is SubHealthy.FORCE_EXIT:
        reason = f"{why}: {policy.value}, the job exits"
        return [note("exit", reason), settle, *exit_job(m, exitcodes.JOB_EXIT, reason)], True
    if policy is SubHealthy.GRACE_EXIT:
        dump = note("dump_and_exit", f"{why}: {policy.value}, dump and exit")
        return _grace_exit(m, flag, why, now, [dump, settle])
    if node == m.config.sched_node_rank:
        reason = (
            f"{why}: {policy.value} impossible, node {node} hosts the scheduler and manager "
            "and cannot move; reported only"
        )
        return [note("not_movable", reason), settle], False
    reason = f"{why}: {policy.value}, a new pod for ranks {ranks} is wanted; training goes on"
    return [note("switch_requested", reason), SubHealthStep(reason, node, now)], False


def _grace_exit(
    m: JobModel, flag: FlaggedRecord, why: str, now: float, first: list[Action]
) -> tuple[list[Action], bool]:
    """A dump round (every rank stops; a diverged rank never writes), or the job's end when
    no shard keeps a trusted replica."""
    corrupt = flag.reason == "diverged"
    fault = Fault(FaultKind.SUB_HEALTHY, flag.node, flag.rank, why, now, 0.0, corrupt)
    hit = frozenset({flag.rank}) if corrupt else frozenset()
    incident = Incident(faults=(fault,), hit=hit, lost_nodes=frozenset())
    dump = Dump()
    ok, reason = dump.feasible(m, incident)
    if not ok:
        why = f"{why}: graceExit cannot dump ({reason})"
        return [*first, *exit_job(m, exitcodes.JOB_EXIT, why)], True
    start = dump.start(m, now, incident, FAULT_DETECTED, f"graceExit: {why}; {reason}")
    return [*first, *start], True


def hangs_not_held(m: JobModel, hangs: list[Fault], now: float) -> list[Fault]:
    """The hangs to act on: a hang blamed on a rank of a switching node is held while its
    hot switch may still come (``hot_switch_timeout_s``), since the swap replaces that rank
    anyway. A flagged slow rank looks hung in its long steps; restarting it in place would
    keep it on the slow node. Once the switch is done or abandoned, a hang is declared as
    always."""
    if not m.switching:  # the common case
        return hangs
    limit = m.config.hot_switch_timeout_s
    return [
        h for h in hangs if h.node_rank not in m.switching or now - m.switching[h.node_rank] > limit
    ]


def switches(m: JobModel, now: float) -> list[Action]:
    """RUNNING: swap in the new pod of a switching node once all of it waits, or abandon the
    switch once ``hot_switch_timeout_s`` passed without it. Empty when neither is due."""
    for node, since in sorted(m.switching.items()):
        ranks = list(m.config.ranks_of(node))
        waited = round(now - since, 4)
        if node in m.backups:
            return _swap(m, node, ranks, now, waited)
        if waited > m.config.hot_switch_timeout_s:
            reason = (
                f"hot switch of node {node} abandoned: no new pod for ranks {ranks} within "
                f"{m.config.hot_switch_timeout_s:g}s; the node stays, training goes on, its "
                "policy is now ignore (no job-level restart)"
            )
            record = SubHealthRecord(
                SubHealthy.HOT_SWITCH.value, node, ranks, "switch_timed_out", reason, waited
            )
            return [Emit(reason, record), SubHealthStep(reason, node, None)]
    return []


def _swap(m: JobModel, node: int, ranks: list[int], now: float, waited: float) -> list[Action]:
    """The swap: a recovery round whose replacements (the new pod's ranks) are already up."""
    detail = f"node {node} switched to its new pod (up {waited:.1f}s after it was asked for)"
    fault = Fault(FaultKind.SUB_HEALTHY, node, -1, detail, now, 0.0)
    record = FaultRecord(
        kind=fault.kind.value,
        rank=-1,
        node_rank=node,
        detail=detail,
        detect_s=0.0,
        reported_step=max(m.ranks[r].committed_step for r in ranks),
    )
    incident = Incident(faults=(fault,), hit=frozenset(ranks), lost_nodes=frozenset())
    strategy = HotSwitch()
    ok, why = strategy.feasible(m, incident)
    note = SubHealthRecord(SubHealthy.HOT_SWITCH.value, node, ranks, "switching", detail, waited)
    first: list[Action] = [Emit(detail, note), SubHealthStep(detail, node, None)]
    if not ok:
        reason = f"hot switch of node {node} abandoned: {why}; the node stays"
        abandon = SubHealthRecord(note.policy, node, ranks, "switch_failed", reason, waited)
        return [Emit(reason, abandon), SubHealthStep(reason, node, None)]
    lost = MarkLost(detail, fault, tuple(ranks), False)
    start = strategy.start(m, now, incident, FAULT_DETECTED, f"hotSwitch: {why}")
    return [*first, lost, Emit(detail, record), *start]
