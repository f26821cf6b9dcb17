"""A spare node takes a lost node's place (docs/design.md §1f): 2 nodes and 1 spare pod
(``ms-recover agent --spare``, its ranks pre-warmed), node 1's pod SIGKILLed whole. The
manager gives node 1 to the spare at once instead of waiting for the recreated pod; the
spare's ranks are repaired from replicas: job exit 0, 0 lost steps, bit-identical weights.
The recreated pod becomes the next spare, whether it comes back as one (the local pods'
default) or as node 1 again (as a Kubernetes pod would: the manager tells it to)."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import pytest

from ms_recover import exitcodes
from ms_recover.agent.agent import Agent
from ms_recover.config import JobConfig
from ms_recover.localrun.faults import Faults
from ms_recover.localrun.job import LocalJob, free_port
from ms_recover.localrun.wait import wait_for
from ms_recover.manager import sparenodes
from ms_recover.manager.server import ManagerServer
from ms_recover.observability.events import EventLog

from .jobs import STEPS, results, shared_reference_sha, trainer_job

pytestmark = pytest.mark.timeout(120)

#: The lost pod comes back this long after its loss (a cold pod takes longer on a cluster:
#: scheduling, the image, MindSpore's import and compile).
COLD_POD_S = 4.0
#: From the round's start to the spare's ranks registered: its processes are already running
#: (measured 0.01-0.03 s; the bound leaves room for a loaded host).
REPLACE_S = 1.0


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


def test_a_spare_node_moves_to_the_next_manager_that_answers(tmp_path):
    """With standby managers (``MS_RECOVER_MANAGERS``) a spare follows the agent's rule: the
    first manager never answers it (gone, or a standby), so it offers itself to the next,
    and leaves with that one's exit code when the job ends."""
    cfg = JobConfig(job_id="spare-failover", node_nums=2, proc_per_node=2, manager_port=0)
    srv = ManagerServer(cfg.replace(heartbeat_s=0.25), events=EventLog(), bind="127.0.0.1")
    thread = srv.start_thread()
    managers = (f"127.0.0.1:{free_port()}", f"127.0.0.1:{srv.port}")
    agent_cfg = cfg.replace(heartbeat_s=0.25, managers=managers, manager_port=srv.port)
    command = [sys.executable, "-m", "ms_recover.localrun.numpy_trainer", "--out", str(tmp_path)]
    agent = Agent(agent_cfg, command, spare=True)
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(agent.run()), daemon=True)
    runner.start()
    try:
        spares = wait_for(lambda: srv.status()["spares"], 20, "the spare at the second manager")
        assert [s["pid"] for s in spares] == [os.getpid()] and agent.manager_index == 1
        with srv._lock:  # the job ends (as the executor would end it): the spare leaves
            srv.executor.execute(sparenodes.release_all(srv.model, exitcodes.JOB_EXIT, "over"))
        wait_for(lambda: codes, 20, "the spare leaves")
        assert codes == [exitcodes.JOB_EXIT]
    finally:
        agent.stop()
        runner.join(20)
        srv.stop()
        thread.join(10)
    assert not runner.is_alive() and not thread.is_alive()
