"""``bench allreduce``: the rows, the targets' verdicts and MindSpore's worker reports.

Pure functions fed with given times and given report files: no process, no clock, no timing.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from ms_recover import env as E
from ms_recover.bench import allreduce, mscluster
from ms_recover.bench.mscluster import (
    AttemptState,
    Limits,
    Outcome,
    Plan,
    RankProgress,
    assess,
    event_line,
    parse_progress,
)

pytestmark = pytest.mark.timeout(60)

GB = 1_000_000_000
PLAN = Plan(counts=(4, 8), world=2, repeats=2)
LIMITS = Limits(form_s=120.0, run_s=600.0, tries=3)
RESULT = {4: [0.1, 0.2], 8: [0.3, 0.4]}


def rows(result: allreduce.SizeResult, world: int = 2) -> dict[str, Any]:
    return {m.name.split(": ", 1)[1]: m for m in allreduce.size_measures(result, world, 5)}


# --- the rows and verdicts of one size ---------------------------------------------------


def test_every_target_met_at_its_limit() -> None:
    # 2 ranks: busbw = 2 (n-1)/n x bytes / time = bytes / time.
    got = rows(allreduce.SizeResult(16.0, GB, 0.5, copy_s=0.25, mindspore_s=2.5, exchange_s=0.425))
    assert got["host allreduce busbw"].value == pytest.approx(2.0)
    assert got["MindSpore AllReduce busbw"].value == pytest.approx(0.4)
    assert got["loopback socket copy"].value == pytest.approx(4.0)
    assert got["raw full-duplex socket exchange"].value == pytest.approx(1 / 0.425)
    ratio, share = got["host / MindSpore busbw"], got["host allreduce / raw exchange"]
    assert (ratio.value, ratio.limit, ratio.verdict) == (pytest.approx(5.0), 5.0, "PASS")
    assert (share.value, share.limit, share.verdict) == (pytest.approx(85.0), 85.0, "PASS")
    small = rows(allreduce.SizeResult(0.0353, 37_000, 40e-6, copy_s=20e-6, mindspore_s=None))
    times = small["host allreduce time / socket copy time"]
    assert (times.value, times.limit, times.verdict) == (pytest.approx(2.0), 2.0, "PASS")


def test_every_target_missed() -> None:
    got = rows(allreduce.SizeResult(16.0, GB, 0.5, copy_s=0.1, mindspore_s=2.0, exchange_s=0.42))
    assert got["host / MindSpore busbw"].value == pytest.approx(4.0)
    assert got["host / MindSpore busbw"].verdict == "MISS"
    assert got["host allreduce / raw exchange"].value == pytest.approx(84.0)
    assert got["host allreduce / raw exchange"].verdict == "MISS"
    small = rows(allreduce.SizeResult(0.0353, 37_000, 41e-6, copy_s=20e-6, mindspore_s=None))
    assert small["host allreduce time / socket copy time"].verdict == "MISS"


def test_each_size_carries_only_its_own_targets() -> None:
    # The exchange target holds from 16 MiB, the copy target up to 64 KiB; between, reference.
    mid = rows(
        allreduce.SizeResult(1.0, 1 << 20, 1.0, copy_s=0.1, mindspore_s=None, exchange_s=0.1)
    )
    assert mid["host allreduce / raw exchange"].verdict == "-"
    assert mid["host allreduce time / socket copy time"].verdict == "-"
    small = rows(
        allreduce.SizeResult(0.0353, 37_000, 1.0, copy_s=0.1, mindspore_s=None, exchange_s=0.1)
    )
    assert small["host allreduce / raw exchange"].verdict == "-"
    big = rows(
        allreduce.SizeResult(64.0, 64 << 20, 1.0, copy_s=0.1, mindspore_s=None, exchange_s=0.1)
    )
    assert big["host allreduce time / socket copy time"].verdict == "-"
    assert big["host allreduce / raw exchange"].verdict == "MISS"


def test_the_ceiling_is_the_faster_raw_exchange_of_each_repetition() -> None:
    # each way is first taken at its slowest rank, then the faster way per repetition
    ranks = [
        {"threaded": [1.0, 5.0], "polled": [2.0, 3.0]},
        {"threaded": [1.5, 4.0], "polled": [1.0, 6.0]},
    ]
    assert allreduce.best_exchange(ranks) == [[1.5, 5.0]]


def test_bus_bandwidth_scales_with_the_ring_factor() -> None:
    result = allreduce.SizeResult(1.0, GB, 1.0, copy_s=1.0, mindspore_s=3.0, exchange_s=1.0)
    got = rows(result, world=4)
    assert got["raw full-duplex socket exchange"].value == pytest.approx(1.5)  # the same bytes
    assert got["host allreduce busbw"].value == pytest.approx(1.5)  # 2 x 3/4
    assert got["MindSpore AllReduce busbw"].value == pytest.approx(0.5)
    assert got["host / MindSpore busbw"].value == pytest.approx(3.0)  # the factor cancels
    assert got["loopback socket copy"].value == pytest.approx(1.0)


def test_a_repetition_takes_as_long_as_its_slowest_rank() -> None:
    # per repetition: max(1, 2) = 2, max(5, 1) = 5, max(3, 4) = 4 -> median 4
    assert allreduce.slowest_median([[1.0, 5.0, 3.0], [2.0, 1.0, 4.0]]) == 4.0


def test_element_counts_of_sizes() -> None:
    assert allreduce.element_count(1) == 262_144
    assert allreduce.element_count(64) == 16 * 1024 * 1024
    assert allreduce.element_count(1e-9) == 1


# --- a MindSpore cluster that never formed -------------------------------------------------


def test_an_unformed_cluster_gives_no_number_and_says_why() -> None:
    reason = "try 1: the cluster did not form within 120 s (init() returned on ranks [0] of 2)"
    result = allreduce.SizeResult(16.0, 16 << 20, host_s=0.02, copy_s=0.005, mindspore_s=None)
    report = allreduce.build_report([result], 2, 5, Outcome(None, reason, (reason,)), {}, {})
    got = {m.name: m for m in report.measures}
    ms = got["16 MiB: MindSpore AllReduce busbw"]
    ratio = got["16 MiB: host / MindSpore busbw"]
    assert ms.value is None and ms.note == "not measured"
    assert ratio.value is None and ratio.passed is None and ratio.verdict == "-"
    assert ratio.limit == 5.0, "the target is still shown"
    assert got["16 MiB: host allreduce time / socket copy time"].value == 4.0, "the rest is kept"
    text = report.format()
    assert f"MindSpore CPU AllReduce not measured: {reason}" in text
    ms_line = next(line for line in text.splitlines() if "MindSpore AllReduce busbw " in line)
    assert "n/a" in ms_line
    js = report.to_json()
    assert js["samples"]["mindspore_tries"] == [reason]
    assert [m["pass"] for m in js["measures"] if "MindSpore" in m["name"]] == [None, None]


def test_a_cluster_that_formed_on_a_later_try_says_so() -> None:
    result = allreduce.SizeResult(1.0, GB, host_s=0.5, copy_s=0.25, mindspore_s=2.5)
    outcome = Outcome({}, "", ("try 1: rank 1 exited with code 1 before the cluster formed",))
    text = allreduce.build_report([result], 2, 5, outcome, {}, {}).format()
    assert "formed on try 2: try 1: rank 1 exited with code 1 before the cluster formed" in text
    assert "not measured" not in text


# --- a worker's report file ----------------------------------------------------------------


def test_a_worker_report_round_trips() -> None:
    text = event_line("formed", rank=1, world=2) + event_line(
        "result", rank=1, world=2, times={str(n): ts for n, ts in RESULT.items()}
    )
    assert parse_progress(text) == RankProgress(formed=True, times=RESULT)


def test_a_line_still_being_written_is_not_read() -> None:
    line = event_line("result", times={"4": [0.1, 0.2], "8": [0.3, 0.4]})
    assert parse_progress(event_line("formed") + line[:-5]) == RankProgress(formed=True)


def test_an_error_and_an_unreadable_line_are_errors() -> None:
    err = parse_progress(event_line("formed") + event_line("error", error="RuntimeError: boom"))
    assert err.formed and err.error == "RuntimeError: boom"
    assert "unreadable event line" in parse_progress('{"event": "result"}\n').error
    assert "unreadable event line" in parse_progress("not json\n").error


# --- where an attempt stands ---------------------------------------------------------------


def judge(
    progress: dict[int, RankProgress],
    exits: dict[str, int | None] | None = None,
    now: float = 10.0,
    formed_at: float | None = None,
) -> mscluster.Verdict:
    running = {"scheduler": None, "rank 0": None, "rank 1": None}
    return assess(PLAN, progress, {**running, **(exits or {})}, now, 0.0, formed_at, LIMITS)


FORMED = RankProgress(formed=True)
DONE = RankProgress(formed=True, times=RESULT)


def test_forming_then_running_then_done() -> None:
    assert judge({}).phase is AttemptState.FORMING
    assert judge({0: FORMED}).phase is AttemptState.FORMING
    assert judge({0: FORMED, 1: FORMED}).phase is AttemptState.RUNNING
    assert judge({0: DONE, 1: FORMED}, formed_at=5.0).phase is AttemptState.RUNNING
    # A worker that reported may exit, and the scheduler with it.
    done = judge({0: DONE, 1: DONE}, {"rank 0": 0, "scheduler": 0})
    assert done.phase is AttemptState.DONE


def test_a_cluster_that_does_not_form_in_time_is_worth_another_try() -> None:
    v = judge({0: FORMED}, now=LIMITS.form_s)
    assert (v.phase, v.retry) == (AttemptState.FAILED, True)
    assert v.reason == "the cluster did not form within 120 s (init() returned on ranks [0] of 2)"


def test_a_death_before_forming_is_worth_another_try() -> None:
    v = judge({0: FORMED}, {"rank 1": 1})
    assert (v.phase, v.retry) == (AttemptState.FAILED, True)
    assert v.reason == "rank 1 exited with code 1 before the cluster formed"


def test_a_failure_after_forming_is_a_result_not_retried() -> None:
    died = judge({0: DONE, 1: FORMED}, {"rank 0": 0, "scheduler": -9}, formed_at=5.0)
    assert (died.phase, died.retry) == (AttemptState.FAILED, False)
    assert died.reason == "scheduler exited with signal 9 before every rank reported"
    wrong = judge({0: RankProgress(True, None, "RuntimeError: element 3 is 2.0"), 1: FORMED})
    assert (wrong.phase, wrong.retry, wrong.reason) == (
        AttemptState.FAILED,
        False,
        "rank 0: RuntimeError: element 3 is 2.0",
    )
    slow = judge({0: DONE, 1: FORMED}, now=5.0 + LIMITS.run_s, formed_at=5.0)
    assert (slow.phase, slow.retry) == (AttemptState.FAILED, False)
    assert slow.reason == "ranks [1] did not report within 600 s of forming"


def test_an_error_in_init_is_worth_another_try() -> None:
    v = judge({1: RankProgress(error="RuntimeError: Topology build timed out")})
    assert (v.phase, v.retry) == (AttemptState.FAILED, True)


def test_a_report_missing_a_size_or_a_repetition_is_a_failure() -> None:
    short = RankProgress(True, {4: [0.1, 0.2], 8: [0.3]})
    v = judge({0: DONE, 1: short})
    assert (v.phase, v.retry) == (AttemptState.FAILED, False)
    assert "rank 1 reported {4: 2, 8: 1}" in v.reason


def test_rank_times_by_count_then_rank() -> None:
    other = RankProgress(True, {4: [0.5, 0.6], 8: [0.7, 0.8]})
    assert mscluster.rank_times(PLAN, {0: DONE, 1: other}) == {
        4: [[0.1, 0.2], [0.5, 0.6]],
        8: [[0.3, 0.4], [0.7, 0.8]],
    }


# --- msrun's environment -------------------------------------------------------------------


def test_cluster_env_is_msruns_and_drops_inherited_cluster_settings() -> None:
    base = {
        "PATH": "/bin",
        E.ROLE: E.ROLE_WORKER,
        E.NODE_ID: "7",
        E.RANK_ID: "7",
        E.SCHED_HOST: "10.0.0.1",
        E.SECRET: "s3cret",
        E.AUTOSTART: "1",
    }
    worker = mscluster.cluster_env(base, E.ROLE_WORKER, 4321, PLAN, 1, LIMITS)
    assert worker == {
        "PATH": "/bin",
        "MS_ROLE": "MS_WORKER",
        "MS_SCHED_HOST": "127.0.0.1",
        "MS_SCHED_PORT": "4321",
        "MS_WORKER_NUM": "2",
        "MS_TOPO_TIMEOUT": "120",
        "MS_NODE_ID": "1",
    }
    sched = mscluster.cluster_env(base, E.ROLE_SCHED, 4321, PLAN, None, LIMITS)
    assert sched["MS_ROLE"] == "MS_SCHED" and "MS_NODE_ID" not in sched


# --- retries -------------------------------------------------------------------------------


def test_retries_only_an_unformed_cluster(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    verdicts = [
        mscluster.Verdict(AttemptState.FAILED, "the cluster did not form within 120 s", retry=True),
        mscluster.Verdict(AttemptState.FAILED, "rank 0: RuntimeError: boom", retry=False),
        mscluster.Verdict(AttemptState.DONE),
    ]
    dirs: list[str] = []

    def attempt(plan: Plan, adir: pathlib.Path, limits: Limits) -> Any:
        dirs.append(adir.name)
        return verdicts.pop(0), {0: DONE, 1: DONE}

    monkeypatch.setattr(mscluster, "_attempt", attempt)
    out = mscluster.measure(PLAN, tmp_path, LIMITS)
    assert dirs == ["try-1", "try-2"], "a failure after forming is not retried"
    assert out.times is None
    assert out.tries == (
        "try 1: the cluster did not form within 120 s",
        "try 2: rank 0: RuntimeError: boom",
    )
    assert out.reason.startswith("try 1: the cluster did not form") and str(tmp_path) in out.reason


def test_gives_up_after_its_tries(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    unformed = mscluster.Verdict(AttemptState.FAILED, "no", retry=True)
    monkeypatch.setattr(mscluster, "_attempt", lambda *a: (unformed, {}))
    out = mscluster.measure(PLAN, tmp_path, Limits(1.0, 1.0, tries=2))
    assert out.times is None and out.tries == ("try 1: no", "try 2: no")


def test_the_calls_into_a_kept_buffer_have_the_same_targets() -> None:
    big = rows(
        allreduce.SizeResult(
            64.0,
            64 << 20,
            0.2,
            copy_s=0.1,
            mindspore_s=None,
            exchange_s=0.085,
            out_s=0.1,
            inplace_s=0.101,
        )
    )
    out, inplace = (
        big["host allreduce(out=buf) / raw exchange"],
        big["host allreduce(mean, out=x) / raw exchange"],
    )
    assert (out.value, out.limit, out.verdict) == (pytest.approx(85.0), 85.0, "PASS")
    assert (inplace.value, inplace.verdict) == (pytest.approx(8500 / 101), "MISS")
    assert big["host allreduce / raw exchange"].verdict == "MISS", "the plain row is kept"
    assert "host allreduce(out=buf) time / socket copy time" not in big
    small = rows(
        allreduce.SizeResult(
            0.0353,
            37_000,
            40e-6,
            copy_s=20e-6,
            mindspore_s=None,
            exchange_s=30e-6,
            out_s=40e-6,
            inplace_s=41e-6,
        )
    )
    assert small["host allreduce(out=buf) time / socket copy time"].verdict == "PASS"
    assert small["host allreduce(mean, out=x) time / socket copy time"].verdict == "MISS"
    assert small["host allreduce(out=buf) / raw exchange"].verdict == "-", "only from 16 MiB"
    unmeasured = rows(allreduce.SizeResult(16.0, GB, 0.5, copy_s=0.1, mindspore_s=None))
    assert not [name for name in unmeasured if "out=" in name], "no time, no row"
