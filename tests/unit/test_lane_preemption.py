"""A lane call's preemption watch (laneexchange._Preemption) against a fake pair of clocks."""

from __future__ import annotations

import types

import pytest

from ms_recover.comm import laneexchange


class _Clocks:
    """A wall clock and a thread CPU clock that a test moves by hand."""

    def __init__(self) -> None:
        self.wall = self.cpu = 100.0

    def run(self, s: float) -> None:  # the thread runs
        self.wall += s
        self.cpu += s

    def off(self, s: float) -> None:  # the thread is off its core (or waits)
        self.wall += s


@pytest.fixture
def clocks(monkeypatch: pytest.MonkeyPatch) -> _Clocks:
    c = _Clocks()
    fake = types.SimpleNamespace(monotonic=lambda: c.wall, thread_time=lambda: c.cpu)
    monkeypatch.setattr(laneexchange, "time", fake)
    return c


def test_a_thread_that_runs_or_waits_on_its_socket_is_not_preempted(clocks: _Clocks) -> None:
    watch = laneexchange._Preemption()
    clocks.run(0.020)
    assert not watch.lost()
    clocks.off(0.030)
    watch.idle += 0.030  # the call's own wait on its socket
    clocks.run(0.001)
    assert not watch.lost()


def test_a_thread_off_its_core_for_a_third_of_the_call_and_3_ms_is_preempted(
    clocks: _Clocks,
) -> None:
    watch = laneexchange._Preemption()
    clocks.run(0.004)
    clocks.off(0.0025)  # 2.5 ms of 6.5: a third, but under 3 ms
    assert not watch.lost()
    clocks.off(0.001)  # 3.5 ms of 7.5
    assert watch.lost()


def test_a_long_call_with_a_short_share_off_its_core_is_not_preempted(clocks: _Clocks) -> None:
    watch = laneexchange._Preemption()
    clocks.run(0.030)
    clocks.off(0.005)  # 5 ms of 35: over 3 ms, a seventh of the call (a quiet host's hiccup)
    assert not watch.lost()
    clocks.off(0.015)  # 20 ms of 50
    assert watch.lost()
