"""Fail-slow detection on a 2 nodes x 2 ranks job whose ranks each wait ~30 ms per step on
"device work" (the host waits on the accelerator, as on a real cluster: four busy-spinning ranks
on this 2-core host would measure the CPU scheduler, not the ranks), then an allreduce: a rank
slowed to 1.5x its peers by a fault hook that stretches its compute is flagged as soon as the
detector can see it; the same job without a slowdown flags nothing. A rank stopped a third of the
time from outside (a duty-cycled SIGSTOP) is flagged by the same bound, and never taken for a
frozen rank. Under the default
sub-health policy (``ignore``) a flag is reported only: the job runs on untouched. The other
policies are rows of the fault matrix. The compute-hang scenario (named culprit, only it
replaced, bit-identical) is a row of the fault matrix (test_fault_matrix.py).

How soon is derived from the detector's settings, not from the host's speed: the rank's tenth
percentile of compute time moves once its window holds no more unslowed steps than lie below
that percentile, and the manager flags on the second report in a row that shows it, so the flag
names a step the rank committed within two heartbeats (and one of slack for a loaded host's
scheduling) of the window filling. The rank's own commit times say when that was, so a loaded
host that slows the steps moves the bound with them. The "within 50 steps" figure at the
default settings on a quiet host is a row of ``ms-recover bench detect``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest

from ms_recover.localrun.dutycycle import DutyCycle
from ms_recover.localrun.faults import Faults
from ms_recover.localrun.job import LocalJob
from ms_recover.localrun.wait import wait_for
from ms_recover.worker.health import WINDOW

from .jobs import job_config, run_to_end

pytestmark = pytest.mark.timeout(240)

STEPS, SLOW_FROM = 150, 60
#: Slowed steps in the window before its tenth percentile (index int(0.1 * (WINDOW - 1)) of
#: the sorted window, see ms_recover.worker.health.quantile) is a slowed step.
FILL = WINDOW - int(0.1 * (WINDOW - 1))
SLACK_S = 1.0  # a loaded host's late heartbeat thread, on top of the beats themselves

TRAIN = """
import json, os, sys, time, numpy as np, ms_recover
session = ms_recover.init()
done = {}
for step in session.steps(int(sys.argv[1])):
    with session.guard():
        time.sleep(0.03)  # ~30 ms of device work, outside the collective
        session.allreduce(np.ones(8, np.float32), "sum")
    done[step] = time.monotonic()
session.finish()
with open(os.path.join(sys.argv[2], f"commits_{session.rank}.json"), "w") as fh:
    json.dump(done, fh)
"""


def run(tmp_path: Any, faults: Faults | None) -> tuple[list[dict[str, Any]], float]:
    """The job's ``flagged`` events, and its heartbeat period."""
    script = os.path.join(str(tmp_path), "train.py")
    with open(script, "w") as fh:
        fh.write(TRAIN)
    env = {"OPENBLAS_NUM_THREADS": "1", **(faults.to_env() if faults else {})}
    logs = os.path.join(str(tmp_path), "logs")
    config = job_config()
    command = [sys.executable, script, str(STEPS), str(tmp_path)]
    with LocalJob(config, command, env, log_dir=logs) as job:
        run_to_end(job, 200.0)
    assert job.exit_code == 0
    assert job.find("recovery") == [] and job.find("fault") == []  # reported only
    return job.find("flagged"), config.heartbeat_s


def commit_times(tmp_path: Any, rank: int) -> dict[int, float]:
    with open(os.path.join(str(tmp_path), f"commits_{rank}.json")) as fh:
        return {int(step): t for step, t in json.load(fh).items()}


def test_a_rank_slowed_to_1_5x_is_flagged_within_two_heartbeats_of_its_window(
    tmp_path: Any,
) -> None:
    flags, heartbeat_s = run(tmp_path, Faults().add("slow", rank=1, step=SLOW_FROM))
    assert [f["rank"] for f in flags] == [1], flags
    flag = flags[0]
    assert (flag["node"], flag["host"], flag["reason"]) == (0, "127.0.0.1", "slow")
    assert flag["score"] >= 1.3 and flag["compute_s"] > flag["reference_s"] > 0
    assert flag["step"] >= SLOW_FROM, flag  # never before the slowdown
    commits = commit_times(tmp_path, 1)
    filled = commits[SLOW_FROM + FILL - 1]  # the window's tenth percentile is slowed from here
    late = commits[flag["step"]] - filled
    assert late <= 3 * heartbeat_s + SLACK_S, (flag, f"{late:.2f}s after the window filled")


def test_no_flag_without_a_slowdown(tmp_path: Any) -> None:
    flags, _ = run(tmp_path, None)
    assert flags == []


# A duty-cycled SIGSTOP from outside (the harness's fault injector) instead of the hook: the
# "device work" is 30 sleeps of 1 ms, so a rank stopped a third of the time takes 1.5x as long.
# Each rank writes the step it is in, so the test knows the step at which the slowdown began,
# and its commit times, so the bound follows the detector's settings as above (the "within 50
# steps" figure of a quiet host is bench detect's row).
TRAIN_SLICED = """
import json, os, sys, time, numpy as np, ms_recover
session = ms_recover.init()
mark = os.path.join(sys.argv[2], f"step_{session.rank}")
done = {}
for step in session.steps(int(sys.argv[1])):
    with session.guard():
        with open(mark, "w") as fh:
            fh.write(str(step))
        for _ in range(30):
            time.sleep(0.001)  # ~30 ms of device work, as many short kernels
        session.allreduce(np.ones(8, np.float32), "sum")
    done[step] = time.monotonic()
session.finish()
with open(os.path.join(sys.argv[2], f"commits_{session.rank}.json"), "w") as fh:
    json.dump(done, fh)
"""


def test_a_rank_stopped_a_third_of_the_time_is_flagged_and_never_a_fault(tmp_path: Any) -> None:
    """Flagged within two heartbeats (and the slack) of its window filling with stopped steps;
    never taken for a frozen or hung rank (ms_recover.agent.frozen)."""
    out = str(tmp_path)
    script = os.path.join(out, "train.py")
    with open(script, "w") as fh:
        fh.write(TRAIN_SLICED)
    steps, onset_after = 260, 80
    env = {"OPENBLAS_NUM_THREADS": "1"}
    logs = os.path.join(out, "logs")
    command = [sys.executable, script, str(steps), out]
    with LocalJob(job_config(), command, env, log_dir=logs) as job:

        def step_of(rank: int) -> int:
            try:
                with open(os.path.join(out, f"step_{rank}")) as fh:
                    return int(fh.read() or -1)
            except (OSError, ValueError):
                return -1

        wait_for(lambda: step_of(1) >= onset_after, 120, f"rank 1 at step {onset_after}")
        pid = int(job.status()["ranks"][1]["pid"])
        onset = step_of(1)
        with DutyCycle(lambda: [pid], stop_s=0.004, period_s=0.012) as cycle:
            run_to_end(job, 200.0)
    assert job.exit_code == 0 and cycle.cycles > 0
    flags = job.find("flagged")
    assert [f["rank"] for f in flags] == [1], flags
    assert flags[0]["step"] >= onset, (onset, flags[0])  # never before the stops
    commits = commit_times(tmp_path, 1)
    late = commits[flags[0]["step"]] - commits[onset + FILL - 1]
    heartbeat_s = job.config.heartbeat_s
    assert late <= 3 * heartbeat_s + SLACK_S, (flags[0], f"{late:.2f}s after the window filled")
    assert job.find("recovery") == [] and job.find("fault") == []  # ignore: reported only
