"""The duty-cycled SIGSTOP fault (ms_recover.localrun.dutycycle) on a real child process: it
stops it part of the time, leaves it running when done, survives a failing target lookup, and
finds a pod's rank only among the children of that pod's agent."""

from __future__ import annotations

import os
import time

import pytest

from ms_recover.agent.frozen import process_state
from ms_recover.localrun.dutycycle import DutyCycle, children, pod_rank_pids
from ms_recover.localrun.wait import wait_for

pytestmark = pytest.mark.timeout(60)


def test_it_stops_the_target_part_of_the_time_and_leaves_it_running(child) -> None:
    seen: set[str] = set()
    with DutyCycle(lambda: [child.pid], stop_s=0.02, period_s=0.04) as cycle:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not {"T", "S"} <= seen:
            seen.add(process_state(child.pid))
            time.sleep(0.003)
    assert "T" in seen and cycle.cycles > 0, seen
    assert process_state(child.pid) != "T"  # never left stopped


def test_a_failing_lookup_keeps_the_last_targets(child) -> None:
    calls = {"n": 0}

    def targets() -> list[int]:
        calls["n"] += 1
        if calls["n"] > 1:
            raise TimeoutError("status query timed out")
        return [child.pid]

    with DutyCycle(targets, stop_s=0.01, period_s=0.02, refresh_s=0.05) as cycle:
        wait_for(lambda: cycle.errors >= 3, 10, "three failed lookups")
        before = cycle.cycles
        wait_for(lambda: cycle.cycles > before + 5, 10, "the cycle going on")
    assert process_state(child.pid) != "T"


def test_a_pods_rank_is_found_only_among_its_agents_children(child) -> None:
    assert child.pid in children(os.getpid())
    assert pod_rank_pids(os.getpid(), lambda: child.pid) == [child.pid]
    assert pod_rank_pids(child.pid, lambda: child.pid) == []  # another pod's agent
    assert pod_rank_pids(os.getpid(), lambda: 0) == []  # not registered yet
