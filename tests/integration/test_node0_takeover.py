"""Node 0 lost whole, with the manager (issue 26 item 3, docs/manager-takeover.md): the
manager is a process of node 0's pod and a standby waits in node 1's. Killing node 0's pod
(manager, agent and ranks at once) is recovered at process level: the standby takes over,
the survivors keep their processes and are coordinated again within 3 s of the detection,
node 0's ranks come back in a recreated pod and are repaired from replicas, 0 lost steps,
bit-identical; the recreated node 0's manager stands by instead of splitting the brain.

A planned stop of node 0 (SIGTERM to its manager and its agent: the pod deleted or drained)
is recovered the same way, without a loss: the manager hands over to the standby at once and
node 0's leaving is an ordinary planned stop for its successor."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import pytest

from ms_recover import exitcodes
from ms_recover.config import JobConfig
from ms_recover.localrun.faults import Faults
from ms_recover.localrun.job import ManagerPodJob
from ms_recover.localrun.wait import wait_for
from ms_recover.manager.server import ManagerServer
from ms_recover.observability.events import EventLog
from ms_recover.observability.status import query
from ms_recover.strategy import parse_strategies
from ms_recover.worker.dump import load_npz, locate, read_manifest
from ms_recover.worker.repair import sha256_of

from .jobs import STEPS, job_config, reference_sha, results, shared_reference_sha

pytestmark = pytest.mark.timeout(240)

#: The target: survivors coordinated again within this many seconds of the loss's detection.
TAKEOVER_S = 3.0


@pytest.fixture(scope="session")  # shared: the scenarios spread over xdist workers
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    return shared_reference_sha(tmp_path_factory)


def pod_job(
    out: str, faults: Faults | None = None, *extra: str, standby: bool = True, **changes: Any
) -> ManagerPodJob:
    command = [
        *(sys.executable, "-m", "ms_recover.localrun.numpy_trainer"),
        *("--steps", str(STEPS), "--out", out, *extra),
    ]
    env = {"OPENBLAS_NUM_THREADS": "1", **(faults.to_env() if faults else {})}
    cfg = job_config(**changes)
    return ManagerPodJob(cfg, command, env, os.path.join(out, "logs"), standby=standby)


def manager_status(cfg: JobConfig, host_port: str) -> dict[str, Any] | None:
    host, _, port = host_port.rpartition(":")
    return query(cfg.replace(manager_host=host, manager_port=int(port)), 1.0)


def test_node_0_lost_whole_with_the_manager_is_recovered_bit_identical(
    tmp_path, reference, scenario
):
    out = str(tmp_path)
    with pod_job(out, Faults().node(rank=0, step=12)) as job:
        assert job.wait(180), f"job did not finish: {job.status()}"
    assert job.exit_code == 0, [
        (
            e["event"],
            e.get("strategy"),
            e.get("reason"),
            e.get("rank"),
            e.get("kind"),
            e.get("detail"),
        )
        for e in job.find("decision") + job.find("fault")
    ]
    takeover = job.find("takeover")
    assert len(takeover) == 1 and takeover[0]["lost_node"] == 0 and takeover[0]["term"] == 1
    coordinated = job.find("manager_takeover")
    assert coordinated and coordinated[0]["takeover_s"] <= TAKEOVER_S, coordinated
    recovery = job.find("recovery")
    assert [r["ok"] for r in recovery] == [True] and recovery[0]["strategy"] == "recover"
    assert sorted(recovery[0]["replaced"]) == [0, 1]
    scenario.lost_steps = recovery[0]["lost_steps"]
    assert scenario.lost_steps == 0
    final = results(out)
    assert [r["sha256"] for r in final] == [reference] * 4
    # Node 1's ranks kept their processes; node 0's came back in the recreated pod.
    assert [r["incarnation"] for r in final] == [0, 0, 0, 0]
    assert job.pods.restarts == {0: 1}
    assert all(r["committed"] == STEPS - 1 for r in final)


def test_a_recreated_node_0_stands_by_and_does_not_split_the_brain(tmp_path, reference):
    """After the takeover, node 0's pod comes back with its manager: that one finds node 1's
    active (term 1) and stands by; exactly one manager is active, and the job ends 0."""
    out = str(tmp_path)
    with pod_job(out, None, "--step-time", "0.2") as job:
        first, second = job.config.managers
        wait_for(lambda: job.find("job_start"), 120, "training under way")
        job.pods.kill_node(0)  # node 0 lost whole: its manager, agent and ranks
        wait_for(lambda: job.find("manager_takeover"), 30, "the standby's takeover")

        def roles() -> tuple[Any, Any] | None:
            job.pods.poll()  # supervise: the lost pod is recreated
            if job.pods.restarts.get(0) != 1:
                return None
            a, b = manager_status(job.config, first), manager_status(job.config, second)
            return (a["manager"], b["manager"]) if a and b else None

        node0, node1 = wait_for(roles, 60, "node 0's pod recreated, both managers answering")
        assert node0["role"] == "standby" and node0["node"] == 0, node0
        assert node1["role"] == "active" and node1["term"] == 1 and node1["node"] == 1, node1
        assert job.wait(180)
    assert job.exit_code == 0
    assert len(job.find("takeover")) == 1, "a second takeover: two managers contended"
    assert [r["ok"] for r in job.find("recovery")] == [True]
    assert [r["sha256"] for r in results(out)] == [reference] * 4


@pytest.mark.parametrize("signalled", ["pod", "agent"])
def test_a_planned_stop_of_node_0_hands_the_manager_over_and_is_recovered(
    tmp_path, reference, scenario, signalled
):
    """Node 0's pod deleted (SIGTERM to its manager and agent; or to its agent alone, as a
    start script passes it on while the hook's manager runs detached): the manager hands over
    (the standby takes over with term 1, no silence waited for, node 0 not lost), node 0's
    agent says it is leaving and its successor moves it as any node: 0 lost steps,
    bit-identical."""
    out = str(tmp_path)
    with pod_job(out, None, "--step-time", "0.2") as job:
        wait_for(lambda: job.find("job_start"), 120, "training under way")
        sent = time.time()
        if signalled == "pod":
            job.pods.stop_node(0)
        else:
            job.pods.procs[0].send_signal(signal.SIGTERM)
        assert job.wait(120), f"job did not finish: {job.status()}"
    assert job.exit_code == 0, [(e["strategy"], e["reason"]) for e in job.find("decision")]
    stops = job.find("planned_stop")  # written by the old manager, again by its successor
    assert stops and {s["node_rank"] for s in stops} == {0}, stops
    assert stops[0]["ts"] - sent < 1.0, stops[0]
    (takeover,) = job.find("takeover")
    assert takeover["handover"] and takeover["term"] == 1 and takeover["lost_node"] == 0
    assert "hands over: node 0, which hosts the manager, was asked to stop" in takeover["reason"]
    assert (0, 0) in job.pods.manager_exits, job.pods.manager_exits  # it stood down with 0
    assert job.find("fault") == [], "a planned stop is not a fault"
    recovery = job.find("recovery")
    assert [(r["ok"], r["strategy"]) for r in recovery] == [(True, "recover")], recovery
    assert sorted(recovery[0]["replaced"]) == [0, 1]
    scenario.lost_steps = recovery[0]["lost_steps"]
    assert scenario.lost_steps == 0
    final = results(out)
    assert [r["sha256"] for r in final] == [reference] * 4
    assert all(r["committed"] == STEPS - 1 for r in final)
    assert job.pods.restarts == {0: 1}


def test_a_manager_whose_standby_goes_silent_mid_handover_ends_the_job_as_asked(tmp_path):
    """SIGTERM with a standby answering: the manager hands over (it says so in its status and
    decides nothing more); the standby goes silent before it took over: the manager gives up
    the handover and ends the job as asked, 143."""
    events = EventLog(str(tmp_path / "events.jsonl"))
    server = ManagerServer(job_config(manager_port=0), events=events, bind="127.0.0.1")
    server.set_role("active", 0, True)
    answering = [True]
    server.standbys, server.successor_answering = 1, lambda: answering[0]
    thread = server.start_thread()
    try:
        server.sigterm("SIGTERM")
        mgr = wait_for(lambda: server.status()["manager"].get("handing_over"), 10, "handover")
        assert mgr.startswith("node 0, which hosts the manager, was asked to stop (SIGTERM")
        assert server.model.state.value == "forming" and not server.model.stop_asked
        answering[0] = False  # the standby died before it took over
        thread.join(timeout=15)
        assert not thread.is_alive()
    finally:
        server.stop()
        thread.join(timeout=5)
    assert server.exit_code() == exitcodes.STOPPED
    (end,) = events.recent("job_end")
    assert end["reason"].startswith("asked to stop: node 0, which hosts the manager"), end
    assert "none of the 1 standby manager(s) answers" in end["reason"]


def test_a_planned_stop_of_node_0_without_a_standby_ends_the_job_with_a_final_dump(tmp_path):
    """One manager only: node 0's pod deleted ends the job as asked, after a final dump of
    the last committed step (bit-identical to an uninterrupted run of as many steps), 143."""
    out, dump_dir = str(tmp_path / "run"), str(tmp_path / "dump")
    with pod_job(
        out,
        None,
        "--step-time",
        "0.2",
        standby=False,
        strategies=parse_strategies("recover,dump,exit"),
        dump_dir=dump_dir,
    ) as job:
        assert job.config.managers == (job.config.managers[0],)
        wait_for(lambda: job.find("job_start"), 120, "training under way")
        job.pods.stop_node(0)
        assert job.wait(60), f"job did not end: {job.status()}"
    assert job.exit_code == exitcodes.STOPPED
    (end,) = job.find("job_end")
    assert end["reason"].startswith("asked to stop: node 0, which hosts the manager"), end
    assert "saved by ranks" in end["reason"] and job.find("takeover") == []
    assert job.find("fault") == [] and job.pods.restarts == {}
    manifest = read_manifest(dump_dir)
    (dumped,) = job.find("dump")
    assert manifest.step == dumped["step"]
    expected = reference_sha(str(tmp_path / "reference"), steps=manifest.step + 1)
    for rank in range(4):
        path, _ = locate(dump_dir, rank)
        assert sha256_of(load_npz(path)) == expected


def test_node_0_lost_whole_with_heartbeat_groups(tmp_path):
    """4 nodes x 1 rank in heartbeat groups of 2 (node 1 beats through node 0, node 3 through
    node 2). Node 0 lost whole with the manager: the standby (node 1's pod) takes over; node 3
    beats through node 2 again, under the identity it has at the new manager (the leader names
    it so; the old one would be refused there), and no node but node 0 is declared lost."""
    changes: dict[str, Any] = {"node_nums": 4, "proc_per_node": 1, "group_nodes": 2}
    reference = reference_sha(str(tmp_path / "reference"), **changes)
    out = str(tmp_path / "run")
    with pod_job(out, None, "--step-time", "0.2", **changes) as job:
        second = job.config.managers[1]

        def via() -> dict[int, Any]:
            got = manager_status(job.config, second)
            return {a["node_rank"]: a["beats_via"] for a in got["agents"]} if got else {}

        wait_for(lambda: job.find("job_start"), 120, "training under way")
        job.pods.kill_node(0)  # node 0 lost whole: its manager, agent and ranks
        wait_for(lambda: job.find("manager_takeover"), 30, "the standby's takeover")
        wait_for(lambda: via().get(3) == 2, 30, "node 3's beats through node 2 at the new manager")
        assert job.wait(180)
    assert job.exit_code == 0
    assert [(f["kind"], f["node_rank"]) for f in job.find("fault")] == [("node_lost", 0)]
    assert [r["sha256"] for r in results(out)] == [reference] * 4
