"""Fail-slow detection on a 2 nodes x 2 ranks job whose ranks each wait ~30 ms per step on
"device work" (the host waits on the accelerator, as on a real cluster: four busy-spinning ranks
on this 2-core host would measure the CPU scheduler, not the ranks), then an allreduce: a rank
slowed to 1.5x its peers by a fault hook that stretches its compute is flagged within 50 steps;
the same job without a slowdown flags nothing. Nothing acts on a flag yet (report only): the job
runs on untouched. The compute-hang scenario (named culprit, only it replaced, bit-identical) is
a row of the fault matrix (test_fault_matrix.py)."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from ms_recover.testing.faults import Faults
from ms_recover.testing.localjob import LocalJob

from .jobs import job_config, run_to_end

pytestmark = pytest.mark.timeout(240)

STEPS, SLOW_FROM, WITHIN = 150, 60, 50

TRAIN = """
import sys, time, numpy as np, ms_recover
session = ms_recover.init()
for step in session.steps(int(sys.argv[1])):
    with session.guard():
        time.sleep(0.03)  # ~30 ms of device work, outside the collective
        session.allreduce(np.ones(8, np.float32), "sum")
session.finish()
"""


def run(tmp_path: Any, faults: Faults | None) -> list[dict[str, Any]]:
    script = os.path.join(str(tmp_path), "train.py")
    with open(script, "w") as fh:
        fh.write(TRAIN)
    env = {"OPENBLAS_NUM_THREADS": "1", **(faults.to_env() if faults else {})}
    logs = os.path.join(str(tmp_path), "logs")
    with LocalJob(job_config(), [sys.executable, script, str(STEPS)], env, log_dir=logs) as job:
        run_to_end(job, 200.0)
    assert job.exit_code == 0
    assert job.find("recovery") == [] and job.find("fault") == []  # reported only
    return job.find("flagged")


def test_a_rank_slowed_to_1_5x_is_flagged_within_50_steps(tmp_path: Any) -> None:
    flags = run(tmp_path, Faults().add("slow", rank=1, step=SLOW_FROM))
    assert [f["rank"] for f in flags] == [1], flags
    flag = flags[0]
    assert SLOW_FROM <= flag["step"] <= SLOW_FROM + WITHIN, flag
    assert (flag["node"], flag["host"], flag["reason"]) == (0, "127.0.0.1", "slow")
    assert flag["score"] >= 1.3 and flag["compute_s"] > flag["reference_s"] > 0


def test_no_flag_without_a_slowdown(tmp_path: Any) -> None:
    assert run(tmp_path, None) == []
