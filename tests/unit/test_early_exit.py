"""A rank's exit with code 0 is a finish only after its WorkerDone (issue 26 #2).

The real server's handlers are fed decoded envelopes (no sockets connect) with a fake clock
(test_manager_restore's harness, for a manager that was not restarted);
``decide`` and the executor run as in production. An exit 0 with no WorkerDone is an early
exit: a ``rank_exit`` fault once no WorkerDone came within the grace (a MindIO processor's
WorkerDone travels on its own connection, so its agent's exit report may come first).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ms_recover.manager.decide import EARLY_EXIT_GRACE_S
from ms_recover.manager.model import Restore
from ms_recover.observability.schema import JobState
from ms_recover.protocol import messages as M

from .test_manager_restore import Restarted

STEP = 12


class Running(Restarted):
    """A fresh manager (2 nodes x 2 ranks) whose members registered, the job running."""

    def __init__(self) -> None:
        super().__init__()
        for node in (0, 1):
            self.agent(node, epoch=0)
        for rank in range(4):
            self.rank(rank, step=-1, epoch=0)
        self.model.transition(JobState.RUNNING)  # the formation round is test_decide's
        for info in self.model.ranks.values():
            info.committed_step, info.last_progress = STEP, self.t

    def exited(self, rank: int, code: int = 0, requested: bool = False) -> None:
        """The agent reports that ``rank``'s registered process exited."""
        exited = M.RankExited(rank // 2, rank, 600 + rank, code, 0, self.t - 0.02, requested)
        self.feed(f"a{rank // 2}".encode(), exited, epoch=0)

    def done(self, rank: int, waits: bool = False) -> None:
        self.feed(f"r{rank}".encode(), M.WorkerDone(rank, STEP, waits), epoch=0)

    def later(self, dt: float) -> None:
        self.t += dt
        for member in (*self.model.ranks.values(), *self.model.agents.values()):
            member.last_seen = self.t

    def faults(self) -> list[dict]:
        return self.server.events.recent("fault")


@pytest.fixture
def job() -> Iterator[Running]:
    job = Running()
    yield job
    job.server.close()


def test_an_exit_0_without_finishing_is_a_fault_within_the_grace(job: Running) -> None:
    job.exited(1)
    job.tick()
    assert job.faults() == [] and job.model.state is JobState.RUNNING
    job.later(EARLY_EXIT_GRACE_S)
    job.tick()
    (fault,) = job.faults()
    assert (fault["kind"], fault["rank"]) == ("rank_exit", 1)
    assert "exit code 0 before it finished" in fault["detail"]
    assert fault["detect_s"] == pytest.approx(EARLY_EXIT_GRACE_S + 0.02)
    assert job.model.state is JobState.STOPPING
    assert job.model.round is not None and job.model.round.replace_ranks == {1}
    assert not job.model.ranks[1].done


def test_a_worker_done_after_its_exit_report_finishes_the_rank(job: Running) -> None:
    job.exited(1)
    job.later(EARLY_EXIT_GRACE_S / 2)
    job.done(1)  # a MindIO processor: its WorkerDone came on another connection, later
    job.later(EARLY_EXIT_GRACE_S)
    job.tick()
    info = job.model.ranks[1]
    assert job.faults() == [] and info.done and not info.alive
    assert job.model.early_exits == {}


def test_a_rank_that_finished_then_exits_0_is_done(job: Running) -> None:
    job.done(1, waits=True)
    job.exited(1)
    job.later(EARLY_EXIT_GRACE_S + 1.0)
    job.tick()
    assert job.faults() == [] and job.model.early_exits == {}
    assert job.model.ranks[1].done and not job.model.ranks[1].alive


def test_an_exit_0_the_manager_asked_for_is_no_fault(job: Running) -> None:
    job.exited(1, requested=True)
    job.later(EARLY_EXIT_GRACE_S + 1.0)
    job.tick()
    assert job.faults() == [] and job.model.early_exits == {}
    assert not job.model.ranks[1].done


def test_a_restarted_manager_takes_an_exit_0_for_a_finish(job: Running) -> None:
    """Its WorkerDone went to the previous manager: the restarted one cannot tell."""
    job.model.restore = Restore(since=job.t)
    job.exited(1)
    assert job.model.ranks[1].done and job.model.early_exits == {}
