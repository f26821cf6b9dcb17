"""Which peers' data endpoints a rank needs: the one rule the manager and the workers share.

A rank's host data plane (:mod:`~ms_recover.comm.host.backend`) receives on one inbound socket that
any authenticated peer may reach, so it needs the endpoint of a peer only to *send* to it.
In a group whose members are ``g = (g_0, ..., g_{n-1})`` (the group's own order; the world's
order is sorted), the member at position ``i`` sends to:

* ``g[(i + 1) % n]``: the ring allreduce, the two-member one-exchange path and the broadcast
  chain (which runs along the ring from the root);
* ``g[(i + 2**k) % n]`` for every ``2**k < n``: the dissemination barrier;
* ``g[i ^ 2**k]`` for every ``i ^ 2**k < n``: recursive doubling partners, the small-allreduce
  path of groups of more than two (:mod:`~ms_recover.comm.host.doubling`). It picks its
  partners from this set: with ``n`` not a power of two, position ``i >= 2**m`` (the largest
  power below ``n``) folds onto ``i ^ 2**m = i - 2**m``, then the first ``2**m`` double.
  (MPICH's even/odd fold renumbers the ranks, so its partners are not in the set.)

Point to point (repair, MindIO's ``send_recv``) needs the destination: a repair pair
``(src, dst)`` gives ``src`` the endpoint of ``dst``.

So a rank needs at most ``2 * log2(n) + 1`` peers per group it belongs to, world included:
about 29 at 16,384 ranks instead of 16,383, and the endpoints a job's formation sends grow
linearly with its ranks. The manager sends one REBUILD per node, with what the node's ranks
need together; each rank keeps its own part (:func:`own_rebuild`). Pure: no zmq, no numpy
(the manager imports it).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import Any


def group_targets(order: Sequence[int], index: int) -> set[int]:
    """The members the member at ``index`` of ``order`` sends to (itself excluded)."""
    return _targets(order, index, _powers(len(order)))


def _powers(n: int) -> list[int]:
    """``1, 2, 4, ...`` below ``n``."""
    return [1 << k for k in range(max(0, (n - 1).bit_length()))]


def _targets(order: Sequence[int], index: int, powers: list[int]) -> set[int]:
    n = len(order)
    out = {order[(index + p) % n] for p in powers}
    out.update([order[index ^ p] for p in powers if index ^ p < n])
    out.discard(order[index])
    return out


def needs(
    rank: int,
    world: Iterable[int],
    groups: Iterable[tuple[str, Sequence[int]]] = (),
    pairs: Iterable[tuple[int, int]] = (),
) -> set[int]:
    """The ranks whose data endpoints ``rank`` needs in ``world`` with ``groups`` (name, ranks
    in the group's order) and point-to-point ``pairs`` (src, dst). Only world members count."""
    return needs_all(world, groups, pairs, only=(rank,)).get(rank, set())


def needs_all(
    world: Iterable[int],
    groups: Iterable[tuple[str, Sequence[int]]] = (),
    pairs: Iterable[tuple[int, int]] = (),
    only: Iterable[int] | None = None,
) -> dict[int, set[int]]:
    """:func:`needs` for every world member (or the ``only`` ones), in time linear in the
    total size of the world and the groups, times ``log2`` of the largest group."""
    ordered = sorted(set(world))
    members = set(ordered)
    wanted = members if only is None else members & set(only)
    out: dict[int, set[int]] = {r: set() for r in wanted}
    _add_group(out, ordered, members)
    for _, ranks in groups:
        _add_group(out, list(ranks), members)
    for src, dst in pairs:
        if src in out and dst in members and dst != src:
            out[src].add(dst)
    return out


def _add_group(out: dict[int, set[int]], order: list[int], members: set[int]) -> None:
    powers = _powers(len(order))
    inside = members.issuperset(order)
    for index, rank in enumerate(order):
        if rank in out:
            targets = _targets(order, index, powers)
            out[rank].update(targets if inside else targets & members)


def rank_needs(
    rank: int, world: Sequence[int], groups: Iterable[tuple[str, Sequence[int]]] = ()
) -> set[int]:
    """:func:`needs` of one rank of a sorted, duplicate-free ``world``, its place found by
    bisection instead of a pass over the world (a rank of a 65,536-rank job reads its peers
    from its node's REBUILD in microseconds)."""
    place = bisect.bisect_left(world, rank)
    if place == len(world) or world[place] != rank:
        return set()
    out = _targets(world, place, _powers(len(world)))
    members: set[int] | None = None
    for _, ranks in groups:
        if rank not in ranks:
            continue
        order = list(ranks)
        if members is None:
            members = set(world)
        inside = members.issuperset(order)
        powers = _powers(len(order))
        for index, member in enumerate(order):
            if member == rank:
                targets = _targets(order, index, powers)
                out.update(targets if inside else targets & members)
    return out


def own_rebuild(
    rank: int, world: list[int], endpoints: dict[int, str], group_log: list[list[Any]]
) -> tuple[dict[int, str], list[list[Any]]]:
    """What ``rank`` keeps of a REBUILD made for its node's ranks together: every member of
    the sorted ``world`` with the data endpoint of each peer it sends to (:func:`rank_needs`)
    and "" for the others, and the logged groups (``GroupLog`` wire entries) it is a member
    of, in log order."""
    groups = [entry for entry in group_log if rank in entry[1]]
    wanted = rank_needs(rank, world, [(entry[0], entry[1]) for entry in groups])
    return {r: endpoints.get(r, "") if r in wanted else "" for r in world}, groups
