"""`ms-recover demo` as a newcomer runs it: the result JSON, the exit code, bad flags."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _demo(*args: str, timeout: float = 280) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ms_recover.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.timeout(900)
def test_demo_slow_moves_the_slow_rank_to_a_new_pod(tmp_path):
    """``--fault slow``: rank 2 (node 1) stopped a third of the time by its pod is flagged, a
    new pod for node 1 comes up while training goes on and is swapped in (hotSwitch):
    recovered, 0 lost steps. Without --verify, for the suite's cost (its reference is 600
    MindSpore steps on 4 ranks): a hot switch's bit-identity is
    tests/integration/test_fault_matrix.py's."""
    out = tmp_path / "result.json"
    run = _demo(
        *("--fault", "slow", "--workdir", str(tmp_path / "work")),
        *("--json", str(out)),
        timeout=880,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["recovered"] and result["lost_steps"] == 0, result
    # The hot switch moves the rank (recover); a hang blamed on the stalling flagged rank waits
    # for it (on a loaded host, the adaptive hang bound was crossed before the new pod was up).
    assert result["strategy_used"] == "recover"
    assert "fault: slow (rank 2)" in run.stdout and "flagged" in run.stdout


@pytest.mark.timeout(900)
def test_demo_hang_with_its_defaults_exits_0(tmp_path):
    """Issue 26 item 8: the hang case's own timeout also bounds every first step's compile.
    Its default hang comes once step times are known: the adaptive rule names the culprit."""
    run = _demo("--fault", "hang", "--verify", "--workdir", str(tmp_path / "work"), timeout=880)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "weights match the uninterrupted run bit for bit" in run.stdout
    assert "fault: hang (rank 1) after step 30" in run.stdout
    assert "rank 1 at step 30: not waiting in a collective while the others are" in run.stdout


@pytest.mark.timeout(900)
def test_demo_node_0_lost_with_the_manager_is_recovered_by_the_standby(tmp_path):
    """Issue 26 items 3 and 8: the default node fault kills node 0, whose pod holds the
    manager; the standby takes over, node 0's ranks come back, exit 0. Without --verify, for
    the suite's cost: this path's bit-identity is tests/integration/test_node0_takeover.py's
    (and the acceptance check's, with --verify)."""
    out = tmp_path / "result.json"
    run = _demo(
        *("--fault", "node", "--json", str(out), "--workdir", str(tmp_path / "work")),
        timeout=880,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["recovered"] is True and result["ranks_finished"] == 4, result
    assert result["lost_steps"] == 0 and result["strategy_used"] == "recover"
    assert 0 < result["manager_takeover_s"] <= 3, result
    assert "the standby manager took over" in run.stdout


def test_demo_verify_writes_the_result_json(tmp_path):
    out = tmp_path / "result.json"
    run = _demo(
        "--steps",
        "20",
        "--kill-step",
        "8",
        "--verify",
        "--json",
        str(out),
        "--workdir",
        str(tmp_path / "work"),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["recovered"] is True and result["strategy_used"] == "recover-in-place"
    assert result["lost_steps"] == 0 and result["mttr_s"] > 0
    assert set(result["phases"]) == {"detect", "stop", "replace", "rebuild", "repair", "resume"}
    assert result["weights_match"] is True
    assert result["final_weights_sha256"] == result["reference_weights_sha256"]
    assert "RECOVERED with recover-in-place" in run.stdout
    assert "weights match the uninterrupted run bit for bit" in run.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--kill-step", "99"], "--kill-step must be in 0..38"),
        (["--kill-rank", "7"], "--kill-rank 7 is outside 0..3"),
        (["--kill-node", "2"], "--kill-node 2 is outside 0..1"),
        (["--nodes", "1", "--procs-per-node", "1"], "at least 2 ranks"),
        (["--strategy", "recover,recover"], "listed twice"),
        (["--fault", "meteor"], "invalid choice: 'meteor'"),
        (["--launcher", "msrun", "--spares", "1"], "--spares needs --launcher agent"),
        (["--launcher", "slurm"], "invalid choice: 'slurm'"),
        (["--sub-healthy-strategy", "hotswitch"], "invalid choice: 'hotswitch'"),
        (["--fault", "slow", "--launcher", "msrun"], "--fault slow needs --launcher agent"),
    ],
)
def test_demo_bad_flags_exit_2_with_a_reason(args, needle):
    run = _demo(*args)
    assert run.returncode == 2
    assert needle in run.stderr
    assert "Traceback" not in run.stderr
