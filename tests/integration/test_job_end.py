"""How a job ends: ranks leave on their own at a normal end (issue 9 #2), and nothing
outlives the process that runs a local job (issue 9 #13)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ms_recover.localrun.wait import wait_for

from .jobs import results, run_to_end, trainer_job

pytestmark = pytest.mark.timeout(120)


def test_normal_end_lets_ranks_finish_and_exit_zero(tmp_path):
    """Every rank returns from session.finish(), runs code after it and its atexit handlers,
    and exits 0 by itself: the agent waits for it instead of SIGKILLing it."""
    out = str(tmp_path)
    with trainer_job(out, extra=("--after-finish",), steps=12) as job:
        run_to_end(job)
    assert job.exit_code == 0 and job.pods.exit_codes == {0: 0, 1: 0}
    exits = job.find("rank_exit")
    assert sorted(e["rank"] for e in exits) == [0, 1, 2, 3]
    assert [(e["exit_code"], e["signal"]) for e in exits] == [(0, 0)] * 4, exits
    for rank in range(4):
        assert (tmp_path / f"rank_{rank}.after").exists(), f"rank {rank}: finish() did not return"
        assert (tmp_path / f"rank_{rank}.atexit").exists(), f"rank {rank}: atexit did not run"
    assert all(r["committed"] == 11 for r in results(out))


_RUNNER = """
import sys, time
from tests.integration.jobs import trainer_job
with trainer_job(sys.argv[1], steps=10**6) as job:
    print("started", flush=True)
    time.sleep(3600)  # killed by the test
"""


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            todo.extend(k for k in kids if k not in found)
            found.update(kids)
    return found


def _at_least(n: int, pids: set[int]) -> set[int]:
    return pids if len(pids) >= n else set()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:100]
    except OSError:
        return f"{pid} (gone)"


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killing_the_local_job_process_ends_its_agents_and_ranks(tmp_path, sig):
    """The process running a LocalJob (as ``ms-recover demo`` does) dies: its agents and
    ranks must die with it, not train on until the manager's grace runs out."""
    root = Path(__file__).resolve().parents[2]
    runner = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_RUNNER), str(tmp_path)],
        cwd=root,
        stdout=subprocess.PIPE,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
    )
    family: set[int] = set()
    try:
        assert runner.stdout is not None and runner.stdout.readline() == b"started\n"
        # two agents, each with its two ranks
        family = wait_for(lambda: _at_least(6, _descendants(runner.pid)), 60, "agents and ranks")
        runner.send_signal(sig)
        runner.wait(10)
        try:
            wait_for(lambda: not [p for p in family if _alive(p)], 20, "its descendants to die")
        except AssertionError as exc:
            left = [_cmdline(p) for p in family if _alive(p)]
            raise AssertionError(f"{exc}; still running: {left}") from None
    finally:
        family |= _descendants(runner.pid)
        if runner.poll() is None:
            runner.kill()
            runner.wait()
        for pid in family:  # only if the test failed: reap what we started
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
