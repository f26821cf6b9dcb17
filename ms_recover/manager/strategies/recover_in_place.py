"""``recover-in-place``: the faulty ranks' agents kill what is left of them and start them
again with the same rank ids; the survivors stop, then everyone rebuilds and the new
processes get their state from a replica.
"""

from __future__ import annotations

from ms_recover.manager.model import JobModel
from ms_recover.manager.strategies.base import (
    Incident,
    Launch,
    RecoveryStrategy,
    no_source,
    planned_nodes,
    restart_in_place,
    untrusted_of,
)
from ms_recover.strategy import Strategy


class RecoverInPlace(RecoveryStrategy):
    name = Strategy.RECOVER_IN_PLACE
    restarts = True

    def feasible(self, m: JobModel, incident: Incident) -> tuple[bool, str]:
        if incident.lost_nodes:
            lost = sorted(incident.lost_nodes)
            return False, f"node(s) {lost} lost: no agent to restart ranks in place"
        leaving = planned_nodes(incident)
        if leaving:
            return False, f"node(s) {sorted(leaving)} leaving (planned stop): their pod is going"
        orphan = no_source(m, incident, incident.hit)
        if orphan is not None:
            return False, orphan
        return True, f"replace ranks {sorted(incident.hit)}"

    def launch(self, m: JobModel, incident: Incident, reason: str) -> Launch:
        todo = set(incident.hit - incident.underway)  # a starting replacement is left alone
        orders = restart_in_place(m.config, todo, incident.fresh_nodes, reason)
        # A diverged replica of an earlier fault that is not replaced is repaired too.
        untrusted = untrusted_of(incident) - incident.hit
        return Launch(replace=incident.hit, untrusted=untrusted, orders=orders)
