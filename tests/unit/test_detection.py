"""Hang and fail-slow detection (ms_recover/manager/detection.py) with a fake clock, driven
through ``decide(model, now)`` and the real executor (the ``Job`` of test_decide), and the
rank side (ms_recover/worker/health.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError
from ms_recover.manager.health import note
from ms_recover.manager.status import status_of
from ms_recover.observability.schema import JobState
from ms_recover.observability.status import render
from ms_recover.worker.health import MIN_TIMED, SHIFT_BEATS, WARM, WINDOW, StepClock
from tests.unit.test_decide import Job

MS = 0.001


@pytest.fixture
def job() -> Iterator[Job]:
    j = Job("recover-in-place,recover,exit", hang_timeout_s=30.0)
    j.running(step=100)
    yield j


def report(
    job: Job,
    rank: int,
    idle: float,
    coll: float = -1.0,
    p99: float = 20 * MS,
    compute: tuple[float, float] = (-1.0, -1.0),
    long: bool = False,
    epoch: int | None = None,
) -> None:
    values = [
        float(job.model.epoch if epoch is None else epoch),
        idle,
        coll,
        p99,
        *compute,
        1.0 if long else 0.0,
    ]
    note(job.model, rank, job.model.ranks[rank].committed_step, values, job.now)


def calm(job: Job) -> bool:
    """A tick declares no fault and the job runs on."""
    job.tick()
    return not job.events("fault") and job.model.state is JobState.RUNNING


def stuck_in_compute(job: Job, culprit: int, idle: float, **kw: object) -> None:
    """Every rank reports no commit for ``idle``; all but ``culprit`` wait in a collective."""
    for r in range(4):
        report(job, r, idle, coll=-1.0 if r == culprit else idle - 0.01, **kw)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- hangs
def test_compute_hang_is_declared_after_the_floor_and_names_only_the_culprit(job: Job) -> None:
    job.advance(3.5)
    stuck_in_compute(job, 2, 3.5)
    assert calm(job)  # 3.5 s < floor of 4 s
    job.advance(0.6)  # extrapolated by at most one heartbeat: 3.5 + 0.5 >= 4
    job.tick()
    (fault,) = job.events("fault")
    assert (fault["kind"], fault["rank"], fault["node_rank"]) == ("hang", 2, 1)
    assert "not waiting in a collective" in fault["detail"]
    assert "floor 4s" in fault["detail"]
    assert job.model.round is not None and job.model.round.replace_ranks == {2}


def test_long_steps_raise_the_limit_to_k_times_p99(job: Job) -> None:
    job.advance(5.0)
    stuck_in_compute(job, 1, 5.0, p99=3.0)  # limit max(2 x 3 s, 4 s) = 6 s
    assert calm(job)
    job.advance(0.5)
    stuck_in_compute(job, 1, 6.1, p99=3.0)
    job.tick()
    (fault,) = job.events("fault")
    assert fault["rank"] == 1 and "limit 6.0s" in fault["detail"]


def test_until_enough_steps_are_timed_the_fixed_bound_applies(job: Job) -> None:
    job.advance(10.0)
    stuck_in_compute(job, 2, 10.0, p99=-1.0)  # one rank (a fresh start) has timed too few
    assert calm(job)
    job.advance(21.0)  # the fixed hang_timeout_s of 30 s still holds
    job.tick()
    assert job.events("fault")[0]["kind"] == "hang"


def test_a_declared_long_stretch_is_not_a_hang(job: Job) -> None:
    job.advance(10.0)
    for r in range(4):
        report(job, r, 10.0, long=r == 0)
    assert calm(job)


def test_reports_of_an_earlier_epoch_do_not_count(job: Job) -> None:
    """After a recovery (compilation) the ranks' old reports say nothing."""
    job.advance(10.0)
    stuck_in_compute(job, 2, 10.0, epoch=job.model.epoch - 1)
    assert calm(job)


def test_a_late_report_delays_a_hang_but_never_causes_one(job: Job) -> None:
    for r in range(4):
        report(job, r, 0.02)
    job.advance(10.0)  # heartbeats arrive (last_seen), the timing reports are late
    assert calm(job)


def waiting_on(job: Job, culprit: int, waited: float) -> None:
    """Every rank but ``culprit`` reports, fresh, waiting in a collective for ``waited``."""
    for r in range(4):
        if r != culprit:
            report(job, r, waited, coll=waited - 0.01)


def test_a_frozen_rank_is_named_by_the_others_waiting_on_it(job: Job) -> None:
    """SIGSTOP: no report from rank 1 any more, the others wait in the allreduce. It was
    found only by rank_silence_s (10 s); now at the hang limit."""
    report(job, 1, 0.02)
    for waited in (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5):
        job.advance(0.5)
        waiting_on(job, 1, waited)
        assert calm(job)  # under the 4 s floor
    job.advance(0.5)
    waiting_on(job, 1, 4.0)
    job.tick()
    (fault,) = job.events("fault")
    assert (fault["kind"], fault["rank"]) == ("hang", 1), fault
    assert (
        "silent for 4.0s while the others wait in a collective, no commit for 4.0s"
        in (fault["detail"])
    )
    assert job.model.round is not None and job.model.round.replace_ranks == {1}


@pytest.mark.parametrize(
    "case",
    ["others stale", "one other not in a collective", "others waited less", "silent too briefly"],
)
def test_a_silent_rank_is_no_culprit_without_the_others_fresh_evidence(job: Job, case: str) -> None:
    """No false alarm: each condition alone is not enough."""
    report(job, 1, 0.02)
    job.advance(5.0)
    waited = 3.0 if case == "others waited less" else 5.0
    for r in (0, 2, 3):
        computing = case == "one other not in a collective" and r == 3
        report(job, r, waited, coll=-1.0 if computing else waited - 0.01)
    if case == "silent too briefly":
        report(job, 1, 0.02)  # it spoke just now: a late beat, not a freeze
    if case == "others stale":
        job.advance(1.0)  # the others' reports are a heartbeat and more old
    assert calm(job), job.events("fault")


def test_progress_of_one_rank_prevents_a_hang(job: Job) -> None:
    job.advance(5.0)
    for r in range(4):
        report(job, r, 0.01 if r == 3 else 5.0)
    assert calm(job)


def test_jitter_below_the_limit_is_not_a_hang(job: Job) -> None:
    for idle in (0.5, 1.5, 2.9, 3.4):  # a loaded host: slow beats, long gaps, under 4 s
        job.advance(idle)
        stuck_in_compute(job, 0, idle)
        assert calm(job)
    assert job.model.state is JobState.RUNNING


def test_all_waiting_names_the_lowest_committed_step(job: Job) -> None:
    job.commit(99, ranks=[3])
    job.advance(5.0)
    for r in range(4):
        report(job, r, 5.0, coll=4.9)
    job.tick()
    (fault,) = job.events("fault")
    assert fault["rank"] == 3 and "lowest committed step" in fault["detail"]


def test_hang_timeout_from_the_environment_replaces_the_adaptive_rule() -> None:
    env = {"MS_RECOVER_HANG_TIMEOUT_S": "30"}
    assert JobConfig.from_env(env).hang_adaptive is False
    assert JobConfig.from_env({}).hang_adaptive is True
    j = Job("recover-in-place,exit", hang_adaptive=False, hang_timeout_s=30.0)
    j.running(step=100)
    j.advance(10.0)
    stuck_in_compute(j, 2, 10.0)
    assert calm(j)
    # ... and at the fixed bound the reports name the rank stuck in its own compute
    j.advance(20.5)
    stuck_in_compute(j, 2, 30.5)
    j.tick()
    (fault,) = j.events("fault")
    assert (fault["kind"], fault["rank"]) == ("hang", 2), fault
    assert "rank 2: not waiting in a collective while the others are" in fault["detail"]
    assert j.model.round is not None and j.model.round.replace_ranks == {2}


# ----------------------------------------------------------------------------- fail-slow
def steady(job: Job, slow: dict[int, tuple[float, float]] | None = None) -> None:
    for r in range(4):
        report(job, r, 0.01, compute=(slow or {}).get(r, (30 * MS, 29 * MS)))


def test_a_rank_at_1_5x_its_peers_is_flagged_once_with_its_evidence(job: Job) -> None:
    steady(job)
    assert calm(job) and not job.events("flagged")
    steady(job, {1: (45 * MS, 44 * MS)})
    job.tick()
    assert job.events("flagged") == []  # one slow report is not enough
    steady(job, {1: (45 * MS, 44 * MS)})
    job.tick()
    (flag,) = job.events("flagged")
    assert (flag["rank"], flag["node"], flag["host"], flag["reason"]) == (1, 0, "10.0.0.0", "slow")
    assert flag["step"] == 100 and flag["score"] == pytest.approx(44 / 29, rel=1e-3)
    assert flag["compute_s"] == pytest.approx(0.045) and flag["reference_s"] == pytest.approx(0.029)
    assert job.model.state is JobState.RUNNING and not job.events("fault")  # ignore: reported
    status = status_of(job.model, job.now)
    assert status["flagged"] == [{"rank": 1, "node": 0, "step": 100}]
    assert "flagged: 1 rank(s): rank 1 (node 0, ?, step 100)" in render(status)


@pytest.mark.parametrize(
    "slow",
    [
        {},  # steady
        {2: (40 * MS, 31 * MS)},  # jitter: slow on some steps, not on most
        {r: (60 * MS, 58 * MS) for r in range(4)},  # a loaded host slows every rank alike
        {0: (1.5 * MS, 1.4 * MS), 1: (1 * MS, 1 * MS), 2: (1 * MS, 1 * MS), 3: (1 * MS, 1 * MS)},
    ],
    ids=["steady", "jitter", "loaded-host", "sub-ms-noise"],
)
def test_no_false_flag(job: Job, slow: dict[int, tuple[float, float]]) -> None:
    for _ in range(50):
        job.advance(0.5)
        steady(job, slow)
        job.tick()
    assert job.events("flagged") == []


def test_a_compile_step_or_declared_stretch_is_not_judged(job: Job) -> None:
    for r in range(4):
        report(
            job,
            r,
            0.01,
            compute=(200 * MS, 190 * MS) if r == 0 else (30 * MS, 29 * MS),
            long=r == 0,
        )
    job.tick()
    assert job.events("flagged") == []


def test_two_ranks_are_judged_against_their_own_early_steps() -> None:
    j = Job("recover-in-place,exit", node_nums=2, proc_per_node=1)
    j.running(step=100)
    for _ in range(3):
        for r in range(2):
            report(j, r, 0.01, compute=(30 * MS, 29 * MS))
        j.tick()
    assert j.events("flagged") == []
    for _ in range(2):  # on two reports in a row
        report(j, 0, 0.01, compute=(30 * MS, 29 * MS))
        report(j, 1, 0.01, compute=(46 * MS, 45 * MS))
        j.tick()
    (flag,) = j.events("flagged")
    assert flag["rank"] == 1 and "its own" in flag["detail"]


# ----------------------------------------------------------------------------- rank side
def run(clock: StepClock, t: float, steps: int, step_s: float, coll_s: float = 0.0) -> float:
    for _ in range(steps):
        clock.enter_collective(t + step_s - coll_s)
        clock.leave_collective(t + step_s)
        t += step_s
        clock.committed(t)
    return t


def test_step_clock_skips_the_warm_steps_and_reports_p99_once_enough_are_timed() -> None:
    c = StepClock(2.0, 4.0, clock=0.0)
    t = run(c, 0.0, WARM, 5.0)  # compilation
    t = run(c, t, MIN_TIMED - 1, 0.02, coll_s=0.005)
    values, urgent = c.report(t, 1)
    assert values[3] == -1.0 and not urgent
    t = run(c, t, WINDOW - MIN_TIMED + 1, 0.02, coll_s=0.005)
    values, _ = c.report(t + 0.1, 1)
    epoch, idle, coll, p99, med, lo, long = values
    assert (epoch, long, coll) == (1.0, 0.0, -1.0)
    assert idle == pytest.approx(0.1) and p99 == pytest.approx(0.02)
    assert med == pytest.approx(0.015) and lo == pytest.approx(0.015)


def test_step_clock_reports_a_stall_and_a_compute_shift_as_urgent() -> None:
    c = StepClock(2.0, 4.0, clock=0.0)
    t = run(c, 0.0, WARM + MIN_TIMED + WINDOW, 0.03)
    assert c.report(t, 1)[1] is False  # first level: not urgent
    c.enter_collective(t + 0.001)
    values, urgent = c.report(t + 2.5, 1)  # half the 4 s floor without a commit
    assert urgent and values[2] == pytest.approx(2.499)
    c.leave_collective(t + 2.6)
    t = run(c, t + 2.6, WINDOW, 0.045)
    for beat in range(SHIFT_BEATS):  # compute 1.5x: on the next few beats
        assert c.report(t + beat * 0.5, 1)[1] is True
    assert c.report(t + 1.9, 1)[1] is False  # and not yet stalled (2 s)


def test_step_clock_times_nothing_inside_a_long_stretch_or_a_pause() -> None:
    c = StepClock(2.0, 4.0, clock=0.0)
    t = run(c, 0.0, WARM + MIN_TIMED, 0.02)
    with c.long_stretch():
        t = run(c, t, 3, 60.0)
        values, urgent = c.report(t + 30.0, 1)
        assert values[6] == 1.0 and not urgent
    assert max(c.steps) == pytest.approx(0.02)
    c.paused = True
    assert c.report(t + 100.0, 1)[0][6] == 1.0
    c.restart(t)
    assert not c.steps and c.report(t, 2)[0][3] == -1.0


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("hang_k", 0.5, "hang_k must be a number in 1..1000, got 0.5"),
        ("hang_floor_s", 0.0, "hang_floor_s must be a positive number of seconds, got 0.0"),
        ("slow_ratio", 1.0, "slow_ratio must be a number in (1, 100), got 1.0"),
    ],
)
def test_bad_detection_settings_are_named(field: str, value: float, said: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(said)):
        JobConfig(**{field: value})


def test_at_the_fixed_bound_before_step_times_are_known_the_reports_name_the_culprit(
    job: Job,
) -> None:
    """A rank stuck in its own compute before the adaptive rule has step times (p99 -1: the
    first steps after the start or a recovery): the fixed ``hang_timeout_s`` finds the hang,
    and the others' reports (waiting in a collective) name it, not the least recently heard
    rank (the demo's compute hang at step 8 replaced rank 0, then waited 60 s for rank 1 to
    stop)."""
    job.commit(100, ranks=[0])  # the least recently heard would be rank 1..3, not 2 alone
    job.advance(31.0)
    stuck_in_compute(job, 2, 31.0, p99=-1.0)
    job.tick()
    (fault,) = job.events("fault")
    assert (fault["kind"], fault["rank"]) == ("hang", 2), fault
    assert "no step progress for" in fault["detail"] and "rank 2: not waiting" in fault["detail"]
    assert job.model.round is not None and job.model.round.replace_ranks == {2}


def test_at_the_fixed_bound_without_reports_the_least_recently_heard_is_named(job: Job) -> None:
    job.advance(31.0)
    job.model.ranks[3].last_seen -= 1.0  # a stopped process: silent, the others wait for it
    job.tick()
    (fault,) = job.events("fault")
    assert (fault["kind"], fault["rank"]) == ("hang", 3), fault
    assert "not waiting" not in fault["detail"]
