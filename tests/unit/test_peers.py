"""Which data endpoints a rank needs (ms_recover.comm.peers), and that a formation's REBUILDs
(one per node) carry O(log n + groups) endpoints per rank, linear in total, at 16,384 ranks,
of which each rank keeps exactly its own."""

from __future__ import annotations

import math
import random

import pytest

from ms_recover.comm.peers import group_targets, needs, needs_all, own_rebuild
from ms_recover.config import JobConfig
from ms_recover.manager.commands import peers_of_group, rebuild
from ms_recover.manager.model import JobModel
from ms_recover.protocol.codec import Codec
from ms_recover.protocol.messages import Rebuild


def test_a_member_sends_to_its_ring_successor_barrier_and_doubling_partners() -> None:
    order = list(range(10, 18))  # eight members: positions 0..7
    # position 5: +1, +2, +4 -> 6, 7, 1; XOR 1, 2, 4 -> 4, 7, 1
    assert group_targets(order, 5) == {16, 17, 11, 14}
    assert group_targets([7, 3], 1) == {7}  # two members: the one exchange
    assert group_targets([4], 0) == set()
    # Not a power of two: position 4 of 5 folds onto 0 (XOR 4); +1, +2, +4 wrap to 0, 1, 3.
    assert group_targets([0, 1, 2, 3, 4], 4) == {0, 1, 3}


def test_groups_follow_their_own_order_and_pairs_give_the_sender_its_receiver() -> None:
    world = range(8)
    groups = [("odd", (7, 1, 5, 3))]  # ring order as created, not sorted
    # world: +1, +2, +4 -> 2, 3, 5; XOR 1, 2, 4 -> 0, 3, 5. "odd" at position 1: +1, +2 ->
    # 5, 3; XOR 1, 2 -> 7, 3.
    assert needs(1, world, groups) == {0, 2, 3, 5} | {5, 3, 7}
    assert needs(1, world, groups, pairs=[(1, 6), (6, 1)]) == needs(1, world, groups) | {6}
    assert 1 not in needs(6, world, pairs=[(1, 6)]) - needs(6, world)
    # Members that left the world (elastic shrink) are never named.
    assert needs(0, [0, 2, 4], [("g", (0, 1, 2))]) == {2, 4}
    assert needs(9, world) == set()


@pytest.mark.parametrize("n", [2, 3, 5, 8, 13, 64, 100])
def test_every_rank_sent_to_by_the_rule_is_in_the_set(n: int) -> None:
    """The host algorithms' send targets (ring, exchange, chain, barrier) are all covered."""
    wanted = needs_all(range(n))
    for i in range(n):
        ring = {(i + 1) % n} - {i}
        barrier = {(i + 2**k) % n for k in range(max(0, math.ceil(math.log2(n))))} - {i}
        doubling = {i ^ 2**k for k in range(n.bit_length()) if i ^ 2**k < n} - {i}
        assert ring | barrier | doubling == wanted[i]
        assert len(wanted[i]) <= 2 * math.ceil(math.log2(n)) + 1


def test_formation_at_16384_ranks_sends_endpoints_linear_in_ranks() -> None:
    config = JobConfig(node_nums=2048, proc_per_node=8)
    m = JobModel(config)
    for r, info in m.ranks.items():
        info.endpoint = f"tcp://10.{r >> 16}.{(r >> 8) & 255}.{r & 255}:40000"
    for node in range(2048):  # a data-parallel group per local rank (size 2,048) and a
        m.group_log.add(f"tp{node}", config.ranks_of(node))  # tensor group per node (8)
    for local in range(8):
        m.group_log.add(f"dp{local}", list(range(local, 16384, 8)))
    sends = rebuild(m)
    assert [s.ranks for s in sends] == [tuple(config.ranks_of(node)) for node in range(2048)]
    counts = [len(s.msg.endpoints) for s in sends if isinstance(s.msg, Rebuild)]
    # world (n = 16,384) + dp (2,048) + tp (8): at most 2 * (14 + 11 + 3) + 3 peers a rank
    assert max(counts) <= 8 * (2 * (14 + 11 + 3) + 3)
    assert sum(counts) <= 59 * 16384  # linear: not 16,384 * 16,383
    world = list(range(16384))
    for s in sends[:8]:  # every endpoint sent is one of the rule's, with the right address
        assert isinstance(s.msg, Rebuild)
        assert set(s.msg.endpoints) == set().union(
            *(needs(rank, world, m.group_log) for rank in s.ranks)
        )
        assert all(m.ranks[q].endpoint == ep for q, ep in s.msg.endpoints.items())
        for rank in s.ranks:  # ... and each rank keeps its own: its peers, its groups
            members, groups = own_rebuild(rank, world, s.msg.endpoints, s.msg.group_log)
            assert {q for q, ep in members.items() if ep} == needs(rank, world, m.group_log)
            assert [name for name, _ in groups] == [f"tp{rank // 8}", f"dp{rank % 8}"]


def test_the_answer_to_a_new_group_names_the_peers_a_member_sends_to() -> None:
    m = JobModel(JobConfig(node_nums=4, proc_per_node=2))
    for r, info in m.ranks.items():
        info.endpoint = f"tcp://h{r}:1"
    reply = peers_of_group(m, 6, "g", [0, 2, 4, 6])
    assert reply is not None and reply.name == "g"
    # position 3 of 4: +1, +2 -> 0, 2; XOR 1, 2 -> 4, 2 (the world's peers came with REBUILD)
    assert reply.endpoints == {0: "tcp://h0:1", 2: "tcp://h2:1", 4: "tcp://h4:1"}
    assert peers_of_group(m, 1, "g", [0, 2, 4, 6]) is None


def _formation_bytes(nodes: int) -> list[int]:
    m = JobModel(JobConfig(node_nums=nodes, proc_per_node=8))
    for r, info in m.ranks.items():
        info.endpoint = f"tcp://10.0.{r >> 8}.{r & 255}:40000"
    codec = Codec("job", b"k" * 32)
    return [len(b"".join(codec.encode(s.msg, 1, "manager", 1))) for s in rebuild(m)]


def test_formation_payload_grows_linearly_not_with_the_square() -> None:
    """Bytes per node's REBUILD: a few thousand at 16,384 ranks (every endpoint was ~430 KB a
    rank), and from 2,048 to 16,384 ranks they grow like log n, not like n."""
    small, large = _formation_bytes(256), _formation_bytes(2048)
    assert len(large) == 2048 and max(large) < 8 * 1024
    per_rank_small, per_rank_large = sum(small) / len(small), sum(large) / len(large)
    assert per_rank_large < 1.5 * per_rank_small  # quadratic would be 8x


@pytest.mark.parametrize("seed", range(6))
def test_one_ranks_needs_are_the_rules(seed: int) -> None:
    """needs (a rank reading its part of its node's REBUILD) agrees with needs_all on
    worlds with holes and groups in their own order, inside the world or reaching past it."""
    rng = random.Random(seed)
    n = rng.choice([5, 16, 37, 200])
    world = sorted(rng.sample(range(n + 20), n))
    groups = [
        (f"g{k}", rng.sample(world if k % 2 else range(n + 20), rng.randint(1, min(n, 24))))
        for k in range(4)
    ]
    everyone = needs_all(world, groups)
    for rank in [*world, n + 40]:
        assert needs(rank, world, groups) == everyone.get(rank, set())


def test_a_rank_keeps_its_own_part_of_its_nodes_rebuild() -> None:
    endpoints = {q: f"tcp://h{q}:1" for q in range(8)}
    log = [["even", [0, 2, 4, 6]], ["odd", [1, 3, 5, 7]], ["low", [0, 1]]]
    members, groups = own_rebuild(1, list(range(8)), endpoints, log)
    assert groups == [["odd", [1, 3, 5, 7]], ["low", [0, 1]]]
    peers = needs(1, range(8), [("odd", [1, 3, 5, 7]), ("low", [0, 1])])
    assert members == {q: (f"tcp://h{q}:1" if q in peers else "") for q in range(8)}
