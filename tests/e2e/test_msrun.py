"""Real msrun as the launcher: two msrun "nodes" on loopback, two workers each, the taskd shim.

Node N runs with ``POD_IP=127.0.0.(N+1)`` so that only node 0 matches ``MS_SCHED_HOST``. The
workers run the numpy trainer on the host backend (msrun, not MindSpore's math, is the point);
the reference is the same training under ``ms-recover agent``. Nothing here waits out one of
msrun's own timeouts: every wait is on a condition with a deadline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ms_recover.config import JobConfig
from ms_recover.integrations import shims
from ms_recover.localrun.faults import Faults
from ms_recover.localrun.msrunjob import MsrunJob, MsrunManagerPodJob, MsrunPods, free_port
from ms_recover.localrun.wait import wait_for
from ms_recover.strategy import parse_strategies

from ..integration.jobs import STEPS, results, run_to_end, running_with, trainer_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]
TRAINER = [sys.executable, "-m", "ms_recover.localrun.numpy_trainer", "--steps", str(STEPS)]


def mindcluster_data() -> Path:
    """``../shared/data/mindcluster`` seen from the repository (worktrees sit one level deeper)."""
    root = Path(__file__).resolve().parents[2]
    for parent in root.parents:
        found = parent / "shared" / "data" / "mindcluster"
        if found.is_dir():
            return found
    if os.environ.get("CI") == "true":
        pytest.fail("../shared/data/mindcluster is missing")
    pytest.skip("../shared/data/mindcluster (MindCluster's documented files) is not here")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("reference"))
    with trainer_job(out) as job:
        run_to_end(job)
    shas = {r["sha256"] for r in results(out)}
    assert len(shas) == 1
    return shas.pop()


def _config(strategy: str, port: int = 0) -> JobConfig:
    return JobConfig(
        job_id="msrun-e2e",
        node_nums=2,
        proc_per_node=2,
        manager_port=port,
        strategies=parse_strategies(strategy),
        phase_timeout_s=30.0,
        wait_reschedule_timeout_s=60.0,
    )


def _assert_bit_identical(out: str, reference: str) -> None:
    final = results(out)
    assert [r["sha256"] for r in final] == [reference] * 4
    assert all(r["committed"] == STEPS - 1 for r in final)


def _assert_no_orphans(needle: str) -> None:
    wait_for(lambda: not running_with(needle), 20, f"every process of {needle} to end")


def _start_script(tmp: Path) -> tuple[Path, Path]:
    """MindCluster's manager.py with only its two XX filled in, and a train_start.sh made of
    the shim line, the documented lines verbatim, and msrun."""
    data = mindcluster_data()
    manager_py = tmp / "manager.py"
    text = (data / "manager.py").read_text()
    assert text.count("XX") == 2
    manager_py.write_text(text.replace("XX", "2", 1).replace("XX", "2", 1))
    script = tmp / "train_start.sh"
    script.write_text(
        f'export PYTHONPATH="{shims.path()}:$PYTHONPATH"\n'
        f"cd {tmp}\n" + (data / "train_start_snippet.sh").read_text() + '\nmsrun "$@"\n'
    )
    return manager_py, script


def test_documented_start_script_and_manager_py_recover_a_kill9_in_place(tmp_path, reference):
    """manager.py exactly as documented (started by the documented start-script lines, with
    their LD_PRELOAD line) hosts the manager; kill -9 of rank 2 is recovered in place."""
    manager_py, script = _start_script(tmp_path)
    out, events = str(tmp_path / "out"), tmp_path / "events.jsonl"
    env = {
        **Faults().kill(rank=2, step=9).to_env(),
        "MS_RECOVER_EVENTS": str(events),
        "OPENBLAS_NUM_THREADS": "1",
    }
    pods = MsrunPods(
        _config("recover-in-place,recover,exit", free_port()),
        [*TRAINER, "--out", out],
        env,
        log_dir=str(tmp_path / "logs"),
        start_script=str(script),
    )
    try:
        pods.start()
        assert pods.wait(150), f"pods did not finish: {pods.history}"
        assert pods.exit_codes == {0: 0, 1: 0}, pods.history
        _assert_bit_identical(out, reference)
        wait_for(lambda: not running_with(str(manager_py)), 20, "manager.py to end")
        recoveries = [
            e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "recovery"
        ]
        assert [(r["ok"], r["strategy"], r["lost_steps"]) for r in recoveries] == [
            (True, "recover-in-place", 0)
        ]
    finally:
        pods.close()
    _assert_no_orphans(str(tmp_path))


def test_killed_msrun_is_replaced_by_a_new_pod_under_recover(tmp_path, reference):
    """Node 1's msrun SIGKILLed mid-run: its workers die with it, the pod supervisor starts a
    new msrun for node 1, the job recovers with ``recover`` bit-identically."""
    out = str(tmp_path / "out")
    job = MsrunJob(
        _config("recover,exit"),
        [*TRAINER, "--out", out, "--step-time", "0.05"],
        {"OPENBLAS_NUM_THREADS": "1"},
        log_dir=str(tmp_path / "logs"),
    )
    with job:
        wait_for(
            lambda: min((r["step"] or -1) for r in job.status()["ranks"]) >= 5,
            90,
            "every rank at step 5",
        )
        job.pods.kill_node(1)
        run_to_end(job, 150)
        assert job.exit_code == 0
    _assert_bit_identical(out, reference)
    recoveries = job.find("recovery", ok=True)
    assert [(r["strategy"], r["lost_steps"]) for r in recoveries] == [("recover", 0)]
    node1 = [what for _, node, what in job.pods.history if node == 1]
    assert "pod exited (killed by signal 9)" in node1, node1
    assert sum("started" in what for what in node1) == 2, node1
    _assert_no_orphans(str(tmp_path))


def test_node_0_msrun_lost_whole_with_the_manager_is_recovered_bit_identical(tmp_path, reference):
    """Issue 26 item 3 under msrun (docs/manager-takeover.md): node 0's pod holds the manager,
    msrun (with its MindSpore scheduler process and taskd agent) and two workers; node 1's
    holds a standby. All of node 0 is SIGKILLed at step 12: the standby takes over, node 1's
    workers keep their processes and follow it within 3 s of the detection, a new msrun for
    node 0 (whose own manager stands by) brings its workers back, repaired from replicas."""
    out = str(tmp_path / "out")
    env = {"OPENBLAS_NUM_THREADS": "1", **Faults().node(rank=0, step=12).to_env()}
    job = MsrunManagerPodJob(
        _config("recover,exit"), [*TRAINER, "--out", out], env, log_dir=str(tmp_path / "logs")
    )
    with job:
        run_to_end(job, 200)
        assert job.exit_code == 0, [(e["event"], e.get("reason")) for e in job.events.recent()]
    takeover = job.find("takeover")
    assert [(t["lost_node"], t["term"]) for t in takeover] == [(0, 1)], takeover
    coordinated = job.find("manager_takeover")
    assert coordinated and 0 < coordinated[0]["takeover_s"] <= 3.0, coordinated
    recoveries = job.find("recovery")
    assert [(r["ok"], r["strategy"], r["lost_steps"]) for r in recoveries] == [(True, "recover", 0)]
    assert sorted(recoveries[0]["replaced"]) == [0, 1]
    _assert_bit_identical(out, reference)
    # Node 1's workers kept their processes; node 0's came back under a new msrun.
    assert [r["incarnation"] for r in results(out)] == [0, 0, 0, 0]
    assert job.pods.restarts == {0: 1}
    _assert_no_orphans(str(tmp_path))


def test_recover_ends_msrun_with_86_and_the_pod_comes_back(tmp_path, reference):
    """Under ``recover`` (no in-place) the agent kills its workers and ends msrun itself with
    86 (msrun alone would exit 0); the pod supervisor starts a new msrun for that node. msrun's
    processes lack MS_NODE_RANK / MS_LOCAL_WORKER / MS_WORKER_NUM here: the agent reads msrun's
    own arguments and hands the workers the node's environment."""
    out = str(tmp_path / "out")
    env = {"OPENBLAS_NUM_THREADS": "1", **Faults().kill(rank=2, step=9).to_env()}
    job = MsrunJob(
        _config("recover,exit"),
        [*TRAINER, "--out", out],
        env,
        log_dir=str(tmp_path / "logs"),
        node_env=False,
    )
    with job:
        run_to_end(job, 150)
        assert job.exit_code == 0
    _assert_bit_identical(out, reference)
    node1 = [what for _, node, what in job.pods.history if node == 1]
    assert "pod exited (exit 86: reschedule)" in node1, node1
    recoveries = job.find("recovery", ok=True)
    assert [(r["strategy"], r["lost_steps"]) for r in recoveries] == [("recover", 0)]
    _assert_no_orphans(str(tmp_path))


def test_the_msrun_sample_start_script_keeps_mindclusters_lines():
    """samples/msrun/train_start.sh = the opt-in line + MindCluster's MindSpore lines verbatim."""
    sample = (
        Path(__file__).resolve().parents[2] / "samples" / "msrun" / "train_start.sh"
    ).read_text()
    documented = (mindcluster_data() / "train_start_snippet.sh").read_text().splitlines()
    pytorch = documented.index("# PyTorch框架下")
    mindspore = documented.index("# MindSpore框架下")
    kept = documented[:pytorch] + documented[mindspore + 1 :]
    for line in kept:
        code = line.split("#")[0].rstrip() if "python manager.py" in line else line
        assert code in sample, code
    assert 'export PYTHONPATH="$(ms-recover shim-path):' in sample


def test_demo_with_the_msrun_launcher(tmp_path):
    """`ms-recover demo --launcher msrun`: real MindSpore ranks under one real msrun."""
    out = tmp_path / "result.json"
    run = subprocess.run(
        [sys.executable, "-m", "ms_recover.cli", "demo", "--launcher", "msrun", "--nodes", "1"]
        + ["--steps", "12", "--kill-rank", "1", "--kill-step", "5", "--json", str(out)]
        + ["--workdir", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["recovered"] is True and result["strategy_used"] == "recover-in-place"
    assert result["lost_steps"] == 0 and "launcher msrun" in run.stdout
    _assert_no_orphans(str(tmp_path))


@pytest.mark.timeout(900)
def test_demo_with_the_msrun_launcher_recovers_node_0_lost_with_the_manager(tmp_path):
    """Issue 26 item 3: `ms-recover demo --launcher msrun --fault node --kill-node 0` (real
    MindSpore ranks): node 0's msrun, its scheduler process, agent, ranks and the manager of
    its pod are SIGKILLed; the standby takes over, exit 0. Without --verify, to halve the
    cost: the bit-identity of this path is the numpy test's above (and the acceptance
    check's, with --verify)."""
    out = tmp_path / "result.json"
    run = subprocess.run(
        [sys.executable, "-m", "ms_recover.cli", "demo", "--launcher", "msrun"]
        + ["--fault", "node", "--kill-node", "0", "--steps", "16", "--kill-step", "6"]
        + ["--json", str(out), "--workdir", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["recovered"] is True and result["ranks_finished"] == 4, result
    assert result["lost_steps"] == 0 and result["strategy_used"] == "recover", result
    assert 0 < result["manager_takeover_s"] <= 3, result
    assert "the standby manager took over" in run.stdout
    _assert_no_orphans(str(tmp_path))
