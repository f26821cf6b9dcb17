"""The repair planner: which replica sends its state to which rank. Pure and deterministic.

Every rank whose state is missing (a restarted process) or whose committed step is behind the
target step S receives all of its named state from one source: a rank of the same
data-parallel shard that has committed exactly S, is not itself being repaired, and is not a
known-bad source. Sources are spread: each receiver takes the least-loaded candidate, ties
going to the lowest rank id.
"""

from __future__ import annotations

import dataclasses

from ms_recover.errors import RepairError


@dataclasses.dataclass(frozen=True)
class RepairPlan:
    target_step: int
    recv_from: dict[int, int]  # receiver -> source

    def send_to(self, rank: int) -> list[int]:
        return sorted(dst for dst, src in self.recv_from.items() if src == rank)

    @property
    def empty(self) -> bool:
        return not self.recv_from


def target_step(steps: dict[int, int], survivors: set[int]) -> int:
    """S: the highest step committed by a surviving rank (-1 if none committed anything)."""
    return max((steps[r] for r in survivors), default=-1)


def plan_repair(
    steps: dict[int, int],
    shards: dict[int, int],
    missing: set[int],
    target: int,
    bad_sources: frozenset[int] = frozenset(),
) -> RepairPlan:
    """Plan the repair to ``target``.

    ``steps`` maps every rank to its committed step; ``missing`` are ranks with no usable state
    regardless of their step. Raises RepairError naming the shard and its ranks when a rank
    needs state and no healthy replica at ``target`` is left.
    """
    receivers = sorted(r for r in steps if r in missing or steps[r] < target)
    if target < 0:
        return RepairPlan(target, {})
    load: dict[int, int] = {}
    recv_from: dict[int, int] = {}
    for dst in receivers:
        candidates = [
            r
            for r in sorted(steps)
            if shards[r] == shards[dst]
            and steps[r] == target
            and r not in missing
            and r not in bad_sources
            and r not in receivers
        ]
        if not candidates:
            replicas = sorted(r for r in steps if shards[r] == shards[dst])
            raise RepairError(
                f"no healthy replica at step {target} for rank {dst} (shard {shards[dst]}, "
                f"replicas {replicas}, bad sources {sorted(bad_sources)})"
            )
        src = min(candidates, key=lambda r: (load.get(r, 0), r))
        load[src] = load.get(src, 0) + 1
        recv_from[dst] = src
    return RepairPlan(target, recv_from)
