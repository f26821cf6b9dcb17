"""A rank stopped by a signal (SIGSTOP) is a hang its agent sees at once (docs/design.md §1e).

The agent's :class:`FreezeWatch` reads each rank's process state; a rank stopped (``T``) for
``frozen_s`` is reported once per stop. The manager's handler (fed decoded envelopes, a fake
clock: test_manager_restore's harness) declares a ``hang`` naming it, but only for the
registered process of a live member. The kernel's side (a real stopped child) and a whole job
are tests/integration/test_frozen_rank.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ms_recover.agent.frozen import FreezeWatch
from ms_recover.config import JobConfig
from ms_recover.observability.schema import JobState
from ms_recover.protocol import messages as M

from .test_early_exit import Running


class States:
    """A fake /proc: the state of each pid and its main thread's times scheduled (``ran``),
    changed by the test."""

    def __init__(self) -> None:
        self.of: dict[int, str] = {}
        self.ran: dict[int, int] = {}

    def __call__(self, pid: int) -> tuple[str, int]:
        state = self.of.get(pid, "")
        return state, self.ran.get(pid, 7) if state == "T" else -1


def test_a_stop_is_reported_once_after_the_limit_and_again_after_a_continue() -> None:
    states = States()
    watch = FreezeWatch(limit_s=1.0, every_s=0.1, read=states)
    pids = {0: 100, 1: 101}
    states.of = {100: "S", 101: "T"}
    assert watch.sample(pids, 10.0) == []  # first seen stopped at 10.0
    assert watch.sample(pids, 10.05) == []  # within every_s: not even read
    assert watch.sample(pids, 10.9) == []
    assert watch.sample(pids, 11.0) == [(1, 101, 1.0)]
    assert watch.sample(pids, 12.0) == []  # said once for this stop
    states.of[101] = "R"  # SIGCONT
    assert watch.sample(pids, 12.1) == []
    states.of[101] = "T"
    assert watch.sample(pids, 12.2) == []  # a new stop: its own clock
    assert watch.sample(pids, 13.2) == [(1, 101, pytest.approx(1.0))]


def test_a_rank_stopped_and_continued_between_samples_is_not_frozen() -> None:
    """A fail-slow rank (a duty-cycled SIGSTOP) is seen stopped at every sample now and then;
    its main thread ran in between, so its stop never lasts."""
    states = States()
    states.of[100] = "T"
    watch = FreezeWatch(limit_s=1.0, every_s=0.0, read=states)
    for i in range(30):
        states.ran[100] = 50 + i  # continued and stopped again since the last sample
        assert watch.sample({0: 100}, i * 0.1) == []
    assert watch.sample({0: 100}, 3.0) == []  # the count stands still from 2.9 on
    assert watch.sample({0: 100}, 4.0) == [(0, 100, pytest.approx(1.1))]


def test_no_count_of_the_main_thread_no_report() -> None:
    states = States()
    states.of[100], states.ran[100] = "T", -1
    watch = FreezeWatch(limit_s=0.5, every_s=0.0, read=states)
    assert [watch.sample({0: 100}, t) for t in (0.0, 1.0, 5.0)] == [[], [], []]


@pytest.mark.parametrize("state", ["t", "D", "S", "R", "Z", ""])
def test_anything_but_a_signal_stop_is_never_reported(state: str) -> None:
    """``t``: a tracer's stop (a debugger, py-spy); ``D``: the adaptive hang rule's; '': gone."""
    states = States()
    states.of[100] = state
    watch = FreezeWatch(limit_s=0.5, every_s=0.0, read=states)
    assert [watch.sample({0: 100}, t) for t in (0.0, 1.0, 5.0, 60.0)] == [[], [], [], []]


def test_a_replaced_process_starts_a_new_clock() -> None:
    states = States()
    states.of = {100: "T", 200: "T"}
    watch = FreezeWatch(limit_s=1.0, every_s=0.0, read=states)
    assert watch.sample({0: 100}, 0.0) == []
    assert watch.sample({0: 200}, 0.9) == []  # rank 0 restarted: pid 100's stop is forgotten
    assert watch.sample({0: 200}, 1.5) == []
    assert watch.sample({0: 200}, 2.0) == [(0, 200, pytest.approx(1.1))]


def test_frozen_s_is_two_heartbeats() -> None:
    assert JobConfig(heartbeat_s=0.5).frozen_s == 1.0


# ----------------------------------------------------------------------------- the manager
@pytest.fixture
def job() -> Iterator[Running]:
    job = Running()
    yield job
    job.server.close()


def _frozen(job: Running, rank: int, pid: int) -> None:
    job.feed(f"a{rank // 2}".encode(), M.RankFrozen(rank // 2, rank, pid, 1.02, "node-b"), epoch=0)


def test_a_frozen_member_is_a_hang_naming_it_at_once(job: Running) -> None:
    _frozen(job, 3, 603)
    job.tick()
    (fault,) = job.server.events.recent("fault")
    assert (fault["kind"], fault["rank"], fault["node_rank"]) == ("hang", 3, 1)
    assert "stopped by a signal" in fault["detail"] and "node-b" in fault["detail"]
    assert fault["detect_s"] == pytest.approx(1.02)
    assert job.model.state is JobState.STOPPING
    assert job.model.round is not None and job.model.round.replace_ranks == {3}


@pytest.mark.parametrize("case", ["another pid", "not alive", "finished", "unknown rank"])
def test_a_stopped_process_the_job_does_not_count_on_is_no_fault(job: Running, case: str) -> None:
    rank, pid = 3, 603
    if case == "another pid":
        pid = 999  # a wrapper, or a replacement that never registered
    elif case == "not alive":
        job.model.ranks[3].alive = False
    elif case == "finished":
        job.model.ranks[3].done = True
    else:
        rank = 2
        del job.model.ranks[2]
    _frozen(job, rank, pid)
    job.tick()
    assert job.server.events.recent("fault") == []
    assert job.model.state is JobState.RUNNING
