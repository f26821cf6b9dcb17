"""``recover``: every node with a faulty rank (or lost) is rescheduled: its agent exits with
:data:`~ms_recover.exitcodes.RESCHEDULE`, the pod supervisor recreates the pod, and its fresh
ranks rejoin. The node hosting the scheduler and the manager cannot move. Replacements get
``wait_reschedule_timeout_s``; after that the strategy is given up for this incident.
"""

from __future__ import annotations

from ms_recover import exitcodes
from ms_recover.config import JobConfig
from ms_recover.manager.actions import Action, SendAgent
from ms_recover.manager.model import JobModel
from ms_recover.manager.strategies.base import (
    Incident,
    Launch,
    RecoveryStrategy,
    no_source,
    untrusted_of,
)
from ms_recover.protocol.messages import AgentExit
from ms_recover.strategy import Strategy


class Recover(RecoveryStrategy):
    name = Strategy.RECOVER
    restarts = True
    exhausted_when_late = True

    def never_applies(self, cfg: JobConfig) -> str | None:
        problem = super().never_applies(cfg)
        if problem is None and cfg.node_nums < 2:
            return (
                f"recover: the only node hosts the scheduler and cannot be rescheduled "
                f"(node_nums={cfg.node_nums})"
            )
        return problem

    def feasible(self, m: JobModel, incident: Incident) -> tuple[bool, str]:
        cfg = m.config
        nodes, replaced = _scope(m, incident)
        if cfg.sched_node_rank in nodes:
            return False, (
                f"node {cfg.sched_node_rank} hosts the scheduler and manager and "
                "cannot be rescheduled"
            )
        orphan = no_source(m, incident, replaced)
        if orphan is not None:
            return False, orphan
        return True, f"replace ranks {sorted(replaced)}"

    def launch(self, m: JobModel, incident: Incident, reason: str) -> Launch:
        nodes, replaced = _scope(m, incident)
        # A recreated pod already starts fresh ranks: its agent needs no command.
        skip = incident.fresh_nodes | {
            n for n in nodes if set(m.config.ranks_of(n)) <= incident.underway
        }
        orders: list[Action] = [
            SendAgent("reschedule pod", node, AgentExit(exitcodes.RESCHEDULE, reason))
            for node in sorted(nodes - skip)
            if m.agents[node].alive
        ]
        untrusted = untrusted_of(incident) - replaced  # repaired too, never a source
        return Launch(replace=replaced, nodes=nodes, untrusted=untrusted, orders=tuple(orders))

    def replace_limit(self, cfg: JobConfig) -> float:
        return cfg.wait_reschedule_timeout_s


def _scope(m: JobModel, incident: Incident) -> tuple[frozenset[int], frozenset[int]]:
    """The nodes to reschedule and every rank they hold (with the faulty ranks)."""
    cfg = m.config
    nodes = frozenset({cfg.node_of(r) for r in incident.hit} | incident.lost_nodes)
    replaced = set(incident.hit)
    for node in nodes:
        replaced.update(cfg.ranks_of(node))
    return nodes, frozenset(replaced)
