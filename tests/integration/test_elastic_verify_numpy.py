"""An elastic run compared bit for bit with the right reference (issue 9 #14).

Elastic training sums the gradients of a shrunk world in another order, so an uninterrupted
run on the full world can only match it approximately. A reference that replays the elastic
run's world schedule (:mod:`ms_recover.localrun.worlds`) must match it bit for bit.
"""

from __future__ import annotations

from typing import Any

import pytest

from ms_recover.localrun import worlds
from ms_recover.localrun.faults import Faults
from ms_recover.localrun.job import LocalJob
from ms_recover.localrun.wait import wait_for

from .jobs import results, run_to_end, trainer_job

pytestmark = pytest.mark.timeout(240)

STEPS = 160
SHAPE: dict[str, Any] = dict(node_nums=4, proc_per_node=1, wait_reschedule_timeout_s=1.5)
# A workload knob: room for the pod to come back mid-run (a new interpreter's start-up, slower
# on a loaded host) after the world shrank.
SLOW = ("--step-time", "0.08")


def shrunk(job: LocalJob) -> bool:
    """Whether the world shrank to the three survivors; supervises the pods meanwhile."""
    job.pods.poll()
    return any(e["active"] == [0, 1, 2] for e in job.find("world"))


def test_an_elastic_run_equals_a_reference_that_shrinks_and_grows_at_the_same_steps(
    tmp_path: Any,
) -> None:
    run_out, ref_out = str(tmp_path / "run"), str(tmp_path / "ref")
    with trainer_job(
        run_out,
        Faults().node(rank=3, step=2),  # early: the loss is still far from 0
        "recover,elastic-training,exit",
        steps=STEPS,
        extra=SLOW,
        # The lost pod comes back once the world shrank (after the 1.5 s wait), not after a
        # fixed delay that a loaded host's slow detection could outlast: first shrink, then grow.
        reschedule_delay_s=600.0,
        **SHAPE,
    ) as job:
        wait_for(lambda: shrunk(job), 60, "the world shrank to the survivors")
        assert job.pods.reschedule_now() == [3]
        run_to_end(job, timeout_s=150)
    assert job.exit_code == 0
    run = results(run_out)
    schedule = [(s, ranks) for s, ranks in run[0]["worlds"]]
    assert [ranks for _, ranks in schedule] == [[0, 1, 2, 3], [0, 1, 2], [0, 1, 2, 3]]
    shrink, grow = schedule[1][0], schedule[2][0]
    assert schedule[0][0] == 0 and 2 < shrink < grow < STEPS
    resumes = sorted(r["target_step"] + 1 for r in job.find("recovery", ok=True))
    assert resumes == [shrink, grow]  # the manager's story and the rank's agree
    assert run[3]["worlds"] == [[grow, [0, 1, 2, 3]]]  # the returning rank's own history
    assert len({r["sha256"] for r in run}) == 1

    env = {worlds.ENV: worlds.encode(schedule)}
    with trainer_job(ref_out, steps=STEPS, env=env, **SHAPE) as ref_job:
        run_to_end(ref_job, timeout_s=90)
    assert ref_job.exit_code == 0
    ref = results(ref_out)
    assert [r["sha256"] for r in ref] == [run[0]["sha256"]] * 4, "not bit-identical"
    assert all(r["recoveries"] == 0 and r["skipped"] == [] for r in ref)
    # The losses of the shrunk steps are the shrunk world's, so they match exactly too.
    both = set(run[0]["losses"]) & set(ref[0]["losses"])
    assert {str(s) for s in (shrink, grow - 1, grow)} <= both
    assert all(run[0]["losses"][s] == ref[0]["losses"][s] for s in both)

    # The comparison is sensitive: an uninterrupted run on the full world differs.
    with trainer_job(str(tmp_path / "plain"), steps=STEPS, **SHAPE) as plain_job:
        run_to_end(plain_job, timeout_s=90)
    assert {r["sha256"] for r in results(str(tmp_path / "plain"))} != {run[0]["sha256"]}
