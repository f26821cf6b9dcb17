"""Fail-slow detection on the numpy trainer (2 nodes x 2 ranks, ~30 ms of compute per step):
a rank slowed to 1.5x its peers by a fault hook that stretches its compute, and separately by
a duty-cycled SIGSTOP, is flagged within 50 steps; the same job without a slowdown flags
nothing. Under the default sub-health policy (report only) the job runs on untouched. The
compute-hang scenario (named culprit, only it replaced, bit-identical) is a row of the fault
matrix (test_fault_matrix.py)."""

from __future__ import annotations

from typing import Any

import pytest

from ms_recover.testing.faults import Faults

from .jobs import run_to_end, trainer_job

pytestmark = pytest.mark.timeout(180)

STEPS, SLOW_FROM, WITHIN = 140, 50, 50


def run(tmp_path: Any, faults: Faults | None) -> tuple[list[dict[str, Any]], Any]:
    out = str(tmp_path)
    with trainer_job(out, faults, steps=STEPS, extra=("--step-time", "0.03")) as job:
        run_to_end(job, 150.0)
    assert job.exit_code == 0
    assert job.find("recovery") == [] and job.find("fault") == []  # reported only
    return job.find("flagged"), job


@pytest.mark.parametrize("kind", ["slow", "stopcycle"])
def test_a_rank_slowed_to_1_5x_is_flagged_within_50_steps(tmp_path: Any, kind: str) -> None:
    flags, _ = run(tmp_path, Faults().add(kind, rank=1, step=SLOW_FROM))
    assert [f["rank"] for f in flags] == [1], flags
    flag = flags[0]
    assert SLOW_FROM <= flag["step"] <= SLOW_FROM + WITHIN, flag
    assert (flag["node"], flag["host"], flag["reason"]) == (0, "127.0.0.1", "slow")
    assert flag["score"] >= 1.3 and flag["compute_s"] > flag["reference_s"] > 0


def test_no_flag_without_a_slowdown(tmp_path: Any) -> None:
    flags, _ = run(tmp_path, None)
    assert flags == []
