"""The sub-health policies (MindCluster's ``subHealthyStrategy``) on a flagged node, the hot
switch's swap and its timeout, and the flag of a replica that diverges again: pure, with the
fake clock of tests/unit/test_decide.py."""

from __future__ import annotations

import io
from typing import Any

import pytest

from ms_recover import exitcodes
from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError
from ms_recover.manager.divergence import on_digest
from ms_recover.manager.status import status_of
from ms_recover.observability.metrics import ManagerCollector
from ms_recover.observability.report import print_summary
from ms_recover.observability.schema import FaultKind, JobState, decode
from ms_recover.observability.status import render
from ms_recover.observability.timeline import describe
from ms_recover.protocol import messages as M
from ms_recover.subhealth import SubHealthy, parse_sub_healthy
from tests.unit.test_decide import Job
from tests.unit.test_detection import MS, report
from tests.unit.test_metrics import _samples

RANKS_OF_NODE_1 = [2, 3]


def job_with(policy: str, **changes: Any) -> Job:
    changes = {"hang_timeout_s": 30.0, **changes}
    j = Job("recover-in-place,recover,exit", sub_healthy=policy, **changes)
    j.running(step=100)
    return j


def slow_rank(job: Job, rank: int) -> None:
    """Two reports in a row with ``rank`` at 1.5x its peers' compute: flagged."""
    for _ in range(2):
        for r in range(4):
            report(job, r, 0.01, compute=(45 * MS, 44 * MS) if r == rank else (30 * MS, 29 * MS))
        job.tick()


def test_the_policy_names_are_mindclusters_and_a_bad_one_is_refused() -> None:
    assert [p.value for p in SubHealthy] == ["ignore", "graceExit", "forceExit", "hotSwitch"]
    assert parse_sub_healthy("") is SubHealthy.IGNORE
    env = {"MS_RECOVER_SUB_HEALTHY_STRATEGY": "hotSwitch"}
    assert JobConfig.from_env(env).sub_healthy is SubHealthy.HOT_SWITCH
    with pytest.raises(ConfigError) as err:
        JobConfig.from_env({"MS_RECOVER_SUB_HEALTHY_STRATEGY": "hotswitch"})
    msg = str(err.value)
    assert "\n" not in msg
    assert "'hotswitch' is not one of: ignore, graceExit, forceExit, hotSwitch" in msg


def test_ignore_reports_only() -> None:
    j = job_with("ignore")
    slow_rank(j, 2)
    (flag,) = j.events("flagged")
    (note,) = j.events("sub_health")
    assert (note["policy"], note["node"], note["action"]) == ("ignore", 1, "reported")
    assert j.model.state is JobState.RUNNING and not j.events("fault") and not j.sent
    assert "sub-health policy (subHealthyStrategy): ignore" in render(status_of(j.model, j.now))


def test_force_exit_exits_at_once() -> None:
    j = job_with("forceExit")
    slow_rank(j, 2)
    (note,) = j.events("sub_health")
    assert note["action"] == "exit"
    assert j.model.state is JobState.EXITING and j.model.exit_code == exitcodes.JOB_EXIT
    assert j.events("job_end")[-1]["reason"].startswith("rank 2 of node 1 flagged slow")


def test_grace_exit_stops_everyone_and_dumps(tmp_path: Any) -> None:
    j = job_with("graceExit", dump_dir=str(tmp_path))
    slow_rank(j, 2)
    (note,) = j.events("sub_health")
    assert note["action"] == "dump_and_exit"
    assert j.model.state is JobState.STOPPING
    assert j.decision()["strategy"] == "dump"
    stops = [dest for dest, msg in j.sent if isinstance(msg, M.Stop)]
    assert stops == ["r0", "r1", "r2", "r3"]  # a slow node's state is sound: it may write


def swap_ready(j: Job) -> None:
    """The new pod of node 1 said hello and all its ranks wait (what the server records)."""
    j.model.backups[1] = j.now


def test_hot_switch_asks_for_a_pod_trains_on_then_swaps_at_a_step_boundary() -> None:
    j = job_with("hotSwitch")
    slow_rank(j, 2)
    (note,) = j.events("sub_health")
    assert (note["action"], note["ranks"]) == ("switch_requested", RANKS_OF_NODE_1)
    assert j.model.state is JobState.RUNNING and j.model.switching == {1: pytest.approx(j.now)}
    status = status_of(j.model, j.now)
    assert "hot switch: node 1 waiting for its new pod" in render(status)
    j.advance(2.0)
    j.tick()
    assert j.model.state is JobState.RUNNING  # training goes on while the pod comes
    swap_ready(j)
    j.tick()
    assert j.model.state is JobState.STOPPING and not j.model.switching
    switching = j.events("sub_health")[-1]
    assert switching["action"] == "switching" and switching["waited_s"] == pytest.approx(2.0)
    (fault,) = j.events("fault")
    assert (fault["kind"], fault["node_rank"]) == (FaultKind.SUB_HEALTHY.value, 1)
    assert j.decision()["strategy"] == "recover" and j.decision()["replace"] == RANKS_OF_NODE_1
    sent = [(dest, type(msg).__name__, getattr(msg, "code", None)) for dest, msg in j.sent]
    assert ("r0", "Stop", None) in sent and ("r1", "Stop", None) in sent
    assert ("a1", "AgentExit", exitcodes.STOPPED) in sent  # retired, not rescheduled
    assert not any(dest in ("r2", "r3") for dest, _, _ in sent)
    assert not j.model.ranks[2].alive and not j.model.agents[1].alive  # their slots are free


def test_hot_switch_without_a_new_pod_is_abandoned_and_training_goes_on() -> None:
    j = job_with("hotSwitch", hot_switch_timeout_s=5.0)
    slow_rank(j, 2)
    j.advance(4.0)
    j.tick()
    assert j.model.switching
    j.advance(1.5)
    j.tick()
    note = j.events("sub_health")[-1]
    assert note["action"] == "switch_timed_out" and "no job-level restart" in note["reason"]
    assert j.model.state is JobState.RUNNING and not j.model.switching and not j.sent
    swap_ready(j)  # a pod that comes too late is not swapped in
    slow_rank(j, 3)  # nor is the node acted on again
    j.tick()
    assert j.model.state is JobState.RUNNING and len(j.events("sub_health")) == 2


def test_a_hang_of_a_switching_nodes_rank_waits_for_the_swap() -> None:
    """The flagged rank stalls (the demo's slow rank is stopped a third of the time): a hang
    blamed on it is held while its node's hot switch may still come, and the swap, not an
    in-place restart on the slow node, replaces it. Once the switch gave up, it is a hang."""
    j = job_with("hotSwitch", hang_timeout_s=3.0, hot_switch_timeout_s=10.0)
    slow_rank(j, 2)
    j.commit(101, ranks=[0, 1, 3])  # rank 2 stalls at step 100
    j.advance(4.0)  # past the fixed hang bound
    j.tick()
    assert not j.events("fault") and j.model.state is JobState.RUNNING and j.model.switching
    swap_ready(j)
    j.tick()
    (fault,) = j.events("fault")
    assert fault["kind"] == FaultKind.SUB_HEALTHY.value and j.decision()["strategy"] == "recover"


def test_a_hang_is_declared_once_the_hot_switch_gave_up() -> None:
    j = job_with("hotSwitch", hang_timeout_s=3.0, hot_switch_timeout_s=5.0)
    slow_rank(j, 2)
    j.commit(101, ranks=[0, 1, 3])
    j.advance(4.0)
    j.tick()
    assert not j.events("fault")
    j.advance(1.5)  # the switch may come within 5 s: past that, the hang is one again
    j.tick()
    (fault,) = j.events("fault")
    assert (fault["kind"], fault["rank"]) == ("hang", 2)


def test_a_hang_of_another_nodes_rank_is_not_held() -> None:
    j = job_with("hotSwitch", hang_timeout_s=3.0, hot_switch_timeout_s=10.0)
    slow_rank(j, 2)
    j.commit(101, ranks=[1, 2, 3])  # rank 0, on node 0, stalls
    j.advance(4.0)
    j.tick()
    (fault,) = j.events("fault")
    assert (fault["kind"], fault["rank"]) == ("hang", 0)


def test_the_scheduler_node_cannot_hot_switch() -> None:
    j = job_with("hotSwitch")
    slow_rank(j, 1)
    (note,) = j.events("sub_health")
    assert note["action"] == "not_movable" and not j.model.switching


def test_a_replica_that_diverges_again_within_the_window_is_flagged() -> None:
    j = job_with("ignore", diverge_window_s=60.0, digest_every_steps=10)

    def digests(step: int, bad: str) -> None:
        for r in range(4):
            on_digest(j.model, r, step, bad if r == 3 else "good", j.now)

    digests(100, "bad1")
    assert [f.kind for f in j.model.pending] == [FaultKind.DIVERGED]
    j.model.pending.clear()  # repaired (the retry round, not under test here)
    report(j, 0, 0.01)
    j.tick()
    assert not j.events("flagged")  # once is a repair, not a flag
    j.advance(30.0)
    digests(110, "bad2")
    j.model.pending.clear()
    report(j, 0, 0.01)
    j.tick()
    (flag,) = j.events("flagged")
    assert (flag["rank"], flag["node"], flag["reason"], flag["score"]) == (3, 1, "diverged", 2.0)
    assert "2 times within 60s" in flag["detail"]


def test_divergences_further_apart_than_the_window_flag_nothing() -> None:
    j = job_with("ignore", diverge_window_s=10.0, digest_every_steps=10)
    for step, bad in ((100, "b1"), (110, "b2")):
        for r in range(4):
            on_digest(j.model, r, step, bad if r == 3 else "good", j.now)
        j.model.pending.clear()
        j.advance(11.0)
        report(j, 0, 0.01)
        j.tick()
    assert not j.events("flagged")


def test_every_detection_is_a_metric_a_status_line_and_a_report_line() -> None:
    j = job_with("hotSwitch")
    log = j.executor.events
    collector = ManagerCollector(lambda: status_of(j.model, j.now), log)
    before = _samples(collector)
    assert before[("ms_recover_flags_total", (("reason", "slow"),))] == 0
    assert before[("ms_recover_hot_switches_waiting", ())] == 0
    slow_rank(j, 2)
    after = _samples(collector)
    assert after[("ms_recover_flags_total", (("reason", "slow"),))] == 1
    assert after[("ms_recover_ranks_flagged", ())] == 1
    key = (("action", "switch_requested"), ("policy", "hotSwitch"))
    assert after[("ms_recover_sub_health_actions_total", key)] == 1
    assert after[("ms_recover_hot_switches_waiting", ())] == 1
    out = io.StringIO()
    print_summary([decode(e) for e in log.recent()], out)
    text = out.getvalue()
    assert "flagged: rank 2 (node 1) at step 100, slow: compute time per step 45.0ms" in text
    assert "sub-health hotSwitch: node 1 switch_requested: rank 2 of node 1 flagged slow" in text


def test_the_demo_timeline_shows_the_flag_and_the_policy() -> None:
    j = job_with("hotSwitch")
    slow_rank(j, 2)
    lines = [describe(decode(e)) for e in j.executor.events.recent()]
    assert any(
        line.startswith("FLAGGED  rank 2 (node 1) at step 100: compute time") for line in lines
    )
    assert "SUBHEALTH hotSwitch: rank 2 of node 1 flagged slow: hotSwitch, a new pod" in "\n".join(
        lines
    )
