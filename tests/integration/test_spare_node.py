"""A spare node takes a lost node's place (docs/design.md §1f): 2 nodes and 1 spare pod
(``ms-recover agent --spare``, its ranks pre-warmed), node 1's pod SIGKILLed whole. The
manager gives node 1 to the spare at once instead of waiting for the recreated pod; the
spare's ranks are repaired from replicas: job exit 0, 0 lost steps, bit-identical weights.
The recreated pod becomes the next spare, whether it comes back as one (the local pods'
default) or as node 1 again (as a Kubernetes pod would: the manager tells it to)."""

from __future__ import annotations

from typing import Any

import pytest

from ms_recover.localrun.faults import Faults
from ms_recover.localrun.job import LocalJob

from .jobs import STEPS, results, shared_reference_sha, trainer_job

pytestmark = pytest.mark.timeout(120)

#: The lost pod comes back this long after its loss (a cold pod takes longer on a cluster:
#: scheduling, the image, MindSpore's import and compile).
COLD_POD_S = 4.0
#: From the round's start to the spare's ranks registered: warm processes, no interpreter
#: start (a cold pod's ranks take 1 s or more here for Python and numpy alone).
REPLACE_S = 0.5


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    return shared_reference_sha(tmp_path_factory)


def spare_job(out: str, back_as_spare: bool) -> LocalJob:
    job = trainer_job(
        out,
        Faults().node(rank=2, step=6),
        strategy="recover",
        extra=("--step-time", "0.3"),
        reschedule_delay_s=COLD_POD_S,
        spare_pods=1,  # pod 2, beside the job's two
    )
    job.pods.back_as_spare = back_as_spare
    return job


def check_recovered(job: LocalJob, out: str, reference: str) -> dict[str, Any]:
    assert job.exit_code == 0, [(e["event"], e.get("reason")) for e in job.find("decision")]
    promoted = job.find("spare_promoted")
    assert [(p["node_rank"], p["spares_left"]) for p in promoted] == [(1, 0)], promoted
    (recovery,) = job.find("recovery")
    assert recovery["ok"] and recovery["strategy"] == "recover", recovery
    assert sorted(recovery["replaced"]) == [2, 3] and recovery["lost_steps"] == 0
    assert recovery["phases"]["replace"] < REPLACE_S, recovery
    # Training again before the recreated pod even started.
    assert recovery["mttr_s"] < COLD_POD_S, recovery
    final = results(out)
    assert [r["sha256"] for r in final] == [reference] * 4
    assert all(r["committed"] == STEPS - 1 for r in final)
    # Every pod ended 0: the recreated one was a spare, sent away at the job's end.
    assert job.pods.exit_codes == {0: 0, 1: 0, 2: 0}, job.pods.history
    return recovery


def test_a_spare_node_takes_the_lost_nodes_place(tmp_path, reference):
    out = str(tmp_path)
    with spare_job(out, back_as_spare=True) as job:
        assert job.wait(90), f"job did not finish: {job.status()}"
    check_recovered(job, out, reference)
    starts = [what for _, pod, what in job.pods.history if "started" in what]
    assert sum(w.startswith("spare pod") for w in starts) == 2, job.pods.history
    spares = [(e["pid"], e["left"], e["reason"]) for e in job.find("spare")]
    assert len({pid for pid, left, _ in spares if not left}) == 2, spares
    assert spares[-1][1:] == (True, "every rank finished training"), spares


def test_a_pod_that_comes_back_as_the_taken_node_becomes_the_spare(tmp_path, reference):
    out = str(tmp_path)
    with spare_job(out, back_as_spare=False) as job:
        assert job.wait(90), f"job did not finish: {job.status()}"
    check_recovered(job, out, reference)
    # The recreated pod said hello as node 1, was told to become a spare, and registered so
    # (forgotten and registered again if it fell silent meanwhile), and left at the end.
    spares = [(e["pid"], e["left"], e["reason"]) for e in job.find("spare")]
    assert len({pid for pid, left, _ in spares if not left}) == 2, spares
    assert spares[-1][1:] == (True, "every rank finished training"), spares
    assert len(job.find("member", role="agent", node_rank=1)) == 2  # the first pod, the spare
