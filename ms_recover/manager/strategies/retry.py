"""``retry``: the faulty ranks survived (they reported the error themselves); everyone stops,
rebuilds in place and redoes the step. A rank whose state cannot be trusted (a device memory
error, a replica whose digest differs) gets it again from a replica. Nobody restarts.
"""

from __future__ import annotations

from ms_recover.config import JobConfig
from ms_recover.manager.model import JobModel
from ms_recover.manager.strategies.base import (
    SURVIVABLE,
    Incident,
    Launch,
    RecoveryStrategy,
    no_source,
    untrusted_of,
)
from ms_recover.strategy import Strategy


class Retry(RecoveryStrategy):
    name = Strategy.RETRY

    def never_applies(self, cfg: JobConfig) -> str | None:
        return None

    def feasible(self, m: JobModel, incident: Incident) -> tuple[bool, str]:
        kinds = {f.kind for f in incident.faults}
        if not kinds <= SURVIVABLE:
            names = sorted(k.value for k in kinds)
            return False, f"needs a fault the rank survives and reports, not {names}"
        dead = sorted(r for r in incident.hit if not m.ranks[r].alive)
        if dead:
            return False, f"rank(s) {dead} are gone"
        orphan = no_source(m, incident, frozenset())
        if orphan is not None:
            return False, orphan
        return True, f"rebuild in place and redo the step (ranks {sorted(incident.hit)} survived)"

    def launch(self, m: JobModel, incident: Incident, reason: str) -> Launch:
        return Launch(untrusted=untrusted_of(incident))
