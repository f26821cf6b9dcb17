"""The fault matrix (issue 9): every fault kind, faults together and in each recovery phase,
a killed agent, planned stops (SIGTERM to one agent, to every agent), on the numpy trainer
(2 nodes x 2 ranks, 30 steps). Faults that are not crashes (an early exit 0, of one rank and of a
whole node) and cascades: 3 faults of distinct ranks in one incident of 2 x 2 and 5 in one of
3 x 2, survived with the default ``max_tries=2`` (a new fault of another rank widens the round
and uses up no try).

Each test is one scenario (the ``scenario`` fixture, see tests/conftest.py). A scenario
survives when the job ends 0, every recovery it needed succeeded, and the final weights of
every rank are bit-identical to an uninterrupted run's; it adds the committed steps its
recoveries lost (always 0 when it survives). The terminal summary prints the tally. The
manager restart scenarios are in test_manager_restart.py; node 0 lost whole with the manager
(a standby takes over) and a planned stop of node 0 (its manager hands over) in
test_node0_takeover.py, whose pods hold the managers.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from ms_recover import exitcodes
from ms_recover.localrun.dutycycle import DutyCycle, pod_rank_pids
from ms_recover.localrun.faults import Faults
from ms_recover.localrun.job import LocalJob
from ms_recover.localrun.wait import wait_for
from ms_recover.worker.dump import load_npz, locate, read_manifest
from ms_recover.worker.repair import sha256_of

from .jobs import STEPS, reference_sha, results, run_to_end, shared_reference_sha, trainer_job

pytestmark = pytest.mark.timeout(120)

RIP = "recover-in-place,recover,exit"
KILL = Faults().kill(rank=1, step=10)  # the first fault of the "during recovery" scenarios

#: name -> (faults, strategy, the strategy of the last recovery, JobConfig changes)
MATRIX: dict[str, tuple[Faults, str, str, dict[str, Any]]] = {
    "kill": (KILL, RIP, "recover-in-place", {}),
    "node-loss": (Faults().node(rank=2, step=12), "recover,exit", "recover", {}),
    # SIGSTOP: its agent sees the process stopped and says so after frozen_s (1 s); neither
    # rank_silence_s nor the hang timeout is what finds it.
    "hang": (
        Faults().hang(rank=3, step=8),
        RIP,
        "recover-in-place",
        {"hang_timeout_s": 60.0, "rank_silence_s": 60.0},
    ),
    # Stuck in its own compute, heartbeat alive: named by the adaptive hang rule (its steps
    # are timed by then) and the only rank replaced (see test_fault).
    "compute-hang": (Faults().add("computehang", rank=2, step=27), RIP, "recover-in-place", {}),
    "transient": (Faults().transient(rank=2, step=8), "retry,recover-in-place,exit", "retry", {}),
    "memory": (Faults().add("memory", rank=1, step=6), "retry,exit", "retry", {}),
    "allreduce": (Faults().in_allreduce(rank=3, step=7), RIP, "recover-in-place", {}),
    "two-nodes-at-once": (KILL.kill(rank=2, step=10), RIP, "recover-in-place", {}),
    "during-stop": (KILL.add("stopdie", rank=2), RIP, "recover-in-place", {}),
    "during-replace (replacement killed again)": (
        KILL.add("boot", rank=1, inc=1),
        RIP,
        "recover-in-place",
        {},
    ),
    "during-rebuild": (KILL.add("rebuilddie", rank=3), RIP, "recover-in-place", {}),
    "during-repair (repair source killed)": (
        KILL.add("repairdie", rank=0),
        RIP,
        "recover-in-place",
        {},
    ),
    "during-resume": (KILL.add("resumedie", rank=2), RIP, "recover-in-place", {}),
    "early-exit-0": (Faults().leave(rank=1, step=10), RIP, "recover-in-place", {}),
    "early-exit-0 (every rank of a node)": (
        Faults().leave(rank=2, step=10).leave(rank=3, step=10),
        RIP,
        "recover-in-place",
        {},
    ),
    "3 distinct faults in one incident (killed, at the stop, at the rebuild)": (
        KILL.add("stopdie", rank=2).add("rebuilddie", rank=3),
        RIP,
        "recover-in-place",
        {},
    ),
}
#: One incident of a 3 x 2 job: rank 1 killed, then rank 2 dies at the stop, rank 3 at the
#: rebuild, rank 5 while it sends its state as a repair source, rank 4 at the resume.
FIVE = KILL.add("stopdie", rank=2).add("rebuilddie", rank=3).add("repairdie", rank=5)
FIVE = FIVE.add("resumedie", rank=4)


@pytest.fixture(scope="session")  # shared: the scenarios spread over xdist workers
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    return shared_reference_sha(tmp_path_factory)


@pytest.fixture(scope="session")  # shared: the scenarios spread over xdist workers
def reference_3x2(tmp_path_factory: pytest.TempPathFactory) -> str:
    return shared_reference_sha(tmp_path_factory, node_nums=3)


def assert_survived(
    job: LocalJob, out: str, reference: str, scenario: Any, world: int = 4, steps: int = STEPS
) -> list[dict]:
    """The job ended 0 with every rank bit-identical to the reference, no committed step lost."""
    decisions = [(e["strategy"], e["reason"]) for e in job.find("decision")]
    assert job.exit_code == 0, (decisions, [f["detail"] for f in job.find("fault")])
    recoveries = job.find("recovery")
    assert recoveries and all(r["ok"] for r in recoveries), recoveries
    scenario.lost_steps = sum(r["lost_steps"] for r in recoveries)
    assert scenario.lost_steps == 0
    final = results(out, world)
    assert [r["sha256"] for r in final] == [reference] * world
    assert all(r["committed"] == steps - 1 for r in final)
    return recoveries


def assert_early_exits_are_faults(job: LocalJob, ranks: set[int]) -> None:
    """Each of ``ranks`` exited 0 once, and that exit became a rank_exit fault within 1 s."""
    for rank in ranks:
        (exited,) = job.find("rank_exit", rank=rank, exit_code=0, expected=False)
        (fault,) = [f for f in job.find("fault", rank=rank) if "exit code 0" in f["detail"]]
        assert fault["kind"] == "rank_exit", fault
        assert fault["ts"] - exited["ts"] <= 1.0, (exited, fault)


def assert_one_incident(job: LocalJob, faults: Faults, recoveries: list[dict]) -> None:
    """Every faulty rank was noticed and replaced in one recovery that used up one try: the
    rounds after the first were widened."""
    victims = {s.rank for s in faults.specs}
    assert victims <= {f["rank"] for f in job.find("fault")}, "a fault went unnoticed"
    (rec,) = recoveries
    assert victims <= set(rec["replaced"]), rec
    first, *later = [e["reason"] for e in job.find("decision")]
    assert later and all("widened, no try used" in d for d in later), (first, later)


@pytest.mark.parametrize("name", list(MATRIX))
def test_fault(name: str, tmp_path, reference: str, scenario) -> None:
    faults, strategy, last, changes = MATRIX[name]
    out = str(tmp_path)
    with trainer_job(out, faults, strategy, **changes) as job:
        run_to_end(job)
    recoveries = assert_survived(job, out, reference, scenario)
    assert recoveries[-1]["strategy"] == last
    if name == "compute-hang":
        (fault,) = job.find("fault")
        assert (fault["kind"], fault["rank"], recoveries[0]["replaced"]) == ("hang", 2, [2])
        assert fault["detect_s"] < 10.0, fault  # the adaptive limit, not hang_timeout_s (30 s)
    if name == "hang":  # stopped, seen by its agent (docs/design.md §1e)
        (fault,) = job.find("fault")
        assert (fault["kind"], fault["rank"], recoveries[0]["replaced"]) == ("hang", 3, [3])
        assert "stopped by a signal" in fault["detail"], fault
        assert fault["detect_s"] >= 1.0, fault  # frozen_s: two heartbeats
    kinds = {s.kind for s in faults.specs}
    if kinds & {"stopdie", "rebuilddie", "resumedie", "boot", "repairdie"} or len(kinds) > 1:
        victims = {s.rank for s in faults.specs}
        assert victims <= {f["rank"] for f in job.find("fault")}, "a fault went unnoticed"
    if kinds == {"leave"}:  # exit code 0, and still a fault: recovered like a crash
        assert_early_exits_are_faults(job, {s.rank for s in faults.specs})
    if name.startswith("3 distinct"):
        assert_one_incident(job, faults, recoveries)


#: Scenarios run again with node 1 heard through node 0's agent (heartbeat groups of 2 nodes,
#: docs/design.md §1c), so node 1's STOP goes through node 0's agent and its STOPPED come back
#: that way; a slower step, so the group is in place before the fault, and a slower heartbeat
#: (as in test_heartbeat_groups: a member falls back to the manager when its leader's answer
#: takes half an agent beat, which a loaded host can take).
GROUPED = ("kill", "during-stop", "two-nodes-at-once")


@pytest.mark.parametrize("name", GROUPED)
def test_fault_in_heartbeat_groups(name: str, tmp_path, reference: str, scenario) -> None:
    faults, strategy, last, changes = MATRIX[name]
    out = str(tmp_path)
    slower = {"group_nodes": 2, "heartbeat_s": 1.0, "extra": ("--step-time", "0.25")}
    with trainer_job(out, faults, strategy, **slower, **changes) as job:
        run_to_end(job)
        relay = job.server.relay
    recoveries = assert_survived(job, out, reference, scenario)
    assert recoveries[-1]["strategy"] == last
    assert relay.group_stops >= 1 and relay.group_stopped >= 1, "no STOP through the leader"


def test_five_distinct_faults_in_one_incident_of_3x2(
    tmp_path, reference_3x2: str, scenario
) -> None:
    """Five ranks of six fail in one incident, each in another phase of its recovery; with
    ``max_tries=2`` the job survives, bit-identical, in one recovery."""
    out = str(tmp_path)
    with trainer_job(out, FIVE, RIP, node_nums=3) as job:
        run_to_end(job, timeout_s=150.0)
    recoveries = assert_survived(job, out, reference_3x2, scenario, world=6)
    assert_one_incident(job, FIVE, recoveries)


def test_killed_agent(tmp_path, reference: str, scenario) -> None:
    """SIGKILL one agent: its ranks die with it, its pod is recreated, the node recovers."""
    out = str(tmp_path)
    # Ranks' steps reach the status once per rank_report_s (2.5 s here): 0.2 s steps keep
    # the job running over a few reports, also on a loaded host.
    with trainer_job(out, extra=("--step-time", "0.2")) as job:
        wait_for(
            lambda: (
                job.status()["state"] == "running"
                and min(r["step"] for r in job.status()["ranks"]) >= 3
            ),
            60,
            "training under way",
        )
        os.kill(job.pods.procs[1].pid, signal.SIGKILL)
        run_to_end(job)
    recoveries = assert_survived(job, out, reference, scenario)
    assert sorted(recoveries[-1]["replaced"]) == [2, 3]
    assert job.pods.restarts == {1: 1}


def _training(job: LocalJob, step: int = 3) -> None:
    wait_for(
        lambda: (
            job.status()["state"] == "running"
            and min(r["step"] for r in job.status()["ranks"]) >= step
        ),
        60,
        "training under way",
    )


def test_planned_stop_of_one_node(tmp_path, reference: str, scenario) -> None:
    """SIGTERM to one agent (a pod deletion, a node drain): the agent says so at once, the
    manager writes ``planned_stop`` within 1 s, sends the node away to have its pod recreated,
    and repairs the new pod's ranks from replicas. No fault; the node is not declared lost."""
    out = str(tmp_path)
    with trainer_job(out, extra=("--step-time", "0.2")) as job:
        _training(job)
        sent = time.time()
        os.kill(job.pods.procs[1].pid, signal.SIGTERM)
        run_to_end(job)
    recoveries = assert_survived(job, out, reference, scenario)
    (stop,) = job.find("planned_stop")
    assert stop["node_rank"] == 1 and stop["ts"] - sent < 1.0, stop
    assert 20.0 <= stop["grace_s"] <= 25.0  # Kubernetes' 30 s less the agent's margin
    assert recoveries[-1]["strategy"] == "recover" and recoveries[-1]["replaced"] == [2, 3]
    assert job.find("fault") == [], "a planned stop is not a fault"
    assert job.pods.restarts == {1: 1}
    log = (tmp_path / "logs" / "agent_1.log").read_text()
    assert "SIGTERM: node 1 is leaving (pod deletion or drain), deadline in" in log


def test_planned_stop_of_the_whole_job(tmp_path, scenario) -> None:
    """SIGTERM to every agent (the job deleted): the ranks stop, one replica per shard writes
    a final dump of the last committed step (bit-identical to an uninterrupted run's), and
    everything exits 143 with a ``job_end`` saying the job was asked to stop."""
    out, dump_dir = str(tmp_path / "run"), str(tmp_path / "dump")
    with trainer_job(
        out, strategy="recover,dump,exit", dump_dir=dump_dir, extra=("--step-time", "0.2")
    ) as job:
        _training(job)
        for proc in list(job.pods.procs.values()):
            os.kill(proc.pid, signal.SIGTERM)
        run_to_end(job)
    assert job.exit_code == exitcodes.STOPPED == 143
    assert job.pods.exit_codes == {0: 143, 1: 143} and job.pods.restarts == {}
    assert sorted(e["node_rank"] for e in job.find("planned_stop")) == [0, 1]
    (end,) = job.find("job_end")
    assert end["exit_code"] == 143 and end["reason"].startswith("asked to stop"), end
    assert job.find("fault") == []
    # The dump's round is closed by the job's end, as under the dump strategy.
    assert [(r["strategy"], r["ok"]) for r in job.find("recovery")] == [("dump", False)]
    manifest = read_manifest(dump_dir)
    (dumped,) = job.find("dump")
    assert manifest.step == dumped["step"] >= 3
    expected = reference_sha(str(tmp_path / "reference"), steps=manifest.step + 1)
    for rank in range(4):  # every rank's state, from its shard's replica
        path, _ = locate(dump_dir, rank)
        assert sha256_of(load_npz(path)) == expected
    scenario.lost_steps = 0  # the dump holds the last step every rank committed


def test_planned_stop_under_elastic_training(tmp_path, scenario) -> None:
    """Under ``elastic-training`` the others train on without the leaving node (not restarted
    in place on a pod that is going), and the world grows back when its pod returns."""
    out = str(tmp_path)
    steps = 80  # 16 s: the recreated pod (a new interpreter) is back well before the end
    slow = ("--step-time", "0.2")
    with trainer_job(out, strategy="elastic-training,exit", extra=slow, steps=steps) as job:
        _training(job)
        os.kill(job.pods.procs[1].pid, signal.SIGTERM)
        run_to_end(job)
    assert job.exit_code == 0, [(e["strategy"], e["reason"]) for e in job.find("decision")]
    worlds = [e["active"] for e in job.find("world")]
    assert worlds[0] == [0, 1] and worlds[-1] == [0, 1, 2, 3]  # it grows as ranks return
    recoveries = job.find("recovery")
    assert len(recoveries) == len(worlds)
    assert all(r["strategy"] == "elastic-training" and r["ok"] for r in recoveries)
    scenario.lost_steps = sum(r["lost_steps"] for r in recoveries)
    assert scenario.lost_steps == 0
    assert job.pods.restarts == {1: 1} and job.find("fault") == []
    final = results(out)
    assert all(r["committed"] == steps - 1 for r in final)
    assert len({r["sha256"] for r in final}) == 1  # the replicas agree (other sum order)


# ----------------------------------------------------------------------------- sub-health
#: Sub-health scenarios: ~30 ms steps of "device work" in 1 ms sleeps, so that a rank stopped
#: half the time (a duty-cycled SIGSTOP, from outside) takes about twice as long: flagged early
#: and surely (how fast a 1.5x rank is flagged is measured in test_detect_numpy.py). Long
#: enough that a new pod, started on this loaded host, is up before the end.
SLOW_STEPS = 400
SLOW_WORK = ("--step-time", "0.03", "--slices", "30")
SUB_HEALTH = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def reference_slow(tmp_path_factory: pytest.TempPathFactory) -> str:
    return reference_sha(str(tmp_path_factory.mktemp("reference_slow")), steps=SLOW_STEPS)


def slow_pod(job: LocalJob, node: int = 1, rank: int = 2) -> DutyCycle:
    """Rank ``rank`` runs slow while it is a process of ``node``'s first pod: the slowness
    belongs to the pod (a restart in place stays slow, a move to a new pod cures it)."""
    agent = job.pods.procs[node].pid

    def pid() -> int:
        return int(job.status()["ranks"][rank]["pid"])

    return DutyCycle(lambda: pod_rank_pids(agent, pid), stop_s=0.006, period_s=0.012)


def slow_job(out: str, policy: str, **changes: Any) -> LocalJob:
    return trainer_job(
        out,
        strategy="retry,recover-in-place,recover,dump,exit",
        steps=SLOW_STEPS,
        extra=SLOW_WORK,
        sub_healthy=policy,
        dump_dir=os.path.join(out, "dump"),
        **changes,
    )


@SUB_HEALTH
def test_fail_slow_rank_under_ignore(tmp_path, reference_slow: str, scenario) -> None:
    """Flagged and reported only: the job runs on, slow, untouched."""
    out = str(tmp_path)
    with slow_job(out, "ignore") as job, slow_pod(job) as cycle:
        run_to_end(job, 280.0)
    assert cycle.cycles > 0 and job.exit_code == 0
    (flag,) = job.find("flagged")
    assert (flag["rank"], flag["node"], flag["reason"]) == (2, 1, "slow"), flag
    assert [e["action"] for e in job.find("sub_health")] == ["reported"]
    assert job.find("recovery") == [] and job.find("fault") == []
    final = results(out)
    assert [r["sha256"] for r in final] == [reference_slow] * 4
    scenario.lost_steps = 0


@SUB_HEALTH
def test_fail_slow_rank_under_hot_switch(tmp_path, reference_slow: str, scenario) -> None:
    """A new pod for node 1 comes up while training goes on, is swapped in at a step
    boundary and repaired from replicas: 0 steps lost, bit-identical, the old pod retired (not
    recreated), no job-level restart, and the new pod is not slow."""
    out = str(tmp_path)
    with slow_job(out, "hotSwitch") as job, slow_pod(job):
        run_to_end(job, 280.0)
    flag = job.find("flagged")[0]
    assert (flag["rank"], flag["node"], flag["reason"]) == (2, 1, "slow"), flag
    actions = [e["action"] for e in job.find("sub_health", node=1)]
    assert actions == ["switch_requested", "switching"], job.find("sub_health")
    # The new pod starts on this same 2-core host (another node in a cluster): its start-up
    # can starve node 0's ranks enough to flag one of them too (seen: rank 0 at 2.4x). Node 0
    # cannot move; the policy reports that and nothing else happens.
    assert all(e["action"] == "not_movable" for e in job.find("sub_health", node=0))
    recoveries = assert_survived(job, out, reference_slow, scenario, steps=SLOW_STEPS)
    (rec,) = recoveries
    assert rec["strategy"] == "recover" and rec["replaced"] == [2, 3], rec
    assert job.pods.retired_exits == [(1, exitcodes.STOPPED)] and job.pods.restarts == {}


@SUB_HEALTH
def test_fail_slow_rank_under_grace_exit(tmp_path, scenario) -> None:
    """Every rank stops at a step boundary, one replica writes the last committed step
    (bit-identical to an uninterrupted run of as many steps), and the job exits 88."""
    out = str(tmp_path)
    with slow_job(out, "graceExit") as job, slow_pod(job):
        run_to_end(job, 280.0)
    assert job.exit_code == exitcodes.DUMPED, job.find("job_end")
    assert [e["action"] for e in job.find("sub_health")] == ["dump_and_exit"]
    dump_dir = os.path.join(out, "dump")
    manifest = read_manifest(dump_dir)
    (dumped,) = job.find("dump")
    assert manifest.step == dumped["step"] >= 20
    expected = reference_sha(str(tmp_path / "reference"), steps=manifest.step + 1)
    for rank in range(4):
        path, _ = locate(dump_dir, rank)
        assert sha256_of(load_npz(path)) == expected
    scenario.lost_steps = 0  # the dump holds the last step every rank committed


@SUB_HEALTH
def test_fail_slow_rank_under_force_exit(tmp_path) -> None:
    """The job exits at once with 87 (no dump): the scheduler's job-level restart takes over.
    Not a survival: no scenario of the tally."""
    out = str(tmp_path)
    with slow_job(out, "forceExit") as job, slow_pod(job):
        run_to_end(job, 280.0)
    assert job.exit_code == exitcodes.JOB_EXIT
    (flag,) = job.find("flagged")
    (end,) = job.find("job_end")
    assert end["reason"].startswith("rank 2 of node 1 flagged slow: forceExit"), end
    assert end["ts"] - flag["ts"] < 1.0 and job.find("dump") == []


@SUB_HEALTH
def test_repeat_divergence_rank_under_hot_switch(tmp_path, reference_slow: str, scenario) -> None:
    """Rank 3's device corrupts its state twice (silent bit flips): the first divergence is
    repaired in place (retry), the second, soon after, flags it, and hotSwitch moves node 1
    to a new pod: 0 lost steps, bit-identical."""
    out = str(tmp_path)
    flips = Faults().add("bitflip", rank=3, step=20).add("bitflip", rank=3, step=60)
    with trainer_job(
        out,
        flips,
        "retry,recover-in-place,recover,exit",
        steps=SLOW_STEPS,
        extra=("--step-time", "0.03"),
        sub_healthy="hotSwitch",
        digest_every_steps=5,
    ) as job:
        run_to_end(job, 280.0)
    (flag,) = job.find("flagged", reason="diverged")
    assert (flag["rank"], flag["node"]) == (3, 1), flag
    recoveries = assert_survived(job, out, reference_slow, scenario, steps=SLOW_STEPS)
    assert [r["strategy"] for r in recoveries] == ["retry", "retry", "recover"], recoveries
    assert recoveries[-1]["replaced"] == [2, 3]
    actions = [e["action"] for e in job.find("sub_health", node=1)]
    assert actions == ["switch_requested", "switching"], job.find("sub_health")
