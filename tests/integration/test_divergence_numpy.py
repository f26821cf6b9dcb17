"""Replica divergence on real numpy-trainer processes (issue 9 #4).

A ``bitflip`` fault flips one bit of one rank's state after it commits a step and tells no one,
as silent data corruption would. Only the replicas' state digests can reveal it: in steady
state every ``digest_every_steps`` steps, or at the next stop.
"""

from __future__ import annotations

from typing import Any

import pytest

from ms_recover.localrun.faults import Faults

from .jobs import results, run_to_end, shared_reference_sha, trainer_job

pytestmark = pytest.mark.timeout(180)
STEPS = 40
# A workload knob: the check at step 19 must reach the ranks well before they finish.
SLOW = ("--step-time", "0.05")


@pytest.fixture(scope="session")  # shared: the scenarios spread over xdist workers
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    return shared_reference_sha(tmp_path_factory, STEPS)


def _story(job: Any) -> str:
    return "\n".join(
        f"{e['event']}: {e.get('reason') or e.get('detail')}"
        for e in job.events.recent()
        if e["event"] in ("fault", "decision", "divergence", "recovery")
    )


def test_a_silently_corrupted_rank_is_found_and_repaired_from_the_majority(
    tmp_path: Any, reference: str
) -> None:
    out = str(tmp_path)
    faults = Faults().add("bitflip", rank=2, step=12)
    with trainer_job(
        out,
        faults,
        strategy="retry,recover-in-place,exit",
        steps=STEPS,
        extra=SLOW,
        digest_every_steps=10,
    ) as job:
        run_to_end(job)
        assert job.exit_code == 0, _story(job)
    (event,) = job.find("divergence")
    assert event["step"] == 19 and event["ranks"] == [2] and event["majority"] == [0, 1, 3]
    assert event["outcome"] == "repair"
    digests = event["digests"]
    assert digests["0"] == digests["1"] == digests["3"] != digests["2"]
    (fault,) = job.find("fault", kind="diverged")
    assert fault["rank"] == 2 and digests["2"] in fault["detail"]
    (recovery,) = job.find("recovery", ok=True)
    assert recovery["strategy"] == "retry" and recovery["lost_steps"] == 0
    final = results(out)
    assert [r["sha256"] for r in final] == [reference] * 4, "not repaired to the majority's bits"
    assert all(r["committed"] == STEPS - 1 for r in final)
    assert final[2]["incarnation"] == 0  # repaired in place, never restarted


def test_a_corrupted_survivor_is_caught_at_the_next_stop(tmp_path: Any, reference: str) -> None:
    # The steady-state check is off: only the digests sent with STOPPED can tell.
    out = str(tmp_path)
    faults = Faults().add("bitflip", rank=2, step=8).kill(rank=1, step=12)
    with trainer_job(out, faults, steps=STEPS, digest_every_steps=0) as job:
        run_to_end(job)
        assert job.exit_code == 0, _story(job)
    (event,) = job.find("divergence")
    assert event["ranks"] == [2] and event["majority"] == [0, 3] and event["step"] == 12
    (recovery,) = job.find("recovery", ok=True)
    assert recovery["strategy"] == "recover-in-place" and recovery["replaced"] == [1]
    assert [r["sha256"] for r in results(out)] == [reference] * 4


def test_two_replicas_that_differ_end_the_job_without_guessing(tmp_path: Any) -> None:
    out = str(tmp_path)
    faults = Faults().add("bitflip", rank=1, step=12)
    with trainer_job(
        out,
        faults,
        strategy="retry,recover-in-place,exit",
        steps=STEPS,
        extra=SLOW,
        node_nums=1,
        digest_every_steps=10,
    ) as job:
        run_to_end(job)
    assert job.exit_code not in (0, None), _story(job)
    (event,) = job.find("divergence")
    assert event["outcome"] == "escalate" and event["ranks"] == [0, 1]
    assert "disagree with no majority" in event["reason"]
    decision = job.find("decision")[-1]
    assert decision["strategy"] == "exit"
    for skipped in ("retry", "recover-in-place"):
        assert f"{skipped}: no healthy replica left for shard 0" in decision["reason"]
    assert job.find("recovery", ok=True) == []
