"""The agent's view of a stopped rank (ms_recover.agent.frozen) on real processes: a child this
test stops is reported once per stop; a child stopped and continued 25 times a second (the
duty-cycled SIGSTOP that makes a fail-slow rank) never is, while a watch that reads the state
alone, side by side, mistakes it for a frozen one. A whole job's SIGSTOP hang is the "hang" row
of the fault matrix (test_fault_matrix.py) and the end-of-training suite."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from ms_recover.agent.frozen import FreezeWatch, process_state
from ms_recover.localrun.dutycycle import DutyCycle
from ms_recover.localrun.wait import wait_for

pytestmark = pytest.mark.timeout(60)


def test_a_stopped_child_is_reported_once_per_stop(child: subprocess.Popen[bytes]) -> None:
    watch = FreezeWatch(limit_s=0.3, every_s=0.01)
    pids = {5: child.pid}
    seen: list[tuple[int, int, float]] = []

    def sample() -> list[tuple[int, int, float]]:
        seen.extend(watch.sample(pids, time.monotonic()))
        return seen

    for stop in (1, 2):
        child.send_signal(signal.SIGSTOP)
        wait_for(lambda n=stop: len(sample()) == n, 10, f"stop {stop} reported")  # type: ignore[misc]
        assert seen[-1][:2] == (5, child.pid) and seen[-1][2] >= 0.3
        child.send_signal(signal.SIGCONT)
        wait_for(lambda: process_state(child.pid) != "T", 10, "the child running again")
        for _ in range(5):
            sample()
        assert len(seen) == stop, seen  # the same stop is not reported again


def test_a_duty_cycled_child_is_never_frozen(child: subprocess.Popen[bytes]) -> None:
    # Samples 50 ms apart of a child stopped 90 % of the time: most read "T".
    real = FreezeWatch(limit_s=0.2, every_s=0.05)
    naive = FreezeWatch(limit_s=0.2, every_s=0.05, read=lambda pid: (process_state(pid), 0))
    pids = {0: child.pid}
    fired: list[tuple[int, int, float]] = []
    with DutyCycle(lambda: [child.pid], stop_s=0.036, period_s=0.04):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not fired:
            now = time.monotonic()
            assert real.sample(pids, now) == []
            fired = naive.sample(pids, now)
            time.sleep(0.05)
    assert fired, "the state alone never looked frozen: the duty cycle proved nothing"
    assert process_state(child.pid) != "T"
