"""The manager's own stall is not its members' silence (ms_recover.manager.hearing).

The manager is a process of node 0's pod (no standby); the test stops it (SIGSTOP) for 2.5 s,
longer than the 2 s silence window, four times while the job trains. The agents beat all
along; their frames wait in the socket buffers. Before the fix, about one stop in three ended
with the manager's first read finding ZeroMQ's queue empty (its I/O thread had not read the
sockets yet) and both nodes declared lost at once; now the job runs on with no fault at all and
ends 0, bit-identical to an uninterrupted run."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from ms_recover.localrun.job import ManagerPodJob
from ms_recover.localrun.wait import wait_for

from .jobs import STEPS, job_config, results, shared_reference_sha

pytestmark = pytest.mark.timeout(180)

STOP_S = 2.5  # > silence_s (2 s at the defaults)
STOPS = 4


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    return shared_reference_sha(tmp_path_factory)


def test_a_manager_stopped_for_longer_than_the_silence_window_declares_no_one_lost(
    tmp_path, reference: str
) -> None:
    out = str(tmp_path)
    command = [
        *(sys.executable, "-m", "ms_recover.localrun.numpy_trainer"),
        *("--steps", str(STEPS), "--out", out, "--step-time", "0.6"),
    ]
    cfg = job_config()
    assert cfg.silence_s < STOP_S
    env = {"OPENBLAS_NUM_THREADS": "1"}
    with ManagerPodJob(cfg, command, env, os.path.join(out, "logs"), standby=False) as job:

        def past(step: int) -> bool:
            ranks = (job.status() or {}).get("ranks", [])
            return len(ranks) == 4 and all(r.get("step", -1) >= step for r in ranks)

        manager = job.pods.managers[0]
        for stop in range(STOPS):
            wait_for(lambda s=stop: past(s * 4 + 1), 60, f"every rank past step {stop * 4 + 1}")
            os.kill(manager.pid, signal.SIGSTOP)
            try:
                time.sleep(STOP_S)  # the fault's length, not a wait for a condition
            finally:
                os.kill(manager.pid, signal.SIGCONT)
        assert job.wait(120), f"job did not finish: {job.status()}"
    assert job.find("fault") == [], [f["detail"] for f in job.find("fault")]
    assert job.exit_code == 0
    assert [r["sha256"] for r in results(out)] == [reference] * 4
    with open(os.path.join(out, "logs", "manager_0.log")) as fh:
        assert "manager stalled" in fh.read(), "the stops were not even seen"
