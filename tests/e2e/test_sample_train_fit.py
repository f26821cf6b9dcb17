"""samples/train_fit.py, the documented ``Model.train`` script, under a real local job with a
kill -9, and alone."""

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

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "train_fit.py"
STEPS_PER_EPOCH = 4096 // 64


def test_fit_sample_survives_kill_9(tmp_path: Path) -> None:
    config = JobConfig(
        job_id="sample-fit",
        node_nums=1,
        proc_per_node=2,
        strategies=parse_strategies("recover-in-place,exit"),
    )
    command = [sys.executable, str(SAMPLE), "--epochs", "2"]
    job = LocalJob(
        config, command, Faults().kill(rank=1, step=40).to_env(), log_dir=str(tmp_path / "logs")
    )
    with job:
        assert job.wait(240), job.status()
    decisions = [(e.get("strategy"), e.get("reason")) for e in job.find("decision")]
    assert job.exit_code == 0, (decisions, job.find("fault"))
    recovery = job.find("recovery", ok=True)[-1]
    assert recovery["replaced"] == [1] and recovery["lost_steps"] == 0
    last = 2 * STEPS_PER_EPOCH - 1
    assert [r["step"] for r in job.status()["ranks"]] == [last, last]
    log = (tmp_path / "logs" / "rank_0.log").read_text()
    assert "step 100 loss" in log  # rank 0 trained on past the recovery


def test_fit_sample_alone_runs_as_a_single_job(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MS_ROLE"}
    out = subprocess.run(
        [sys.executable, str(SAMPLE), "--epochs", "1"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr.count("running as a plain single-process job") == 1
    assert "step 0 loss" in out.stdout and "step 50 loss" in out.stdout
    # ms_recover's own MindSpore calls log no deprecation (nn.Adam's own FusedSparseAdam does)
    lines = (out.stdout + out.stderr).splitlines()
    assert [x for x in lines if "deprecated" in x and "FusedSparseAdam" not in x] == []
