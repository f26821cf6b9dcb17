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
    in the group's order) and point-to-point ``pairs`` (src, dst). Only world members count.
    Its place in the world is found by bisection and only the groups it is in are read (a
    rank of a 65,536-rank job reads its peers from its node's REBUILD in a few ms)."""
    ordered = sorted(set(world))
    place = bisect.bisect_left(ordered, rank)
    if place == len(ordered) or ordered[place] != rank:
        return set()
    out = _targets(ordered, place, _powers(len(ordered)))
    members = set(ordered)
    for _, ranks in groups:
        if rank in ranks:
            _add_group({rank: out}, list(ranks), members)
    out.update(dst for src, dst in pairs if src == rank and dst in members and dst != rank)
    return out


def needs_all(
    world: Iterable[int],
    groups: Iterable[tuple[str, Sequence[int]]] = (),
    pairs: Iterable[tuple[int, int]] = (),
) -> dict[int, set[int]]:
    """:func:`needs` for every world member, in time linear in the total size of the world
    and the groups, times ``log2`` of the largest group."""
    ordered = sorted(set(world))
    members = set(ordered)
    out: dict[int, set[int]] = {r: set() for r in members}
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


def own_rebuild(
    rank: int, world: list[int], endpoints: dict[int, str], group_log: list[list[Any]]
) -> tuple[dict[int, str], list[list[Any]]]:
    """What ``rank`` keeps of a REBUILD made for its node's ranks together: every member of
    ``world`` with the data endpoint of each peer it sends to (:func:`needs`)
    and "" for the others, and the logged groups (``GroupLog`` wire entries) it is a member
    of, in log order."""
    groups = [entry for entry in group_log if rank in entry[1]]
    wanted = needs(rank, world, [(entry[0], entry[1]) for entry in groups])
    return {r: endpoints.get(r, "") if r in wanted else "" for r in world}, groups
