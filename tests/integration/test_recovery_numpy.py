"""End-to-end recovery on real processes with the numpy trainer (2 nodes x 2 ranks).

The strongest check of docs/design.md §3: a recovered run ends with weights bit-identical to an
uninterrupted run, and no committed step is lost.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from ms_recover.localrun.faults import Faults
from ms_recover.localrun.wait import wait_for
from ms_recover.worker.dump import load_npz, locate, read_manifest
from ms_recover.worker.repair import sha256_of

from .jobs import STEPS, results, run_to_end, shared_reference_sha, trainer_job

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="session")  # shared: the scenarios spread over xdist workers
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    return shared_reference_sha(tmp_path_factory)


def _assert_recovered(job, out: str, reference: str, strategy: str) -> dict:
    run_to_end(job)
    assert job.exit_code == 0, [
        (e["event"], e.get("reason") or e.get("detail"))
        for e in job.events.recent()
        if e["event"] in ("fault", "decision")
    ]
    final = results(out)
    assert [r["sha256"] for r in final] == [reference] * 4
    assert all(r["committed"] == STEPS - 1 for r in final)
    recoveries = job.find("recovery", ok=True)
    assert recoveries, "no successful recovery event"
    last = recoveries[-1]
    assert last["strategy"] == strategy
    assert last["lost_steps"] == 0
    assert set(last["phases"]) == {"detect", "stop", "replace", "rebuild", "repair", "resume"}
    return last


def test_kill_rank_recover_in_place_is_bit_identical(tmp_path, reference):
    out = str(tmp_path)
    with trainer_job(out, Faults().kill(rank=1, step=10)) as job:
        last = _assert_recovered(job, out, reference, "recover-in-place")
    fault = job.find("fault", kind="rank_exit", rank=1)[0]
    assert "signal 9" in fault["detail"]
    assert last["replaced"] == [1] and last["target_step"] == 10
    assert results(out)[1]["incarnation"] == 1


def test_lost_node_recover_is_bit_identical(tmp_path, reference):
    out = str(tmp_path)
    # The replacement pod takes 4 s to schedule, longer than the 2 s silence that marks a loss.
    with trainer_job(
        out, Faults().node(rank=2, step=12), strategy="recover,exit", reschedule_delay_s=4.0
    ) as job:
        last = _assert_recovered(job, out, reference, "recover")
    assert job.find("fault", kind="node_lost", node_rank=1)
    assert last["replaced"] == [2, 3]
    assert job.pods.restarts.get(1, 0) >= 1 and 0 not in job.pods.restarts


def test_pod_recreated_before_loss_is_noticed(tmp_path, reference):
    out = str(tmp_path)
    # 8 s of silence marks a loss; the supervisor recreates the pod well before that.
    with trainer_job(
        out,
        Faults().node(rank=3, step=12),
        strategy="recover,exit",
        heartbeat_s=2.0,
        phase_timeout_s=30.0,
    ) as job:
        last = _assert_recovered(job, out, reference, "recover")
    assert job.find("fault", kind="node_restarted", node_rank=1)
    assert last["replaced"] == [2, 3]


def test_kill_during_allreduce_is_bit_identical(tmp_path, reference):
    out = str(tmp_path)
    with trainer_job(out, Faults().in_allreduce(rank=3, step=7)) as job:
        _assert_recovered(job, out, reference, "recover-in-place")
    assert job.find("fault", kind="rank_exit", rank=3)


def test_rebuild_replays_subgroups(tmp_path):
    ref_out, out = str(tmp_path / "ref"), str(tmp_path / "run")
    with trainer_job(ref_out, extra=("--subgroup",)) as job:
        run_to_end(job)
    reference = results(ref_out)[0]["sha256"]
    with trainer_job(out, Faults().kill(rank=2, step=9), extra=("--subgroup",)) as job:
        _assert_recovered(job, out, reference, "recover-in-place")
        assert job.status()["groups"] == [["parity0", [0, 2]], ["parity1", [1, 3]]]


def test_corrupt_repair_is_retried_from_another_replica(tmp_path, reference):
    out = str(tmp_path)
    # rank 1 dies; the planner picks rank 0 as its source, whose transfer is corrupted.
    with trainer_job(out, Faults().kill(rank=1, step=10).corrupt(rank=0)) as job:
        _assert_recovered(job, out, reference, "recover-in-place")
    retry = job.find("repair_retry")
    assert retry and retry[0]["bad_sources"] == [0]
    assert "checksum mismatch" in retry[0]["reason"]


def test_fault_during_recovery_starts_new_epoch(tmp_path, reference):
    out = str(tmp_path)
    faults = Faults().kill(rank=1, step=10).add("boot", rank=1, inc=1)
    with trainer_job(out, faults) as job:
        last = _assert_recovered(job, out, reference, "recover-in-place")
    decisions = job.find("decision", strategy="recover-in-place")
    assert len(decisions) == 2
    assert decisions[1]["epoch"] > decisions[0]["epoch"]
    assert last["epoch"] >= 3
    assert results(out)[1]["incarnation"] == 2


def test_repair_source_dying_mid_transfer_recovers(tmp_path, reference):
    out = str(tmp_path)
    faults = Faults().kill(rank=1, step=10).add("repairdie", rank=0)
    with trainer_job(out, faults) as job:
        _assert_recovered(job, out, reference, "recover-in-place")
    assert job.find("fault", kind="rank_exit", rank=0)
    assert sorted(job.find("recovery", ok=True)[-1]["replaced"]) == [0, 1]


def test_transient_comm_error_is_retried_in_process(tmp_path, reference):
    out = str(tmp_path)
    with trainer_job(
        out, Faults().transient(rank=2, step=8), strategy="retry,recover-in-place,exit"
    ) as job:
        last = _assert_recovered(job, out, reference, "retry")
    assert last["replaced"] == [] and last["target_step"] == 7
    assert job.find("fault", kind="worker_error", rank=2)
    assert [r["incarnation"] for r in results(out)] == [0, 0, 0, 0]  # nobody restarted


def test_corrupted_state_is_repaired_under_retry(tmp_path, reference):
    out = str(tmp_path)
    with trainer_job(out, Faults().add("memory", rank=1, step=6), strategy="retry,exit") as job:
        last = _assert_recovered(job, out, reference, "retry")
    assert "device_memory" in job.find("fault", rank=1)[0]["detail"]
    assert last["replaced"] == []
    assert [r["incarnation"] for r in results(out)] == [0, 0, 0, 0]


def test_dump_saves_the_last_committed_state_then_exits(tmp_path):
    ref_out, out, dump_dir = str(tmp_path / "ref"), str(tmp_path / "run"), str(tmp_path / "dump")
    with trainer_job(ref_out, steps=11) as job:  # uninterrupted through step 10
        run_to_end(job)
    with trainer_job(
        out, Faults().kill(rank=1, step=10), strategy="dump,exit", dump_dir=dump_dir
    ) as job:
        run_to_end(job)
    assert job.exit_code == 88 and job.pods.exit_codes == {0: 88, 1: 88}
    manifest = read_manifest(dump_dir)
    assert manifest.step == 10 and manifest.world_size == 4
    assert len(manifest.files) == 1  # one replica per shard; every rank here is shard 0
    for rank in range(4):  # a later job-level restart finds every rank's state
        path, _ = locate(dump_dir, rank)
        assert sha256_of(load_npz(path)) == results(ref_out)[rank]["sha256"]
    assert np.all(np.isfinite(load_npz(locate(dump_dir, 0)[0])["w"]))
    assert job.find("dump")[0]["step"] == 10


def test_elastic_training_shrinks_then_grows_back(tmp_path):
    """4 ranks lose one for good (its pod comes back only after the wait timeout, once the
    world shrank): training goes on with 3 ranks and the same global batch, then grows back
    to 4 when it returns."""
    ref_out, out = str(tmp_path / "ref"), str(tmp_path / "run")
    slow = ("--step-time", "0.05")
    shape = dict(node_nums=4, proc_per_node=1, wait_reschedule_timeout_s=1.5)
    with trainer_job(ref_out, steps=160, extra=slow, **shape) as job:
        run_to_end(job)
    with trainer_job(
        out,
        Faults().node(rank=3, step=20),
        "recover,elastic-training,exit",
        steps=160,
        extra=slow,
        reschedule_delay_s=3600.0,  # held until the world shrank: never after training ended
        **shape,
    ) as job:
        wait_for(lambda: job.pods.poll() or job.find("world"), 60, "the shrink to 3 ranks")
        assert job.pods.reschedule_now() == [3]
        run_to_end(job, timeout_s=120)
    assert job.exit_code == 0
    worlds = [e["active"] for e in job.find("world")]
    assert worlds == [[0, 1, 2], [0, 1, 2, 3]]
    decisions = [e["strategy"] for e in job.find("decision")]
    assert decisions == ["recover", "elastic-training", "elastic-training"]
    ok = job.find("recovery", ok=True)
    assert [r["strategy"] for r in ok] == ["elastic-training", "elastic-training"]
    assert all(r["lost_steps"] == 0 for r in ok)
    ref, run = results(ref_out), results(out)
    # Rank 0 ran every step itself, except perhaps a recovery's target step that it got by
    # repair (interrupted in it while the others committed it).
    skipped = {a for a, b in run[0]["skipped"] if a == b and a in {r["target_step"] for r in ok}}
    assert len(skipped) == len(run[0]["skipped"]), run[0]["skipped"]
    steps = [str(s) for s in range(160) if s not in skipped]
    assert sorted(run[0]["losses"], key=int) == steps and len(ref[0]["losses"]) == 160
    run_loss = np.array([run[0]["losses"][s] for s in steps])
    ref_loss = np.array([ref[0]["losses"][s] for s in steps])
    np.testing.assert_allclose(run_loss, ref_loss, rtol=1e-5)  # same math, other sum order
    assert len({r["sha256"] for r in run}) == 1  # the replicas agree with each other
    weights = [np.load(os.path.join(d, "rank_0.npz"))["w"] for d in (ref_out, out)]
    np.testing.assert_allclose(weights[1], weights[0], rtol=1e-4, atol=1e-6)


def test_a_prewarmed_spare_replaces_the_killed_rank(tmp_path):
    out = str(tmp_path)
    with trainer_job(
        out, Faults().kill(rank=1, step=25), steps=60, extra=("--step-time", "0.02"), spares=1
    ) as job:
        agent = job.pods.procs[0].pid
        children = Path(f"/proc/{agent}/task/{agent}/children")
        warm = wait_for(
            lambda: len(children.read_text().split()) == 3 and children.read_text(),
            20,
            "two ranks and one spare on node 0",
        )
        run_to_end(job)
        assert job.exit_code == 0, job.find("decision")
    rejoined = [e for e in job.find("member") if e.get("rank") == 1 and e.get("reboot")]
    assert len(rejoined) == 1
    assert str(rejoined[0]["pid"]) in warm.split()  # the process that was waiting took over
    assert os.path.exists(os.path.join(out, "logs", "spares.log"))
    with open(os.path.join(out, "rank_1.json")) as fh:
        assert json.load(fh)["committed"] == 59


def test_a_lost_manager_stops_every_node(tmp_path):
    """The manager is a single point of failure: without it nothing can be recovered, so
    every agent kills its ranks after ``phase_timeout_s`` of silence and exits 1 (no
    reschedule), instead of leaving ranks training with no one to recover them."""
    with trainer_job(str(tmp_path), steps=10**6, phase_timeout_s=3.0) as job:
        wait_for(
            lambda: (
                job.status()["state"] == "running"
                and min(r["step"] for r in job.status()["ranks"]) >= 3
            ),
            60,
            "training under way",
        )
        pids = [r["pid"] for r in job.status()["ranks"]]
        job.server.stop()
        assert job.wait(30), "the agents did not stop"
        assert job.pods.exit_codes == {0: 1, 1: 1}
        for pid in pids:
            assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid), f"rank pid {pid} lives"


def _is_zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_two_ranks_of_different_nodes_killed_at_the_same_step(tmp_path, reference):
    """Issue 9 #1: both ranks are covered by one recovery; the manager's own kills of a
    starting replacement are never counted as new faults."""
    out = str(tmp_path)
    with trainer_job(out, Faults().kill(rank=1, step=10).kill(rank=3, step=10)) as job:
        last = _assert_recovered(job, out, reference, "recover-in-place")
    assert sorted(last["replaced"]) == [1, 3] and last["target_step"] == 10
    assert {f["rank"] for f in job.find("fault")} == {1, 3}
    unexpected = [(e["rank"], e["pid"]) for e in job.find("rank_exit", expected=False)]
    assert sorted(r for r, _ in unexpected) == [1, 3], unexpected  # the two injected kills
    assert [r["incarnation"] for r in results(out)] == [0, 1, 0, 1]


def test_second_rank_killed_while_the_first_replacement_starts(tmp_path, reference):
    """Issue 9 #1: rank 2 (node 1) dies after rank 1 (node 0) died and before rank 1's
    replacement registered; the new epoch covers both and the replacement is not killed."""
    out = str(tmp_path)
    with trainer_job(out, Faults().kill(rank=1, step=10)) as job:
        wait_for(lambda: job.find("decision"), 30, "the first decision")
        victim = job.status()["ranks"][2]["pid"]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: job.find("fault", rank=2), 10, "the second fault")
        last = _assert_recovered(job, out, reference, "recover-in-place")
    reboots = [e for e in job.find("member") if e.get("reboot")]
    second = job.find("fault", rank=2)[0]
    assert min(e["ts"] for e in reboots if e["rank"] == 1) > second["ts"], "too late a kill"
    assert sorted(last["replaced"]) == [1, 2] and last["target_step"] == 10
    assert {f["rank"] for f in job.find("fault")} == {1, 2}
    assert [r["incarnation"] for r in results(out)] == [0, 1, 1, 0]
