"""``bench recovery``'s plain-msrun baseline, run by the real msrun CLI with a stand-in program.

The real baseline (MindSpore's cluster noticing a dead worker takes ~33 s, then a relaunch)
cannot finish in a test's time, so a stand-in rank program speaks the real one's file format
(progress and first-step records, a checkpoint every N steps), stops stepping once a peer is
dead (as a collective would block), and its "scheduler" behaves like
MindSpore's: it stays until a worker is gone, a moment later. msrun itself is real: it spawns
the scheduler and the workers, notices the kill, kills the other workers and exits; the runner
relaunches it on the same checkpoint. Checked: the timings and steps it reports are consistent,
and no process is left behind (msrun puts each worker in its own session).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ms_recover.bench.msrunrestart import Restarts

from .jobs import running_with

pytestmark = pytest.mark.timeout(90)

STAND_IN = """\
import argparse, glob, json, os, sys, time
p = argparse.ArgumentParser()
p.add_argument("--steps", type=int)
p.add_argument("--out")
p.add_argument("--ckpt-dir")
p.add_argument("--ckpt-every", type=int)
a = p.parse_args()
t_start = time.time()
def put(name, rec):
    path = os.path.join(a.out, name)
    with open(path + ".tmp", "w") as fh:
        json.dump(rec, fh)
    os.replace(path + ".tmp", path)
def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
def peers_alive():
    pids = [json.load(open(f))["pid"] for f in glob.glob(os.path.join(a.out, "progress_*.json"))]
    return not pids or all(alive(p) for p in pids)
if os.environ.get("MS_ROLE") == "MS_SCHED":  # like MindSpore's: leaves once a worker is gone
    deadline = time.time() + 60
    while time.time() < deadline:
        if not peers_alive():
            time.sleep(0.5)
            sys.exit(0)
        time.sleep(0.05)
    sys.exit(1)
rank, pid = int(os.environ["MS_NODE_ID"]), os.getpid()
ckpt = os.path.join(a.ckpt_dir, "latest.ckpt")
loaded = int(open(ckpt).read()) if os.path.exists(ckpt) else -1
time.sleep(0.3)  # "import and formation"
for s in range(loaded + 1, a.steps):
    time.sleep(0.005)
    while not peers_alive():  # a collective with a dead peer blocks
        time.sleep(0.05)
    if rank == 0 and (s + 1) % a.ckpt_every == 0:
        with open(ckpt + ".tmp", "w") as fh:
            fh.write(str(s))
        os.replace(ckpt + ".tmp", ckpt)
    if s == loaded + 1:
        put(f"timing_{rank}_{pid}.json", {"rank": rank, "pid": pid, "loaded_step": loaded,
            "first_step": s, "times": {"start": t_start, "first_step": time.time()}})
    if s % 10 == 0:
        put(f"progress_{rank}.json", {"rank": rank, "pid": pid, "step": s, "t": time.time()})
"""


def test_real_msrun_kill_exit_relaunch_is_timed_and_reaped(tmp_path: Path) -> None:
    program = tmp_path / "stand_in_rank.py"
    program.write_text(STAND_IN)
    restarts = Restarts(
        world=2,
        ckpt_every=20,
        warm_steps=30,
        timeout_s=40.0,
        workdir=str(tmp_path / "work"),
        program=[sys.executable, str(program)],
    )
    result = restarts.measure(1)
    assert running_with(str(program)) == [], "a worker in its own session was left behind"
    (sample,) = result["samples"]
    assert 0.005 <= result["step_s"] < 1.0
    # msrun polls its workers every second, then waits for the scheduler (0.5 s after the kill).
    assert 0.4 < sample["exit_s"] < 20
    assert 0.3 < sample["relaunch_s"] < 30  # a new msrun, its workers' start, one step
    loaded = sample["loaded_step"]
    assert loaded >= 19 and (loaded + 1) % 20 == 0, "continued at a checkpoint of rank 0"
    # killed_at is estimated from progress records (every 10 steps) and the step time, and the
    # survivor may finish the step in flight: within a step either way of the truth.
    assert -1 <= sample["killed_at_step"] - loaded <= 20 + 10, "lost at most an interval"
    logs = sorted(p.name for p in (tmp_path / "work").iterdir())
    assert logs == ["ckpt", "run0", "run1"]
