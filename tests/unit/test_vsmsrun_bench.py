"""``bench overhead``'s 2-rank row (our GraphStep step vs msrun's in-graph mccl step): the runs
it starts, in ABBA order with the element count handed on, and its rows, target and verdicts
(a cluster that gave no time is a MISS naming why, never ``-``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ms_recover.bench import mscluster, vsmsrun

RATIO = "2 ranks, demo MLP, GRAPH_MODE: ours vs msrun's mccl DistributedGradReducer step"


class FakeRunner:
    def __init__(self, step_s: list[float], order: list[str]) -> None:
        self.step_s, self.order = step_s, order
        self.calls: list[tuple[str, int, list[str] | None]] = []

    def job(self, mode: str, procs: int, extra: list[str] | None = None) -> list[dict[str, Any]]:
        self.order.append("ours")
        self.calls.append((mode, procs, extra))
        s = self.step_s.pop(0)
        return [{"elements": 9352, "step_times": [s, s, 9.0]} for _ in range(procs)]


def test_runs_alternate_and_the_ratio_is_ours_over_msruns_with_a_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    order: list[str] = []
    plans: list[mscluster.Plan] = []

    def fake_measure(plan: mscluster.Plan, workdir: Path, limits: Any) -> mscluster.Outcome:
        order.append("msrun")
        plans.append(plan)
        return mscluster.Outcome({9352: [[0.004, 0.004, 1.0], [0.005, 0.005, 1.0]]})

    runner = FakeRunner([0.002, 0.003], order)
    monkeypatch.setattr(mscluster, "measure", fake_measure)
    got = vsmsrun.measure(runner, tmp_path, steps=300, repeats=2, timeout_s=60.0)
    assert order == ["ours", "msrun", "msrun", "ours"]
    assert runner.calls[0][:2] == ("session", 2) and "--graph-step" in (runner.calls[0][2] or [])
    assert plans[0].counts == (9352,) and plans[0].world == 2 and plans[0].repeats == 300
    assert plans[0].program == vsmsrun.PROGRAM
    rows = {m.name: m for m in vsmsrun.rows(got)}
    ratio = rows[RATIO]
    assert ratio.value == pytest.approx(0.0025 / 0.0045) and ratio.target == "< 1 x"
    assert ratio.verdict == "PASS"
    slower = dict(got, ours_s=[0.006])
    assert {m.name: m for m in vsmsrun.rows(slower)}[RATIO].verdict == "MISS"


def test_a_cluster_that_gave_no_time_is_a_miss_naming_why() -> None:
    got = {"ours_s": [0.002], "msrun_s": [], "reason": "did not form within 60 s", "steps": 300}
    ratio = {m.name: m for m in vsmsrun.rows(got)}[RATIO]
    assert ratio.verdict == "MISS" and "did not form within 60 s" in ratio.failed


def test_the_first_steps_are_compared_alone_as_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow start of one arm shows in its own row, without a target; the ratio with the
    target stays the whole runs'."""
    early, later = vsmsrun.EARLY, 2 * vsmsrun.EARLY

    def fake_measure(plan: mscluster.Plan, workdir: Path, limits: Any) -> mscluster.Outcome:
        return mscluster.Outcome({9352: [[0.004] * (early + later)] * 2})

    class SlowStart(FakeRunner):
        def job(self, mode: str, procs: int, extra: list[str] | None = None) -> list[dict]:
            return [{"elements": 9352, "step_times": [0.008] * early + [0.002] * later}] * procs

    monkeypatch.setattr(mscluster, "measure", fake_measure)
    got = vsmsrun.measure(SlowStart([], []), tmp_path, steps=early + later, repeats=1, timeout_s=9)
    rows = {m.name: m for m in vsmsrun.rows(got)}
    assert rows[RATIO].value == pytest.approx(0.5) and rows[RATIO].verdict == "PASS"
    (first,) = [m for name, m in rows.items() if "first 400 timed steps" in name]
    assert first.value == pytest.approx(2.0) and first.target == "-"
    older = {k: v for k, v in got.items() if not k.endswith("_early_s")}  # an older run's JSON
    assert len(vsmsrun.rows(older)) == len(rows) - 1
