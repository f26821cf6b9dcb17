"""The manager's own stall is never its members' silence (ms_recover.manager.hearing).

Fake wall and CPU clocks: a read that returns later than it asked to wait, with the thread's
CPU time standing still, is a stall; for ``hold_s`` after it an empty read does not move
``heard_at``. Work (CPU time) and asked-for waits are never stalls. The real thing, a manager
process stopped for 3 s, is tests/integration/test_manager_stall.py.
"""

from __future__ import annotations

import math

import pytest

from ms_recover.config import JobConfig
from ms_recover.manager.hearing import Hearing
from ms_recover.manager.model import JobModel


class Clocks:
    def __init__(self) -> None:
        self.wall = 100.0
        self.cpu = 1.0

    def run(self, cpu_s: float) -> None:  # the thread works
        self.wall += cpu_s
        self.cpu += cpu_s

    def idle(self, s: float) -> None:  # it waits, or is not scheduled
        self.wall += s


def _hearing() -> tuple[Hearing, Clocks, JobModel]:
    clocks = Clocks()
    model = JobModel(JobConfig(heartbeat_s=0.5))
    hearing = Hearing(
        model, lambda: clocks.wall, 0.125, 0.25, wall=lambda: clocks.wall, cpu=lambda: clocks.cpu
    )
    return hearing, clocks, model


def test_reads_work_and_asked_waits_move_heard_at_as_before() -> None:
    hearing, clocks, model = _hearing()
    assert model.heard_at == math.inf
    for _ in range(20):
        clocks.idle(0.1)  # the read's own timeout
        assert hearing.mark(0.1) == 0.0
        hearing.vouch()
        assert model.heard_at == clocks.wall
        clocks.run(0.5)  # a long decision: CPU, not a stall
    assert hearing.stalls == 0


def test_after_a_stall_silence_is_judged_as_of_before_it_for_hold_s() -> None:
    hearing, clocks, model = _hearing()
    clocks.idle(0.1)
    hearing.mark(0.1)
    hearing.vouch()
    before = model.heard_at
    clocks.idle(3.1)  # asked to wait 0.1 s, came back 3 s late
    assert hearing.mark(0.1) == pytest.approx(3.0)
    hearing.vouch()
    assert model.heard_at == before
    clocks.idle(0.2)
    hearing.mark(0.2)
    hearing.vouch()
    assert model.heard_at == before  # 0.2 s after: still held
    clocks.idle(0.05)
    hearing.mark(0.05)
    hearing.vouch()
    assert model.heard_at == clocks.wall  # hold_s passed: heard as of now
    assert (hearing.stalls, hearing.longest_s) == (1, pytest.approx(3.0))


def test_a_stall_shorter_than_the_limit_changes_nothing() -> None:
    hearing, clocks, model = _hearing()
    clocks.idle(0.1 + 0.12)
    assert hearing.mark(0.1) == 0.0
    hearing.vouch()
    assert model.heard_at == clocks.wall


def test_a_wait_counts_only_if_it_was_asked_for() -> None:
    hearing, clocks, model = _hearing()
    clocks.idle(1.0)  # a rest of 1 s, then an immediate read
    assert hearing.mark(1.0) == 0.0
    clocks.idle(1.0)  # the same second, not asked for
    assert hearing.mark(0.0) == pytest.approx(1.0)


def test_a_stall_after_the_read_returned_is_caught_when_the_queue_is_found_empty() -> None:
    """Stopped in mid-drain: the drain's last read finds nothing (ZeroMQ has not read the
    sockets yet); that emptiness does not vouch for the time of the stop."""
    hearing, clocks, model = _hearing()
    clocks.idle(0.1)
    hearing.mark(0.1)
    hearing.vouch()
    before = model.heard_at
    clocks.run(0.01)  # handling frames
    clocks.idle(2.5)  # stopped
    hearing.vouch()
    assert model.heard_at == before and hearing.stalls == 1
