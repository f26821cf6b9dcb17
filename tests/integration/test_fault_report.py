"""A fault event explains the fault (issue 29, item 5): a rank that dies of a Python exception
is reported with its host, pid, exit code and traceback; one killed by a signal with the signal
and its log's last lines. Numpy ranks under real agents, manager in a thread."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from ms_recover.localrun.job import LocalJob
from ms_recover.localrun.wait import wait_for

from .jobs import job_config

pytestmark = pytest.mark.timeout(120)

TRAIN = """
import os, signal, sys, time, numpy as np, ms_recover
out = sys.argv[1]
session = ms_recover.init()
def load_shard(step):
    raise RuntimeError(f"shard file for step {step} is corrupt")
for step in session.steps(40):
    with session.guard():
        mark = os.path.join(out, f"fault{session.rank}")
        if step == 8 and session.rank in (1, 2) and not os.path.exists(mark):
            open(mark, "w").close()
            if session.rank == 1:
                load_shard(step)
            print("rank 2 about to be killed", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        session.allreduce(np.ones(4, np.float32), "sum"); time.sleep(0.005)
session.finish()
"""


def _faults(tmp_path: Path) -> dict[int, dict[str, Any]]:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    config = job_config("recover-in-place,exit", node_nums=2, proc_per_node=2)
    command = [sys.executable, str(script), str(tmp_path)]
    env = {"OPENBLAS_NUM_THREADS": "1"}
    with LocalJob(config, command, env, log_dir=str(tmp_path / "logs")) as job:
        assert job.wait(90), job.status()
        wait_for(lambda: len(job.find("fault", kind="rank_exit")) >= 2, 10, "both faults")
        shown = job.status()["last_faults"]  # what `ms-recover status` shows
        assert {f["rank"] for f in shown} >= {1, 2} and all(f["host"] for f in shown)
        return {e["rank"]: e for e in job.find("fault", kind="rank_exit")}


def test_fault_events_carry_host_pid_exit_and_traceback(tmp_path: Path) -> None:
    faults = _faults(tmp_path)
    raised, killed = faults[1], faults[2]
    assert raised["host"] == socket.gethostname() == killed["host"]
    assert raised["exit_code"] == 1 and raised["signal"] == 0 and raised["pid"] > 0
    assert "Traceback (most recent call last)" in raised["log_tail"]
    assert "load_shard" in raised["log_tail"]
    assert "RuntimeError: shard file for step 8 is corrupt" in raised["log_tail"]
    assert killed["signal"] == 9 and killed["exit_code"] == 137
    assert "rank 2 about to be killed" in killed["log_tail"]  # no traceback: the log's end
    assert len(raised["log_tail"]) <= 4000
