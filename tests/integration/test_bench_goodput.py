"""``bench goodput`` end to end with a tiny budget: the real LocalJob, manager, agents and fault
injection for (c) and (a), the real msrun CLI and its restart loop for (b), with stand-in rank
programs (the numpy trainer under ms_recover, ``bench recovery``'s msrun stand-in for plain
msrun) so it runs in seconds. Checked: every scheduled fault was injected and recovered from,
the counts are consistent, the table has its rows, and no process is left behind."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ms_recover import env as E
from ms_recover.bench import goodput

from .jobs import running_with
from .test_bench_msrun_restart import STAND_IN

pytestmark = pytest.mark.timeout(240)


def test_bench_goodput_kills_tiny_budget(tmp_path: Path) -> None:
    program = tmp_path / "stand_in_rank.py"
    program.write_text(STAND_IN)

    def ours(out: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "ms_recover.localrun.numpy_trainer",
            *("--steps", "10000000", "--out", out, "--step-time", "0.01"),
        ]

    programs = goodput.Programs(ours, [sys.executable, str(program)], {E.STANDBY: "off"})
    cfg = goodput.Settings(
        budget_s=12.0,
        schedules=("kills",),
        seed=1,
        mean_s=6.0,
        nodes=2,
        procs_per_node=2,
        ckpt_every=20,
        timeout_s=60.0,
    )
    work = tmp_path / "work"
    logs: list[str] = []
    result = goodput.measure(cfg, programs, str(work), logs.append)
    assert running_with(str(program)) == [], "an msrun worker was left behind"
    assert running_with(str(work)) == [], "a rank of ours was left behind"

    clean = result["clean"]
    assert clean.get("failed") is None and clean["steps"] > 50
    got = result["schedules"]["kills"]
    assert len(got["faults"]) == 2 and {f["kind"] for f in got["faults"]} == {"kill"}
    ours_arm, msrun_arm = got["ours"], got["msrun"]
    assert ours_arm.get("failed") is None, ours_arm
    assert len(ours_arm["injected"]) == 2
    assert len([r for r in ours_arm["recoveries"] if r["ok"]]) >= 2
    assert 0 < ours_arm["steps"] <= clean["steps"] * 1.5
    assert ours_arm["clean_rate"] > 0, "the rate before the first fault"
    assert ours_arm["ledger"]["wall_s"] == pytest.approx(cfg.budget_s, abs=0.5)
    assert msrun_arm.get("failed") is None, msrun_arm
    assert len(msrun_arm["injected"]) >= 1 and msrun_arm["launches"] >= 2
    assert msrun_arm["clean_rate"] > 0 and msrun_arm["steps"] >= 0

    rep = goodput.report(cfg, result, str(work))
    names = [m.name for m in rep.measures]
    assert "goodput kills: ETTR (a) ms_recover" in names
    assert "goodput kills: ETTR (b) plain msrun, restart + checkpoint" in names
    ettr = next(m for m in rep.measures if m.name == "goodput kills: ETTR (a) ms_recover")
    assert ettr.value == pytest.approx(100 * ours_arm["steps"] / clean["steps"])
    assert ettr.verdict in ("PASS", "MISS")
    assert "goodput: kills: kill of rank" in "\n".join(logs)
