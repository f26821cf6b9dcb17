"""Real MindSpore jobs (2 nodes x 2 ranks) that survive SIGKILL with bit-identical weights.

These run `ms_recover.mindspore.programs.demo_train`, the demo's training program, as real
processes: MindSpore computes forward, backward and Adam; ms_recover's host backend averages
gradients.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from ms_recover import env as E
from ms_recover.config import JobConfig
from ms_recover.localrun.faults import Faults
from ms_recover.localrun.job import LocalJob
from ms_recover.localrun.wait import wait_for
from ms_recover.strategy import parse_strategies

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
STEPS = 24


def _job(
    out: str,
    faults: Faults | None,
    strategy: str,
    delay: float = 0.0,
    spares: int = 0,
    extra: tuple[str, ...] = (),
    standby: str = "off",
) -> LocalJob:
    config = JobConfig(
        job_id="e2e",
        node_nums=2,
        proc_per_node=2,
        strategies=parse_strategies(strategy),
        wait_reschedule_timeout_s=60.0,
    )
    command = [
        sys.executable,
        "-m",
        "ms_recover.mindspore.programs.demo_train",
        "--steps",
        str(STEPS),
        "--out",
        out,
        *extra,
    ]
    return LocalJob(
        config,
        command,
        {**(faults.to_env() if faults else {}), E.STANDBY: standby},
        log_dir=os.path.join(out, "logs"),
        reschedule_delay_s=delay,
        spares=spares,
    )


def _shas(out: str) -> list[str]:
    shas = []
    for rank in range(4):
        with open(os.path.join(out, f"rank_{rank}.json")) as fh:
            record = json.load(fh)
        assert record["committed"] == STEPS - 1
        shas.append(record["sha256"])
    return shas


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("ms-reference"))
    with _job(out, None, "recover-in-place,exit") as job:
        assert job.wait(240), job.status()
    shas = set(_shas(out))
    assert len(shas) == 1
    return shas.pop()


def _check(job: LocalJob, out: str, reference: str, strategy: str) -> dict:
    assert job.wait(240), job.status()
    assert job.exit_code == 0
    assert _shas(out) == [reference] * 4
    recovery = job.find("recovery", ok=True)[-1]
    assert recovery["strategy"] == strategy and recovery["lost_steps"] == 0
    return recovery


def test_recover_in_place_after_kill_9_is_bit_identical(tmp_path, reference):
    out = str(tmp_path)
    with _job(out, Faults().kill(rank=1, step=9), "recover-in-place,exit") as job:
        recovery = _check(job, out, reference, "recover-in-place")
    assert recovery["replaced"] == [1] and recovery["target_step"] == 9


def test_the_standby_runs_the_restarted_rank_bit_identically(tmp_path, reference):
    """ms-recover agent's default standby (MindSpore imported ahead, started once the ranks
    train) takes the killed rank: the run ends with the reference's bits."""
    out = str(tmp_path)
    fault = Faults().kill(rank=1, step=18)  # ~9 s in: the standby has started by then
    extra = ("--step-time", "0.5")
    with _job(out, fault, "recover-in-place,exit", extra=extra, standby="on") as job:
        recovery = _check(job, out, reference, "recover-in-place")
    assert recovery["replaced"] == [1] and recovery["target_step"] == 18
    with open(os.path.join(out, "logs", "rank_1.log")) as fh:
        assert "ms_recover: standby" in fh.read()


def test_a_prewarmed_spare_takes_over_bit_identically(tmp_path, reference):
    out = str(tmp_path)
    with _job(out, Faults().kill(rank=2, step=9), "recover-in-place,exit", spares=1) as job:
        recovery = _check(job, out, reference, "recover-in-place")
    assert recovery["replaced"] == [2]
    assert os.path.exists(os.path.join(out, "logs", "spares.log"))


def test_recover_after_losing_a_node_is_bit_identical(tmp_path, reference):
    out = str(tmp_path)
    with _job(out, Faults().node(rank=2, step=11), "recover,exit", delay=3.0) as job:
        recovery = _check(job, out, reference, "recover")
    assert recovery["replaced"] == [2, 3]
    assert job.find("fault", kind="node_lost", node_rank=1)


def test_retry_after_a_transient_comm_error_is_bit_identical(tmp_path, reference):
    """The failed step's gradients were computed but never applied (the reduce runs outside
    MindSpore's grad function), so the same process redoes the step after the rebuild."""
    out = str(tmp_path)
    with _job(out, Faults().transient(rank=2, step=7), "retry,recover-in-place,exit") as job:
        recovery = _check(job, out, reference, "retry")
    assert recovery["replaced"] == []
    incarnations = []
    for rank in range(4):
        with open(os.path.join(out, f"rank_{rank}.json")) as fh:
            incarnations.append(json.load(fh)["incarnation"])
    assert incarnations == [0, 0, 0, 0]


def test_graph_step_gives_the_same_bits_and_retries_a_failed_in_graph_allreduce(
    tmp_path, reference
):
    """GraphStep (one compiled graph, the host allreduce an op inside it) ends with the bits of
    the DataParallelStep reference; the transient error fails the op before the optimizer ran,
    so the same processes redo the step after the rebuild."""
    out = str(tmp_path)
    faults = Faults().transient(rank=2, step=7)
    with _job(out, faults, "retry,recover-in-place,exit", extra=("--graph-step",)) as job:
        recovery = _check(job, out, reference, "retry")
    assert recovery["replaced"] == []


def test_dump_writes_mindspore_checkpoints_a_restart_can_load(tmp_path):
    """Under `dump,exit` a lost rank ends the job with one MindSpore checkpoint per shard; a
    job-level restart loads exactly the state the survivors had at the last committed step."""
    import mindspore

    from ms_recover.mindspore.checkpoint import load_dump
    from ms_recover.mindspore.programs.demo_train import build
    from ms_recover.mindspore.state import MindSporeState
    from ms_recover.worker.repair import sha256_of

    ref_out, out, dump_dir = str(tmp_path / "ref"), str(tmp_path / "run"), str(tmp_path / "dump")
    config = JobConfig(job_id="e2e-ref", node_nums=2, proc_per_node=2)
    command = [
        sys.executable,
        "-m",
        "ms_recover.mindspore.programs.demo_train",
        "--steps",
        "10",
        "--out",
    ]
    with LocalJob(config, command + [ref_out], {}, log_dir=ref_out) as job:  # steps 0..9
        assert job.wait(240)
    faulty = config.replace(
        job_id="e2e-dump",
        strategies=parse_strategies("dump,exit"),
        dump_dir=dump_dir,
        events_path=str(tmp_path / "events.jsonl"),
        # Twice in a few dozen loaded suite runs this job ended 87 at start-up: a fault before
        # any step committed (then "dump step -1"); node 1's agent was never told to exit, as
        # if it had been declared lost. Silence is not what this test is about: 10 s of it.
        liveness=20,
    )
    with LocalJob(
        faulty,
        command + [out, "--steps", "30"],
        Faults().kill(rank=3, step=9).to_env(),
        log_dir=out,
    ) as job:
        assert job.wait(240)
    assert job.exit_code == 88, job.find("fault") + job.find("job_end")
    assert job.find("dump")[0]["step"] == 9
    mindspore.set_context(mode=mindspore.PYNATIVE_MODE, device_target="CPU")
    net, _, optimizer = build()
    state = MindSporeState(net, optimizer)
    assert load_dump(dump_dir, state, rank=3) == 9
    with open(os.path.join(ref_out, "rank_3.json")) as fh:
        assert sha256_of(state.state_dict()) == json.load(fh)["sha256"]


def test_elastic_training_on_mindspore_shrinks_and_grows_back(tmp_path):
    """A pod that is not back within wait-reschedule-timeout: MindSpore training goes on
    with 3 ranks and the same global batch, then grows back to 4 when the pod returns.

    The pod is held until the shrink, then released: a fixed reschedule delay let it come
    back after training ended under heavy load (MindSpore's import slows, the step's sleep
    does not), and there was nothing left to grow into."""
    steps = 200
    ref_out, out = str(tmp_path / "ref"), str(tmp_path / "run")
    base = JobConfig(
        job_id="e2e-el",
        node_nums=4,
        proc_per_node=1,
        wait_reschedule_timeout_s=1.5,
        strategies=parse_strategies("recover,elastic-training,exit"),
    )
    command = [
        sys.executable,
        "-m",
        "ms_recover.mindspore.programs.demo_train",
        "--steps",
        str(steps),
        "--step-time",
        "0.05",
        "--out",
    ]
    with LocalJob(
        base.replace(job_id="e2e-el-ref"), command + [ref_out], {}, log_dir=ref_out
    ) as job:
        assert job.wait(240)
    with LocalJob(
        base,
        command + [out],
        Faults().node(rank=3, step=15).to_env(),
        log_dir=out,
        reschedule_delay_s=3600.0,  # held: released once the world shrank
    ) as job:
        wait_for(lambda: job.pods.poll() or job.find("world"), 120, "the shrink to 3 ranks")
        assert job.pods.reschedule_now() == [3]
        assert job.wait(240), job.status()
    assert job.exit_code == 0
    assert [e["active"] for e in job.find("world")] == [[0, 1, 2], [0, 1, 2, 3]]
    runs = []
    for d in (ref_out, out):
        with open(os.path.join(d, "rank_0.json")) as fh:
            runs.append(json.load(fh))
    # Rank 0 may have received a recovery's target step by repair (interrupted in it while the
    # others committed it: at the shrink, step 15, or at the grow-back), but it ran every other
    # step itself, so steps 0..14 are its own.
    targets = {e["target_step"] for e in job.find("recovery", ok=True)}
    assert all(a == b and a in targets for a, b in runs[1]["skipped"]), (runs[1], targets)
    runs = [run["losses"] for run in runs]
    assert [runs[1][str(s)] for s in range(15)] == [runs[0][str(s)] for s in range(15)]
    last = str(steps - 1)
    assert abs(runs[1][last] - runs[0][last]) <= 1e-4 * abs(runs[0][last]) + 1e-6
