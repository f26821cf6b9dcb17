"""A lane call's preemption watch (laneexchange._Preemption) against fake clocks, and the
kernel's schedstat it reads."""

from __future__ import annotations

import types

import pytest

from ms_recover.comm.host.lane import exchange as laneexchange


class _Clocks:
    """A wall clock and the thread's run-queue wait, moved by hand."""

    def __init__(self) -> None:
        self.wall, self.queued = 100.0, 5.0
        self.known = True

    def run(self, s: float) -> None:  # the thread runs, or waits on its socket
        self.wall += s

    def preempted(self, s: float) -> None:  # runnable, another thread holds the core
        self.wall += s
        self.queued += s


@pytest.fixture
def clocks(monkeypatch: pytest.MonkeyPatch) -> _Clocks:
    c = _Clocks()
    monkeypatch.setattr(laneexchange, "time", types.SimpleNamespace(monotonic=lambda: c.wall))
    monkeypatch.setattr(laneexchange, "run_queue_s", lambda: c.queued if c.known else None)
    return c


def test_a_thread_that_runs_or_waits_on_its_socket_is_not_preempted(clocks: _Clocks) -> None:
    watch = laneexchange._Preemption()
    clocks.run(0.050)
    assert not watch.lost()


def test_a_thread_kept_off_its_core_over_5_ms_and_a_quarter_of_the_call_is_preempted(
    clocks: _Clocks,
) -> None:
    watch = laneexchange._Preemption()
    clocks.run(0.004)
    clocks.preempted(0.004)  # half of the call, under 5 ms
    assert not watch.lost()
    clocks.preempted(0.002)  # 6 ms of 10
    assert watch.lost()


def test_a_long_call_with_a_short_share_off_its_core_is_not_preempted(clocks: _Clocks) -> None:
    watch = laneexchange._Preemption()
    clocks.run(0.030)
    clocks.preempted(0.006)  # 6 ms of 36: a quiet host's hiccup
    assert not watch.lost()
    clocks.preempted(0.010)  # 16 ms of 46
    assert watch.lost()


def test_without_schedstat_a_call_is_never_preempted(clocks: _Clocks) -> None:
    clocks.known = False
    watch = laneexchange._Preemption()
    clocks.preempted(1.0)
    assert not watch.lost()


def test_this_kernel_gives_the_run_queue_wait_and_it_only_grows() -> None:
    first = laneexchange.run_queue_s()
    assert first is not None, "Linux with schedstat (this host's kernel)"
    again = laneexchange.run_queue_s()
    assert again is not None and 0.0 <= first <= again
