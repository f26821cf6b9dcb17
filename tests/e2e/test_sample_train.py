"""samples/train.py, the documented training script, under a real local job with a kill -9."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ms_recover.config import JobConfig
from ms_recover.localrun.faults import Faults
from ms_recover.localrun.job import LocalJob
from ms_recover.strategy import parse_strategies

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]
SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "train.py"


def test_sample_survives_kill_9(tmp_path):
    config = JobConfig(
        job_id="sample",
        node_nums=1,
        proc_per_node=2,
        strategies=parse_strategies("recover-in-place,exit"),
    )
    command = [sys.executable, str(SAMPLE), "--steps", "120"]
    job = LocalJob(
        config, command, Faults().kill(rank=0, step=50).to_env(), log_dir=str(tmp_path / "logs")
    )
    with job:
        assert job.wait(200), job.status()
    assert job.exit_code == 0
    recovery = job.find("recovery", ok=True)[-1]
    assert recovery["replaced"] == [0] and recovery["lost_steps"] == 0
    assert [r["step"] for r in job.status()["ranks"]] == [119, 119]
    log = (tmp_path / "logs" / "rank_0.log").read_text()
    assert "step 100 loss" in log  # the restarted rank 0 went on training


def test_sample_alone_runs_as_a_single_job_with_one_warning(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MS_ROLE"}
    out = subprocess.run(
        [sys.executable, str(SAMPLE), "--steps", "3"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr.count("running as a plain single-process job") == 1
    assert "step 0 loss" in out.stdout
