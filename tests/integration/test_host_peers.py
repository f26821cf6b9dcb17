"""HostBackends given only the endpoints of the peers they send to (ms_recover.comm.peers):
every collective still works, and a missing endpoint is a prompt CommError, never a hang."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from ms_recover.comm.grouplog import GroupLog
from ms_recover.comm.host.backend import HostBackend
from ms_recover.comm.peers import needs_all
from ms_recover.errors import CommError
from tests.integration.test_host_backend import make, run_all

__all__ = ["make"]  # the fixture, shared with test_host_backend
pytestmark = pytest.mark.timeout(60)
GROUPS = [("odd", (5, 1, 3)), ("mix", (4, 0, 2, 1))]  # rings in creation order, not sorted


def build(
    backends: list[HostBackend],
    epoch: int,
    pairs: list[tuple[int, int]] = (),  # type: ignore[assignment]
) -> dict[int, set[int]]:
    """Rebuild every backend with only the endpoints the rule gives it; returns the rule."""
    world = [b.rank for b in backends]
    wanted = needs_all(world, GROUPS, pairs)
    address = {b.rank: b.endpoint for b in backends}
    for b in backends:
        members = {r: address[r] if r in wanted[b.rank] else "" for r in world}
        b.rebuild(epoch, members, GroupLog(list(GROUPS)))
    return wanted


def test_every_collective_works_with_only_the_needed_endpoints(make: Any) -> None:
    backends = make(6, init=False, chunk_bytes=256, timeout=20.0)
    wanted = build(backends, 1)
    assert sum(len(w) for w in wanted.values()) < 6 * 5  # not every endpoint everywhere

    def body(b: HostBackend) -> Any:
        x = np.arange(1000, dtype=np.float64) * (b.rank + 1)
        out = [b.allreduce(x), b.allreduce(x[:8], "mean")]
        out += [b.broadcast(x[:300] + root, root) for root in range(6)]
        b.barrier()
        for name, ranks in GROUPS:
            if b.rank in ranks:
                out.append(b.allreduce(x, group=name))
                out.append(b.broadcast(x, ranks[-1], group=name))
                b.barrier(name)
        return out

    results = run_all(backends, body)
    base = np.arange(1000, dtype=np.float64)
    np.testing.assert_array_equal(results[0][0], base * 21)
    for root in range(6):
        np.testing.assert_array_equal(results[2][2 + root], base[:300] * (root + 1) + root)
    np.testing.assert_array_equal(results[5][8], base * (6 + 2 + 4))  # odd: ranks 5, 1, 3
    np.testing.assert_array_equal(results[1][10], base * (5 + 1 + 3 + 2))  # mix: 4, 0, 2, 1
    for r in (0, 2, 4):
        np.testing.assert_array_equal(results[r][9], base * 2)  # mix's last member is 1


def test_a_collective_needing_a_missing_endpoint_fails_at_once_and_keeps_step(
    make: Any,
) -> None:
    backends = make(3, init=False, timeout=20.0)
    address = {b.rank: b.endpoint for b in backends}
    for b in backends:  # rank 0 misses its successor 1; the others have every endpoint
        b.init(1, {r: "" if (b.rank, r) == (0, 1) else e for r, e in address.items()})
    started = time.monotonic()
    with pytest.raises(CommError, match="no data endpoint for rank 1 in epoch 1.*comm.peers"):
        backends[0].allreduce(np.ones(4))
    assert time.monotonic() - started < 1.0  # refused before sending or waiting
    with pytest.raises(CommError, match="no data endpoint for rank 1"):
        backends[0].send({"w": np.ones(2)}, 1, "t")
    # Refused before numbering: once the endpoint is added, every rank is in step again.
    backends[0].add_peers({1: address[1]})
    out = run_all(backends, lambda b: b.allreduce(np.full(4, b.rank + 1.0)))
    assert all((o == 6.0).all() for o in out)
    with pytest.raises(CommError, match=r"ranks \[7\] that are not members of epoch 1"):
        backends[0].add_peers({7: address[1]})


def test_a_repair_pair_sends_once_its_endpoint_is_added(make: Any) -> None:
    backends = make(8, init=False, timeout=20.0)
    wanted = build(backends, 1)
    src, dst = 2, 7
    assert dst not in wanted[src]  # not a neighbour of the sender: the Repair brings it
    with pytest.raises(CommError, match="no data endpoint for rank 7"):
        backends[src].send({"w": np.ones(3)}, dst, "repair.1.0")
    backends[src].add_peers({dst: backends[dst].endpoint})

    def body(b: HostBackend) -> Any:
        if b.rank == src:
            b.send({"w": np.arange(3.0)}, dst, "repair.1.0")
        if b.rank == dst:
            return b.recv(src, "repair.1.0")["w"]
        return None

    results = run_all(backends, body)
    np.testing.assert_array_equal(results[dst], np.arange(3.0))


def test_a_pair_group_made_after_the_build_uses_the_lane_on_both_sides(make: Any) -> None:
    """Rank 0 knows rank 2's endpoint from the build; rank 2 learns rank 0's only when the
    pair group is made (the manager's Peers answer, here add_peers). A two-member allreduce
    takes the lane only if both know each other's lane: one on the lane and one on ZeroMQ
    would wait for each other until the timeout."""
    backends = make(4, init=False, timeout=10.0)
    address = {b.rank: b.endpoint for b in backends}
    assert all("?lane=" in e for e in address.values())
    for b in backends:
        members = {r: e if (b.rank, r) != (2, 0) else "" for r, e in address.items()}
        b.init(1, members)
    backends[2].add_peers({0: address[0]})

    def body(b: HostBackend) -> Any:
        if b.rank not in (0, 2):
            return None
        b.create_group("pair", (0, 2))
        return b.allreduce(np.full(4096, b.rank + 1.0), group="pair")

    started = time.monotonic()
    results = run_all(backends, body)
    assert time.monotonic() - started < 5.0
    np.testing.assert_array_equal(results[0], np.full(4096, 4.0))
    np.testing.assert_array_equal(results[2], results[0])
