"""``bench goodput``'s pure parts: the seeded fault schedules, the ETTR arithmetic, and the
projection model to cluster scale. No process, no clock, no ZeroMQ, no MindSpore.

**Schedules.** A schedule of a run with budget ``B`` seconds and mean time between faults ``M``
(60 s) has ``n = max(2, round(B / M))`` faults, so every run sees at least two and, at the
default budget, the average rate is one per ``M``. The run's middle part ``[0.05 B, 0.85 B)``
is cut into ``n`` equal slots and fault ``i`` falls at a seeded uniform time in the first three
quarters of slot ``i``: faults never overlap a previous recovery by construction (a cascade is
another benchmark), and the last ``0.15 B`` lets the last recovery finish before the count.
Times are seconds after the moment every rank has taken its first step.

* ``kills``: SIGKILL of one rank process (seeded rank);
* ``nodes``: SIGKILL of one node's whole process group (a seeded node other than node 0, which
  holds MindSpore's scheduler and the manager), the node's ranks with it;
* ``mixed``: the kinds kill, node, hang (the rank is SIGSTOPped) and transient (a transient
  data-plane error raised in the rank's allreduce), in a seeded order, cycled; a run with fewer
  than four faults always has the hang (the fault plain msrun cannot see) and draws the rest.

**ETTR** of an arm = the steps it committed and kept in the budget / the fault-free arm's steps
in the same wall time, both counted from the moment every rank has taken its first step.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence

SCHEDULES = ("kills", "nodes", "mixed")
MIXED_KINDS = ("kill", "node", "hang", "transient")
MEAN_S = 60.0  # one fault per minute on average (the rate)
LEAD, TAIL = 0.05, 0.15  # shares of the budget kept free of faults at the start and the end
SLOT_USE = 0.75  # a fault falls in the first 3/4 of its slot


@dataclasses.dataclass(frozen=True)
class Fault:
    """One scheduled fault: ``at_s`` after every rank's first step; ``rank`` is the rank hit
    (for a node loss, the node's first rank); ``node`` its node."""

    at_s: float
    kind: str
    rank: int
    node: int

    def describe(self) -> str:
        where = f"node {self.node}" if self.kind == "node" else f"rank {self.rank}"
        return f"{self.kind} of {where} at {self.at_s:.1f} s"


def fault_count(budget_s: float, mean_s: float = MEAN_S) -> int:
    """Faults in a run of ``budget_s``: the budget's share of one per ``mean_s``, at least 2."""
    if not (math.isfinite(budget_s) and budget_s > 0 and math.isfinite(mean_s) and mean_s > 0):
        raise ValueError(f"budget and mean must be positive seconds, got {budget_s}, {mean_s}")
    return max(2, round(budget_s / mean_s))


def schedule(
    name: str,
    budget_s: float,
    seed: int,
    nodes: int,
    procs_per_node: int,
    mean_s: float = MEAN_S,
) -> tuple[Fault, ...]:
    """The seeded fault schedule ``name`` (one of :data:`SCHEDULES`) of a run of ``budget_s``.

    The same arguments give the same schedule, whatever ran before. Raises ValueError naming
    the valid schedules on an unknown name."""
    if name not in SCHEDULES:
        raise ValueError(f"schedule {name!r} is not one of: {', '.join(SCHEDULES)}")
    if nodes < 1 or procs_per_node < 1 or nodes * procs_per_node < 2:
        raise ValueError(f"needs at least 2 ranks, got {nodes} x {procs_per_node}")
    n = fault_count(budget_s, mean_s)
    rng = random.Random(f"{name}:{seed}")  # a string seed is hashed the same in every process
    kinds = mixed_kinds(n, rng)
    start, width = LEAD * budget_s, (1 - LEAD - TAIL) * budget_s / n
    world = nodes * procs_per_node
    faults = []
    for i in range(n):
        at = start + i * width + rng.uniform(0, SLOT_USE * width)
        kind = {"kills": "kill", "nodes": "node"}.get(name) or kinds[i % len(kinds)]
        if kind == "node":
            # Node 0 holds MindSpore's scheduler and the manager: its loss is a manager takeover,
            # not a node to replace (another benchmark); a 1-node job loses its only node.
            node = rng.randrange(1, nodes) if nodes > 1 else 0
            rank = node * procs_per_node
        else:
            rank = rng.randrange(world)
            node = rank // procs_per_node
        faults.append(Fault(round(at, 3), kind, rank, node))
    return tuple(_untouched_transients(faults, procs_per_node, world))


def mixed_kinds(n: int, rng: random.Random) -> list[str]:
    """The first ``n`` kinds of the mixed schedule: always a hang (the fault plain msrun cannot
    see), the other kinds in a seeded order, all in a seeded order, then cycled."""
    others = [k for k in MIXED_KINDS if k != "hang"]
    rng.shuffle(others)
    first = ["hang", *others][: max(1, min(n, len(MIXED_KINDS)))]
    rest = [k for k in MIXED_KINDS if k not in first]
    rng.shuffle(first)
    return first + rest


def _untouched_transients(faults: list[Fault], procs_per_node: int, world: int) -> list[Fault]:
    """A transient error is raised inside a rank's first process (its incarnation 0): move it
    to a rank no earlier fault of the schedule replaced, when there is one."""
    out: list[Fault] = []
    for f in faults:
        if f.kind == "transient":
            hit = set(replaced_ranks(out, procs_per_node))
            if f.rank in hit:
                free = [r for r in range(world) if r not in hit]
                if free:
                    r = free[0]
                    f = dataclasses.replace(f, rank=r, node=r // procs_per_node)
        out.append(f)
    return out


def replaced_ranks(faults: Sequence[Fault], procs_per_node: int) -> list[int]:
    """Ranks whose process a fault of ``faults`` ends (a transient error's rank survives)."""
    hit: list[int] = []
    for f in faults:
        if f.kind == "node":
            hit += range(f.node * procs_per_node, (f.node + 1) * procs_per_node)
        elif f.kind in ("kill", "hang"):
            hit.append(f.rank)
    return hit


def ettr_pct(kept_steps: float, clean_steps: float) -> float:
    """ETTR in percent: steps committed and kept / the fault-free arm's steps in the same time."""
    if clean_steps <= 0:
        raise ValueError(f"the fault-free arm took no step ({clean_steps})")
    return 100.0 * max(0.0, kept_steps) / clean_steps


def cost_per_fault_s(kept_steps: float, clean_steps: float, budget_s: float, faults: int) -> float:
    """Productive seconds one fault cost on average: the steps missing against the fault-free
    arm, at the fault-free step rate, shared over the faults."""
    if faults < 1 or clean_steps <= 0 or budget_s <= 0:
        raise ValueError("needs at least one fault and a fault-free arm that stepped")
    return max(0.0, clean_steps - kept_steps) * (budget_s / clean_steps) / faults


def last_checkpoint(step: int, every: int) -> int:
    """The last step ``<= step`` a job checkpointing after steps ``every-1, 2*every-1, ...``
    saved; -1 when none."""
    if every < 1:
        raise ValueError(f"checkpoint interval must be at least 1 step, got {every}")
    return (step + 1) // every * every - 1


def projected_ettr_pct(cost_s: float, mttf_s: float) -> float:
    """The model: faults arrive at rate ``1 / mttf_s`` in wall time and each costs ``cost_s``
    of it, so ``ETTR = 1 - cost / MTTF`` (0 when a fault costs more than the time between)."""
    if mttf_s <= 0:
        raise ValueError(f"MTTF must be positive, got {mttf_s}")
    return 100.0 * max(0.0, 1.0 - cost_s / mttf_s)


#: Published mean times to failure (Meta, Llama 3 training): GPUs in the job -> seconds.
PUBLISHED_MTTF_S: tuple[tuple[str, float], ...] = (
    ("16,384 GPUs (MTTF 1.8 h)", 1.8 * 3600),
    ("131,072 GPUs (MTTF ~14 min)", 14 * 60),
)
