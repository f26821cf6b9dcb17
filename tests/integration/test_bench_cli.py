"""``ms-recover bench``: the commands run end to end and report what they measured.

These check behaviour (the JSON has its fields, the values are sane, nothing is left running),
never speed: the targets are the benchmarks' business, not the tests'.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ms_recover.bench import allreduce

from .jobs import running_with

pytestmark = pytest.mark.timeout(120)


def _bench(*args: str, timeout: float = 100.0) -> tuple[subprocess.CompletedProcess[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ms_recover.cli", "bench", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"bench {args} did not finish in {timeout}s:\n{out}\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), proc.pid


def _measures(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in report["measures"]}


def test_detect_reports_rank_and_node_detection(tmp_path: Path) -> None:
    path = tmp_path / "detect.json"
    out, pid = _bench(
        "detect",
        "--repeats",
        "1",
        "--soak",
        "0",  # the rows of what does not crash have their own test (test_detect_numpy)
        "--workdir",
        str(tmp_path / "work"),
        "--json",
        str(path),
    )
    assert out.returncode == 0, out.stderr
    assert "dead process" in out.stdout and ("PASS" in out.stdout or "MISS" in out.stdout)
    report = json.loads(path.read_text())
    assert report["bench"] == "detect"
    samples = report["samples"]
    assert len(samples["rank_kill_to_fault_ms"]) == 1 and len(samples["node_kill_to_fault_s"]) == 1
    rank_ms = samples["rank_kill_to_fault_ms"][0]
    node_s = samples["node_kill_to_fault_s"][0]
    assert 0 < rank_ms < 10_000
    silence, heartbeat = report["settings"]["silence_s"], report["settings"]["heartbeat_s"]
    # Loss is declared by silence: never before (silence - one heartbeat) after the kill.
    assert silence - heartbeat - 0.1 <= node_s < 30
    m = _measures(report)
    dead = m["dead process, median of 1"]
    assert dead["unit"] == "ms" and dead["limit"] == 200 and dead["pass"] in (True, False)
    assert m["lost node, median of 1"]["limit"] == 3
    assert running_with(f"bench-detect-{pid}") == [], "the benchmark left processes behind"


def test_controlplane_small_scale_at_the_default_heartbeat(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    out, _ = _bench(
        "controlplane", "--ranks", "32", "--repeats", "2", "--idle", "3", "--json", str(path)
    )
    assert out.returncode == 0, out.stderr
    assert "heartbeat 0.5 s (the job default" in out.stdout
    report = json.loads(path.read_text())
    assert report["bench"] == "controlplane"
    assert report["settings"]["heartbeat_s"] == 0.5
    assert report["settings"]["heartbeat_is_job_default"] is True
    (scale,) = report["samples"]["scales"]
    assert scale["ranks"] == 32 and scale["agents"] == 4 and scale["failed"] == ""
    repeats = scale["repeats"]
    assert [r["from_state"] for r in repeats] == ["running", "stopping"]
    assert [r["survivors"] for r in repeats] == [31, 30]
    for r in repeats:
        assert 0 < r["fault_event_s"] <= r["stop_all_s"] < 30
        assert r["manager_cpu_s"] > 0
    assert scale["final_round"]["ok"] is True
    assert len(scale["final_round"]["replaced"]) == 2
    idle = scale["idle"]
    # 4 agents heartbeat every agent_heartbeat_s (2/3 s): about 6 frames/s reach the manager
    # (72/s when every rank had its own socket, each beating every 0.5 s). One beat in about
    # four (rank_report_s, 2.5 s) carries their 8 ranks' steps: in 3 s each agent reports once
    # or twice, 32-64 rank heartbeats, 10.7-21.3/s.
    assert 3 < idle["in_per_s"] < 20 and idle["out_per_s"] >= 0 and idle["state"] == "running"
    assert 8 < idle["relayed_per_s"] < 30
    assert 0 < idle["cpu_pct"] < 100
    assert report["settings"]["shape"] == "relay" and scale["relay"] is True
    m = _measures(report)
    stop = m["32 ranks / 4 agents: stop-all (median)"]
    assert stop["pass"] is not None, "the 0.3 s target applies up to 16,384 ranks"
    assert m["32 ranks / 4 agents: formation (connect -> running)"]["value"] > 0
    extrapolated = m["stop-all at 16384 ranks, extrapolated"]
    assert extrapolated["value"] is None  # one scale: no trend to extrapolate
    beat = m["this host: one agent heartbeat handled by the manager (in-process)"]
    assert 0 < beat["value"] < 10_000 and beat["pass"] is None  # a reading of the host


def test_controlplane_a_scale_that_does_not_form_is_a_miss_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    out, _ = _bench("controlplane", "--ranks", "32", "--form-timeout", "0.001", "--json", str(path))
    assert out.returncode == 0, out.stderr
    reason = "did not form within 0.001 s at heartbeat 0.5 s"
    assert f"32 ranks / 4 agents: formation (connect -> running): MISS, {reason}" in out.stdout
    report = json.loads(path.read_text())
    assert report["ok"] is False
    row = _measures(report)["32 ranks / 4 agents: formation (connect -> running)"]
    assert (row["value"], row["pass"], row["failed"]) == (None, False, reason)
    (scale,) = report["samples"]["scales"]
    assert scale["at_deadline"]["state"] == "forming"
    assert 0 <= scale["at_deadline"]["ranks_registered"] < 32
    assert "32 ranks when formation gave up: job forming" in out.stdout


def test_recovery_rejects_bad_msrun_restart_repeats() -> None:
    out, _ = _bench("recovery", "--msrun-restart-repeats", "0", timeout=30)
    assert out.returncode == 2
    assert "--msrun-restart-repeats >= 1" in out.stderr


def test_bench_help_lists_every_benchmark() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ms_recover.cli", "bench", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert out.returncode == 0, out.stderr
    for name in ("detect", "recovery", "overhead", "controlplane", "allreduce", "goodput"):
        assert name in out.stdout


def test_allreduce_without_mindspore_reports_host_and_socket_copy(tmp_path: Path) -> None:
    path = tmp_path / "allreduce.json"
    out, _ = _bench(
        *("allreduce", "--no-mindspore", "--sizes", "0.25", "--repeats", "2"),
        *("--doubling-world", "3", "--doubling-sizes", "0.01", "--json", str(path)),
    )
    assert out.returncode == 0, out.stderr
    assert "MindSpore CPU AllReduce not measured: skipped (--no-mindspore)" in out.stdout
    report = json.loads(path.read_text())
    assert report["bench"] == "allreduce" and report["settings"]["mindspore"] is False
    host = report["samples"]["host_s"]["0.25"]
    # under 1 MiB a size runs at least SMALL_REPEATS repetitions (each takes microseconds)
    runs = allreduce.SMALL_REPEATS
    assert len(host) == 2 and all(len(rank) == runs and min(rank) > 0 for rank in host)
    assert report["samples"]["mindspore_s"] == {"0.25": None}
    m = _measures(report)
    assert m["0.25 MiB: host allreduce busbw"]["value"] > 0
    assert m["0.25 MiB: MindSpore AllReduce busbw"]["value"] is None
    ratio = m["0.25 MiB: host / MindSpore busbw"]
    assert (ratio["value"], ratio["limit"], ratio["pass"]) == (None, 5, None)
    copy = m["0.25 MiB: host allreduce time / socket copy time"]  # targets: 64 KiB and less
    assert copy["value"] > 0 and copy["limit"] is None
    exchange = m["0.25 MiB: host allreduce / raw exchange"]  # targets: 16 MiB and more
    assert exchange["value"] > 0 and exchange["limit"] is None
    assert m["0.25 MiB: raw full-duplex socket exchange"]["value"] > 0
    for kind in ("raw_exchange_threaded_s", "raw_exchange_polled_s", "socket_copy_s"):
        assert len(report["samples"][kind]["0.25"][0]) == runs
    curve = m["0.25 MiB: host allreduce busbw, CURVE"]  # what data-plane encryption costs
    assert curve["value"] > 0 and "MS_RECOVER_DATA_CURVE=1" in curve["note"]
    assert len(report["samples"]["host_curve_s"]["0.25"]) == 2  # ranks
    # Groups of more than two: recursive doubling against the ring, in the same processes.
    assert report["settings"]["doubling_world"] == 3
    for kind in ("doubling_s", "ring_s"):
        ranks = report["samples"][kind]["0.01"]
        assert len(ranks) == 3 and all(len(r) == runs and min(r) > 0 for r in ranks)
    assert m["0.01 MiB, 3 ranks: recursive doubling allreduce"]["value"] > 0
    assert m["0.01 MiB, 3 ranks: ring allreduce"]["value"] > 0
    vs = m["0.01 MiB, 3 ranks: recursive doubling / ring time"]
    assert vs["value"] > 0 and (vs["op"], vs["limit"]) == ("<", 1)


def test_allreduce_rejects_bad_settings() -> None:
    out, _ = _bench("allreduce", "--world", "1", "--ms-tries", "0", timeout=30)
    assert out.returncode == 2
    assert "--world must be >= 2, got 1; --ms-tries must be >= 1, got 0" in out.stderr
    out, _ = _bench("allreduce", "--doubling-world", "2", "--doubling-sizes", "1", timeout=30)
    assert out.returncode == 2
    assert "--doubling-world must be 0 (skip) or >= 3, got 2" in out.stderr
    assert "--doubling-sizes must be > 0 and <= 0.25 MiB (DOUBLING_MAX_BYTES), got [1.0]" in (
        out.stderr
    )


def test_controlplane_direct_shape_still_runs(tmp_path: Path) -> None:
    """--direct: every simulated rank its own socket (msrun's ranks connect so)."""
    path = tmp_path / "cp.json"
    out, _ = _bench(
        "controlplane",
        "--ranks",
        "32",
        "--repeats",
        "1",
        "--idle",
        "1",
        "--direct",
        "--json",
        str(path),
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(path.read_text())
    (scale,) = report["samples"]["scales"]
    assert scale["relay"] is False and scale["failed"] == "" and scale["final_round"]["ok"]
    assert 30 < scale["idle"]["in_per_s"] < 150  # 32 ranks + 4 agents, 2 heartbeats/s each
    assert "32 ranks / 4 agents (direct): formation (connect -> running)" in _measures(report)


def test_controlplane_with_heartbeat_groups(tmp_path: Path) -> None:
    """--group-nodes 4 at 8 nodes: two groups; the leaders (nodes 0 and 4) send the manager
    their members' beats in batches, so it reads fewer frames than one per node beat, and the
    job still forms, stops every survivor and recovers."""
    path = tmp_path / "cp.json"
    out, _ = _bench(
        "controlplane",
        *("--ranks", "64", "--repeats", "1", "--idle", "3", "--group-nodes", "4"),
        *("--json", str(path)),
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(path.read_text())
    (scale,) = report["samples"]["scales"]
    assert scale["group_size"] == 4 and scale["failed"] == "" and scale["final_round"]["ok"]
    # 8 agents beat every 2/3 s (12/s); 6 of them through a leader, whose batches go out at
    # most every 1/6 s: about 3 direct beats/s and at most 12 batches/s, never all 12 beats.
    idle = scale["idle"]
    assert 0 < idle["in_per_s"] < 12 and idle["state"] == "running"
    assert 8 < idle["relayed_per_s"] < 60  # the members' ranks' steps still arrive
    assert "64 ranks / 8 agents: formation (connect -> running)" in _measures(report)
