"""The registered strategies, and the walk down the job's list that picks one.

Strategies are tried in priority order (``retry > recover-in-place > recover >
elastic-training > dump > exit``, the order of ``JobConfig.strategies``), each at most
``max_tries`` times per incident. A try is used up when a round starts for a new incident or
after a failed round (a phase timeout, a replacement failing again); a new fault of another
rank during the round widens it and goes on with the current try. A strategy that restarts
ranks is skipped for a rank whose restart budget is used up
(:mod:`~ms_recover.manager.budget`).
"""

from __future__ import annotations

from ms_recover.config import JobConfig
from ms_recover.manager import budget
from ms_recover.manager.model import JobModel, Round
from ms_recover.manager.strategies.base import Incident, RecoveryStrategy
from ms_recover.manager.strategies.dump import Dump
from ms_recover.manager.strategies.elastic_training import ElasticTraining
from ms_recover.manager.strategies.exit import Exit
from ms_recover.manager.strategies.recover import Recover
from ms_recover.manager.strategies.recover_in_place import RecoverInPlace
from ms_recover.manager.strategies.retry import Retry
from ms_recover.strategy import PRIORITY, Strategy

REGISTRY: dict[Strategy, RecoveryStrategy] = {
    s.name: s for s in (Retry(), RecoverInPlace(), Recover(), ElasticTraining(), Dump(), Exit())
}
assert set(REGISTRY) == set(PRIORITY), "every strategy of the annotation has a module"


def choose(
    m: JobModel, incident: Incident, exhausted: Strategy | None = None
) -> tuple[RecoveryStrategy | None, str]:
    """The first feasible strategy of the job's list, with the reasons others were skipped.

    ``exhausted`` names a strategy that just failed for good (its replacement never came).
    """
    skipped: list[str] = []
    for name in m.config.strategies:
        if name is exhausted:
            skipped.append(f"{name.value}: given up on in this incident")
            continue
        strategy = REGISTRY[name]
        ok, why = _check(m, strategy, incident)
        if ok:
            note = f" (skipped: {'; '.join(skipped)})" if skipped else ""
            if incident.continues(name):
                note += "; a fault of another rank during the round: widened, no try used"
            return strategy, f"{name.value}: {why}{note}"
        skipped.append(f"{name.value}: {why}")
    return None, "no feasible strategy: " + ("; ".join(skipped) or "none configured")


def _check(m: JobModel, strategy: RecoveryStrategy, incident: Incident) -> tuple[bool, str]:
    tries = m.tries.get(strategy.name.value, 0)
    used_up = strategy.bounded and tries >= m.config.max_tries
    if used_up and not incident.continues(strategy.name):
        return False, f"tried {tries} time(s), max_tries={m.config.max_tries}"
    if strategy.restarts and incident.over_budget:
        return False, budget.reason(m, incident.over_budget)
    return strategy.feasible(m, incident)


def strategy_of(rnd: Round) -> RecoveryStrategy:
    """The strategy running ``rnd`` (the formation round behaves like recover-in-place)."""
    return REGISTRY[rnd.strategy or Strategy.RECOVER_IN_PLACE]


def config_problems(cfg: JobConfig) -> list[str]:
    """Configured strategies that can never apply to this job, with the reason."""
    found = (REGISTRY[s].never_applies(cfg) for s in cfg.strategies)
    return [problem for problem in found if problem is not None]
