"""The repair planner: target step, who receives, who sends, shards and bad sources."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ms_recover.errors import RepairError
from ms_recover.manager.planner import RepairPlan, plan_repair, target_step


def _dp(n: int) -> dict[int, int]:
    """Pure data parallel: every rank is a replica of shard 0."""
    return {r: 0 for r in range(n)}


def test_target_step_is_the_highest_survivor_step() -> None:
    steps = {0: 10, 1: 12, 2: 11, 3: 99}
    assert target_step(steps, {0, 1, 2}) == 12  # rank 3 is being replaced: its step does not count
    assert target_step(steps, {0}) == 10
    assert target_step(steps, set()) == -1
    assert target_step({0: -1, 1: -1}, {0, 1}) == -1


def test_a_restarted_rank_gets_a_source_at_the_target() -> None:
    steps = {0: 12, 1: 12, 2: 12, 3: -1}
    plan = plan_repair(steps, _dp(4), missing={3}, target=12)
    assert plan.target_step == 12
    assert set(plan.recv_from) == {3}
    src = plan.recv_from[3]
    assert src in {0, 1, 2} and steps[src] == 12
    assert plan.send_to(src) == [3] and not plan.empty


def test_a_missing_rank_is_repaired_even_if_it_reports_the_target_step() -> None:
    plan = plan_repair({0: 5, 1: 5}, _dp(2), missing={1}, target=5)
    assert plan.recv_from == {1: 0}


def test_a_rank_behind_the_target_is_repaired() -> None:
    steps = {0: 12, 1: 11, 2: 12, 3: 12}
    plan = plan_repair(steps, _dp(4), missing=set(), target=12)
    assert list(plan.recv_from) == [1]
    assert steps[plan.recv_from[1]] == 12


def test_nothing_to_do_when_everyone_is_at_the_target() -> None:
    plan = plan_repair({0: 7, 1: 7}, _dp(2), missing=set(), target=7)
    assert plan == RepairPlan(7, {}) and plan.empty
    assert plan.send_to(0) == []


def test_sources_are_spread_across_replicas() -> None:
    steps = {0: 20, 1: 20, 2: -1, 3: -1}
    plan = plan_repair(steps, _dp(4), missing={2, 3}, target=20)
    assert set(plan.recv_from) == {2, 3}
    assert plan.recv_from[2] != plan.recv_from[3]
    assert {plan.recv_from[2], plan.recv_from[3]} == {0, 1}
    assert plan.send_to(0) == [2] or plan.send_to(0) == [3]


def test_load_is_balanced_with_more_receivers_than_sources() -> None:
    steps = {0: 3, 1: 3, 2: -1, 3: -1, 4: -1, 5: -1}
    plan = plan_repair(steps, _dp(6), missing={2, 3, 4, 5}, target=3)
    assert sorted(len(plan.send_to(s)) for s in (0, 1)) == [2, 2]


def test_receivers_only_get_a_same_shard_source() -> None:
    # two data-parallel replicas of a 2-way sharded model: shard = rank % 2
    shards = {0: 0, 1: 1, 2: 0, 3: 1}
    steps = {0: 9, 1: 9, 2: -1, 3: -1}
    plan = plan_repair(steps, shards, missing={2, 3}, target=9)
    assert plan.recv_from == {2: 0, 3: 1}
    for dst, src in plan.recv_from.items():
        assert shards[src] == shards[dst]


def test_bad_sources_are_excluded() -> None:
    steps = {0: 9, 1: 9, 2: 9, 3: -1}
    plan = plan_repair(steps, _dp(4), missing={3}, target=9, bad_sources=frozenset({0, 1}))
    assert plan.recv_from == {3: 2}


def test_a_source_must_be_at_exactly_the_target() -> None:
    steps = {0: 8, 1: 9, 2: -1}
    plan = plan_repair(steps, _dp(3), missing={2}, target=9)
    assert plan.recv_from == {0: 1, 2: 1}  # rank 0 is behind: a receiver too, never a source


def test_no_healthy_replica_left_names_the_shard_and_ranks() -> None:
    shards = {0: 0, 1: 1, 2: 0, 3: 1}
    steps = {0: 9, 1: -1, 2: 9, 3: -1}
    with pytest.raises(RepairError) as info:
        plan_repair(steps, shards, missing={1, 3}, target=9)
    text = str(info.value)
    assert "no healthy replica at step 9 for rank 1" in text
    assert "shard 1" in text and "replicas [1, 3]" in text


def test_every_replica_bad_is_a_repair_error() -> None:
    with pytest.raises(RepairError, match=r"bad sources \[0, 1\]"):
        plan_repair({0: 4, 1: 4, 2: -1}, _dp(3), {2}, 4, frozenset({0, 1}))


def test_target_minus_one_means_nothing_committed_and_nothing_to_copy() -> None:
    steps = {0: -1, 1: -1, 2: -1}
    assert plan_repair(steps, _dp(3), missing={1, 2}, target=-1) == RepairPlan(-1, {})


def test_the_plan_is_deterministic() -> None:
    steps = {r: (15 if r % 3 else -1) for r in range(12)}
    missing = {r for r in range(12) if r % 3 == 0}
    plans = [plan_repair(dict(steps), _dp(12), set(missing), 15) for _ in range(3)]
    reordered = plan_repair(dict(reversed(list(steps.items()))), _dp(12), missing, 15)
    assert plans[0] == plans[1] == plans[2] == reordered


@settings(deadline=None)
@given(
    st.integers(2, 12).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.lists(st.integers(0, 2), min_size=n, max_size=n),  # shard per rank
            st.lists(st.integers(0, 3), min_size=n, max_size=n),  # step per rank
            st.sets(st.integers(0, n - 1)),  # missing
        )
    )
)
def test_plan_invariants(case: tuple[int, list[int], list[int], set[int]]) -> None:
    n, shard_list, step_list, missing = case
    shards = dict(enumerate(shard_list))
    steps = dict(enumerate(step_list))
    survivors = set(range(n)) - missing
    target = target_step(steps, survivors)
    try:
        plan = plan_repair(steps, shards, missing, target)
    except RepairError:
        # only when some shard that needs state has no survivor at the target
        needy = {r for r in range(n) if r in missing or steps[r] < target}
        assert any(
            not [s for s in survivors if shards[s] == shards[d] and steps[s] == target]
            for d in needy
        )
        return
    for dst, src in plan.recv_from.items():
        assert shards[src] == shards[dst]
        assert steps[src] == target and src not in missing and src not in plan.recv_from
    if target >= 0:
        assert set(plan.recv_from) == {r for r in range(n) if r in missing or steps[r] < target}
