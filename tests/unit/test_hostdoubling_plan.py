"""The recursive-doubling schedule (pure): partners within the peers rule, symmetric, complete."""

from __future__ import annotations

from collections import Counter

import pytest

from ms_recover.comm.host.doubling import plan
from ms_recover.comm.peers import group_targets

SIZES = [*range(1, 34), 63, 64, 65, 100]


@pytest.mark.parametrize("n", SIZES)
def test_every_partner_is_an_endpoint_the_rank_is_given(n: int) -> None:
    order = list(range(100, 100 + n))  # ranks unlike positions
    for i in range(n):
        given = {order.index(r) for r in group_targets(order, i)}
        assert plan(n, i).targets() <= given, (n, i)


@pytest.mark.parametrize("n", SIZES)
def test_partners_agree_on_each_other(n: int) -> None:
    plans = [plan(n, i) for i in range(n)]
    depth = {len(p.stages) for p in plans if p.fold_to is None}
    assert len(depth) == 1  # every doubling position runs the same number of stages
    for i, me in enumerate(plans):
        for k, partner in enumerate(me.stages):
            assert plans[partner].stages[k] == i
        if me.fold_from is not None:
            assert plans[me.fold_from].fold_to == i and me.fold_from > i
        if me.fold_to is not None:
            assert plans[me.fold_to].fold_from == i and not me.stages


@pytest.mark.parametrize("n", SIZES)
def test_every_position_ends_with_every_contribution_once(n: int) -> None:
    plans = [plan(n, i) for i in range(n)]
    held = [Counter([i]) for i in range(n)]
    for i, me in enumerate(plans):
        if me.fold_from is not None:
            held[i] += held[me.fold_from]
    for k in range(len(plans[0].stages)):
        pairs = zip(held, plans, strict=True)
        held = [h + held[p.stages[k]] if p.fold_to is None else h for h, p in pairs]
    for i, me in enumerate(plans):
        if me.fold_to is not None:
            held[i] = held[me.fold_to]
    assert all(h == Counter(range(n)) for h in held), n


def test_a_position_outside_the_group_is_refused() -> None:
    with pytest.raises(ValueError, match="position 3 is not in a group of 3"):
        plan(3, 3)
