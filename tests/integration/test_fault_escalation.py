"""Faults that keep coming back still end (numpy trainer, 2 nodes x 2 ranks, 30 steps).

Widening a round for a new fault of another rank uses up no try (see test_fault_matrix.py),
so the bounds that remain must hold: a replacement that keeps dying in one incident uses up
``max_tries`` and the job moves down its strategy list; a rank that fails again after every
successful recovery (here: it keeps leaving early with exit code 0) is stopped by its restart
budget. Either way the job ends 87 at once, and the decision event says why.
"""

from __future__ import annotations

import pytest

from ms_recover.localrun.faults import Faults

from .jobs import run_to_end, trainer_job

pytestmark = pytest.mark.timeout(120)


def _decisions(job) -> list[tuple[str, str]]:
    return [(e["strategy"], e["reason"]) for e in job.find("decision")]


def test_a_replacement_that_keeps_dying_uses_up_the_tries(tmp_path) -> None:
    """Rank 1 is killed, and its first two replacements die as soon as they registered: the
    second try fails too, recover-in-place is given up, and node 0 cannot be rescheduled."""
    faults = Faults().kill(rank=1, step=10).add("boot", rank=1, inc=1).add("boot", rank=1, inc=2)
    with trainer_job(str(tmp_path), faults) as job:
        run_to_end(job)
    decisions = _decisions(job)
    assert job.exit_code == 87, decisions
    assert [s for s, _ in decisions] == ["recover-in-place", "recover-in-place", "exit"]
    assert "recover-in-place: tried 2 time(s), max_tries=2" in decisions[-1][1], decisions
    assert not any("widened" in reason for _, reason in decisions), decisions
    (end,) = job.find("job_end")
    assert end["exit_code"] == 87 and "max_tries=2" in end["reason"]


def test_a_rank_that_keeps_leaving_early_is_stopped_by_its_restart_budget(tmp_path) -> None:
    """Rank 1 leaves with exit code 0 in mid-training, and so does each replacement a while
    after its recovery. Each time is a fault, recovered; the third time its budget (2 restarts
    an hour here) is used up and the job ends with the reason instead of looping."""
    faults = Faults().leave(rank=1, step=6).leave(rank=1, step=12, inc=1)
    faults = faults.leave(rank=1, step=18, inc=2)
    with trainer_job(str(tmp_path), faults, rank_restarts_per_hour=2) as job:
        run_to_end(job)
    decisions = _decisions(job)
    assert job.exit_code == 87, decisions
    assert [s for s, _ in decisions] == ["recover-in-place", "recover-in-place", "exit"]
    assert [r["ok"] for r in job.find("recovery")] == [True, True]
    why = decisions[-1][1]
    assert "restart budget used up: rank 1 (2)" in why and "rank_restarts_per_hour=2" in why
    left = [f for f in job.find("fault", rank=1) if "exit code 0" in f["detail"]]
    assert len(left) == 3, job.find("fault")
