"""Which strategy applies to a fault: pure checks, each returning (ok, reason).

Strategies are tried in priority order (``retry > recover-in-place > recover >
elastic-training > dump > exit``), each at most ``max_tries`` times per incident.
:func:`config_problems` reports, when the manager starts, the configured strategies that can
never apply to this job.
"""

from __future__ import annotations

from ms_recover.config import JobConfig
from ms_recover.manager.model import Fault, JobModel
from ms_recover.strategy import Strategy

NOT_YET: dict[Strategy, str] = {}
#: Fault kinds a rank survives and reports itself: the only ones ``retry`` handles.
SURVIVABLE = frozenset({"worker_error", "diverged"})


def choose_strategy(
    m: JobModel, faults: list[Fault], hit: set[int], lost_nodes: set[int], exhausted: str = ""
) -> tuple[Strategy | None, str]:
    """The first feasible strategy in priority order, with the reasons others were skipped.

    ``exhausted`` names a strategy that just failed for good (its replacement never came).
    """
    skipped: list[str] = []
    for strategy in m.config.strategies:
        if strategy.value == exhausted:
            skipped.append(f"{exhausted}: given up on in this incident")
            continue
        ok, why = feasible(m, strategy, faults, hit, lost_nodes)
        if ok:
            note = f" (skipped: {'; '.join(skipped)})" if skipped else ""
            return strategy, f"{strategy.value}: {why}{note}"
        skipped.append(f"{strategy.value}: {why}")
    return None, "no feasible strategy: " + ("; ".join(skipped) or "none configured")


def feasible(
    m: JobModel, s: Strategy, faults: list[Fault], hit: set[int], lost_nodes: set[int]
) -> tuple[bool, str]:
    cfg = m.config
    if s is Strategy.EXIT:
        return True, "last resort"
    if s in NOT_YET:
        return False, NOT_YET[s]
    if m.tries.get(s.value, 0) >= cfg.max_tries:
        return False, f"tried {m.tries[s.value]} time(s), max_tries={cfg.max_tries}"
    if s is Strategy.RETRY:
        return _retry(m, faults, hit)
    if s is Strategy.DUMP:
        return _dump(m, hit)
    if s is Strategy.ELASTIC_TRAINING:
        return _elastic(m, hit)
    nodes = {cfg.node_of(r) for r in hit} | lost_nodes
    replaced = set(hit)
    if s is Strategy.RECOVER_IN_PLACE:
        if lost_nodes:
            return False, f"node(s) {sorted(lost_nodes)} lost: no agent to restart ranks in place"
    else:
        if cfg.sched_node_rank in nodes:
            return False, (
                f"node {cfg.sched_node_rank} hosts the scheduler and manager and "
                "cannot be rescheduled"
            )
        for node in nodes:
            replaced.update(cfg.ranks_of(node))
    orphan = orphan_shard(m, replaced)
    if orphan is not None:
        return False, orphan
    return True, f"replace ranks {sorted(replaced)}"


def _retry(m: JobModel, faults: list[Fault], hit: set[int]) -> tuple[bool, str]:
    kinds = {f.kind for f in faults}
    if not kinds <= SURVIVABLE:
        return False, f"needs a fault the rank survives and reports, not {sorted(kinds)}"
    dead = sorted(r for r in hit if not m.ranks[r].alive)
    if dead:
        return False, f"rank(s) {dead} are gone"
    corrupt = {f.rank for f in faults if f.corrupt}
    orphan = orphan_shard(m, corrupt)
    if orphan is not None:
        return False, orphan
    return True, f"rebuild in place and redo the step (ranks {sorted(hit)} survived)"


def _elastic(m: JobModel, hit: set[int]) -> tuple[bool, str]:
    if len({i.shard for i in m.ranks.values()}) > 1:
        return False, "needs pure data parallelism (every rank a replica of the others)"
    left = sorted(r for r in m.active if r not in hit and m.ranks[r].alive)
    if not left:
        return False, "no healthy rank left to continue with"
    return True, f"continue with ranks {left} (global batch kept) until replacements return"


def _dump(m: JobModel, hit: set[int]) -> tuple[bool, str]:
    orphan = orphan_shard(m, hit | {r for r, i in m.ranks.items() if not i.alive})
    if orphan is not None:
        return False, orphan
    return True, "save the last committed state from one healthy replica per shard"


def orphan_shard(m: JobModel, unusable: set[int]) -> str | None:
    """A reason if some shard has no usable replica left (only once training has begun)."""
    if all(i.committed_step < 0 for i in m.ranks.values()):
        return None
    shards: dict[int, list[int]] = {}
    for rank, info in m.ranks.items():
        shards.setdefault(info.shard, []).append(rank)
    for shard, members in sorted(shards.items()):
        if set(members) <= unusable:
            return f"no healthy replica left for shard {shard} (ranks {members})"
    return None


def config_problems(cfg: JobConfig) -> list[str]:
    """Configured strategies that can never apply to this job, with the reason."""
    problems = []
    for s in cfg.strategies:
        if s in NOT_YET:
            problems.append(f"{s.value}: {NOT_YET[s]}; it will be skipped")
        elif s is Strategy.ELASTIC_TRAINING and cfg.world_size < 2:
            problems.append("elastic-training: a one-rank job has no data-parallel rank to drop")
        elif s is not Strategy.EXIT and s is not Strategy.RETRY and cfg.world_size < 2:
            problems.append(f"{s.value}: a one-rank job has no replica to repair from")
        elif s is Strategy.RECOVER and cfg.node_nums < 2:
            problems.append(
                f"recover: the only node hosts the scheduler and cannot be rescheduled "
                f"(node_nums={cfg.node_nums})"
            )
    return problems
