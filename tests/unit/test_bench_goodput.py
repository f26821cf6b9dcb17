"""``bench goodput``'s pure parts: the seeded schedules, the ETTR arithmetic, the projection
model, and the rows built from arms' results (targets, PASS/MISS, a failed arm a MISS)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from ms_recover.bench import goodput
from ms_recover.bench import goodputmodel as gm
from ms_recover.errors import ConfigError


def test_schedules_are_seeded_and_the_same_for_the_same_arguments() -> None:
    for name in gm.SCHEDULES:
        a = gm.schedule(name, 120.0, 7, 2, 2)
        assert a == gm.schedule(name, 120.0, 7, 2, 2)
        assert a != gm.schedule(name, 120.0, 8, 2, 2), "another seed, another schedule"


@pytest.mark.parametrize("budget,n", [(10.0, 2), (120.0, 2), (150.0, 2), (210.0, 4), (600.0, 10)])
def test_every_run_sees_at_least_two_faults_at_the_mean_rate(budget: float, n: int) -> None:
    assert gm.fault_count(budget) == n
    faults = gm.schedule("kills", budget, 0, 2, 2)
    assert len(faults) == n
    times = [f.at_s for f in faults]
    assert times == sorted(times)
    assert times[0] >= gm.LEAD * budget and times[-1] < (1 - gm.TAIL) * budget
    slot = (1 - gm.LEAD - gm.TAIL) * budget / n
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert all(g >= (1 - gm.SLOT_USE) * slot - 1e-3 for g in gaps), "recoveries do not overlap"


def test_schedule_kinds_and_targets() -> None:
    assert {f.kind for f in gm.schedule("kills", 300, 1, 2, 2)} == {"kill"}
    nodes = gm.schedule("nodes", 300, 1, 2, 2)
    assert {f.kind for f in nodes} == {"node"}
    assert all(f.rank == f.node * 2 and f.node == 1 for f in nodes), "never the manager's node"
    wide = gm.schedule("nodes", 600, 1, 4, 2)
    assert all(1 <= f.node < 4 for f in wide) and len({f.node for f in wide}) > 1
    mixed = gm.schedule("mixed", 240, 3, 2, 2)  # 4 faults: every kind once
    assert sorted(f.kind for f in mixed) == sorted(gm.MIXED_KINDS)
    for f in mixed:
        assert 0 <= f.rank < 4 and f.node == f.rank // 2 if f.kind != "node" else True


def test_every_mixed_run_has_a_hang_and_distinct_kinds_up_to_four() -> None:
    for seed in range(30):
        for budget in (120.0, 180.0):
            kinds = [f.kind for f in gm.schedule("mixed", budget, seed, 2, 2)]
            assert "hang" in kinds and len(set(kinds)) == len(kinds)
    seen = {tuple(f.kind for f in gm.schedule("mixed", 120.0, s, 2, 2)) for s in range(30)}
    assert {k for pair in seen for k in pair} == set(gm.MIXED_KINDS), "every kind is drawn"


def test_a_transient_error_goes_to_a_rank_no_earlier_fault_replaced() -> None:
    for seed in range(40):
        faults = gm.schedule("mixed", 240, seed, 2, 2)
        for i, f in enumerate(faults):
            hit = set(gm.replaced_ranks(faults[:i], 2))
            if f.kind == "transient" and len(hit) < 4:  # else it hits a later incarnation
                assert f.rank not in hit


def test_schedule_rejects_bad_input_naming_the_valid_values() -> None:
    with pytest.raises(ValueError, match="kills, nodes, mixed"):
        gm.schedule("storms", 120, 0, 2, 2)
    with pytest.raises(ValueError, match="at least 2 ranks"):
        gm.schedule("kills", 120, 0, 1, 1)
    with pytest.raises(ValueError, match="positive"):
        gm.fault_count(0)


def test_ettr_and_cost_per_fault() -> None:
    assert gm.ettr_pct(980, 1000) == pytest.approx(98.0)
    assert gm.ettr_pct(-5, 1000) == 0.0
    # 20 steps missing at 1000 steps / 100 s = 2 s, over 2 faults: 1 s each.
    assert gm.cost_per_fault_s(980, 1000, 100.0, 2) == pytest.approx(1.0)
    assert gm.cost_per_fault_s(1010, 1000, 100.0, 2) == 0.0, "noise above (c) costs nothing"
    with pytest.raises(ValueError):
        gm.ettr_pct(1, 0)


def test_last_checkpoint_of_a_job_saving_after_every_kth_step() -> None:
    # Saved after steps 99, 199, ...
    assert [gm.last_checkpoint(s, 100) for s in (0, 98, 99, 150, 199, 200)] == [
        -1,
        -1,
        99,
        99,
        199,
        199,
    ]


def test_projection_model() -> None:
    assert gm.projected_ettr_pct(0.6, 6480.0) == pytest.approx(100 * (1 - 0.6 / 6480))
    assert gm.projected_ettr_pct(1000.0, 840.0) == 0.0
    assert dict(gm.PUBLISHED_MTTF_S)["16,384 GPUs (MTTF 1.8 h)"] == pytest.approx(6480.0)


def _settings(**kw: Any) -> goodput.Settings:
    base = dict(
        budget_s=100.0,
        schedules=("kills",),
        seed=0,
        mean_s=50.0,
        nodes=2,
        procs_per_node=2,
        ckpt_every=100,
        timeout_s=60.0,
    )
    return goodput.Settings(**{**base, **kw})  # type: ignore[arg-type]


def _result(ours: dict[str, Any], msrun: dict[str, Any], clean: int = 1000) -> dict[str, Any]:
    faults = gm.schedule("kills", 100.0, 0, 2, 2, 50.0)
    return {
        "clean": {"steps": clean},
        "schedules": {
            "kills": {"faults": [f.__dict__ for f in faults], "ours": ours, "msrun": msrun}
        },
    }


OURS = {
    "steps": 985,
    "clean_rate": 10.5,
    "state_at_end": "running",
    "recoveries": [{"ok": True, "mttr_s": 0.5, "lost_steps": 2}] * 2,
}
MSRUN = {"steps": 500, "clean_rate": 8.0, "launches": 3, "relaunches": [{"relaunch_s": 9.0}]}


def test_rows_targets_and_the_ratio() -> None:
    rows = {m.name: m for m in goodput.report(_settings(), _result(OURS, MSRUN), "w").measures}
    ours = rows["goodput kills: ETTR (a) ms_recover"]
    assert (ours.value, ours.target, ours.verdict) == (pytest.approx(98.5), ">= 98 %", "PASS")
    # 1050 steps at its own 10.5 steps/s before the first fault; 65 missing, 2 faults.
    cost = rows["goodput kills: (a) productive time one fault cost"].value
    assert cost == pytest.approx(65 / 10.5 / 2)
    own_a = rows["goodput kills: ETTR (a) ms_recover vs its own rate before the first fault"]
    assert own_a.value == pytest.approx(985 / 1050 * 100) and own_a.verdict == "-"
    assert rows["goodput kills: ETTR (b) plain msrun, restart + checkpoint"].value == 50.0
    own = rows["goodput kills: ETTR (b) plain msrun vs its own fault-free rate"]
    assert own.value == pytest.approx(500 / 800 * 100)
    ratio = rows["goodput kills: ETTR (a) ms_recover / ETTR (b) plain msrun"]
    assert ratio.value == pytest.approx(98.5 / 62.5) and ratio.verdict == "PASS"
    model = [m for m in rows.values() if m.name.startswith("model, not measured")]
    assert len(model) == 4 and all(m.verdict == "-" for m in model)


def test_a_low_ettr_is_a_miss_and_a_failed_arm_a_miss_naming_why() -> None:
    low = {**OURS, "steps": 900}
    rows = {m.name: m for m in goodput.report(_settings(), _result(low, MSRUN), "w").measures}
    assert rows["goodput kills: ETTR (a) ms_recover"].verdict == "MISS"
    failed = goodput.report(_settings(), _result({"failed": "boom"}, {"failed": "no msrun"}), "w")
    by = {m.name: m for m in failed.measures}
    assert by["goodput kills: ETTR (a) ms_recover"].failed == "boom"
    assert "no msrun" in by["goodput kills: ETTR (b) plain msrun"].failed
    nothing = goodput.report(_settings(), {"clean": {"failed": "x"}, "schedules": {}}, "w")
    assert [m.verdict for m in nothing.measures] == ["MISS"]


def test_settings_reject_bad_flags_with_one_clear_line() -> None:
    args = argparse.Namespace(
        budget_s=0.0,
        schedule="all",
        seed=0,
        mean_s=60.0,
        nodes=2,
        procs_per_node=2,
        ckpt_every=0,
        timeout=60.0,
    )
    with pytest.raises(ConfigError, match="--budget-s must be a positive.*--ckpt-every"):
        goodput.settings_of(args)
    args.budget_s, args.ckpt_every = 120.0, 100
    assert goodput.settings_of(args).schedules == gm.SCHEDULES


def test_node_losses_run_with_one_spare_node_and_the_row_says_so() -> None:
    nodes = gm.schedule("nodes", 100.0, 0, 2, 2, 50.0)
    assert goodput.spare_pods_for(nodes) == 1
    assert goodput.spare_pods_for(gm.schedule("kills", 100.0, 0, 2, 2, 50.0)) == 0
    promoted = [{"node_rank": 1, "waited_s": 2.1}, {"node_rank": 1, "waited_s": 2.3}]
    ours = {**OURS, "spare_pods": 1, "promoted": promoted}
    result = {
        "clean": {"steps": 1000},
        "schedules": {
            "nodes": {"faults": [f.__dict__ for f in nodes], "ours": ours, "msrun": MSRUN}
        },
    }
    cfg = _settings(schedules=("nodes",))
    rows = {m.name: m for m in goodput.report(cfg, result, "w").measures}
    row = rows["goodput nodes: ETTR (a) ms_recover with one spare node"]
    assert row.target == ">= 95 %" and row.verdict == "PASS"
    assert "one spare node" in row.note and "2 promoted, 2.10, 2.30 s" in row.note
