"""The report logic of ``bench recovery``'s msrun baseline and ``bench controlplane``: rows,
targets, PASS/MISS, and a measurement that did not happen (a MISS naming why, never ``-``)."""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from ms_recover.bench import controlplane, msrunrestart
from ms_recover.bench.table import Measure, Report
from ms_recover.integrations import shims

REPO = Path(__file__).resolve().parents[2]


def _by_name(rows: list[Measure]) -> dict[str, Measure]:
    return {m.name: m for m in rows}


def test_a_failed_measure_is_a_miss_with_its_reason_in_table_and_json() -> None:
    m = Measure("x: formation", None, "s", "<=", 5.0, failed="did not form within 60 s")
    assert (m.passed, m.verdict) == (False, "MISS")
    assert m.to_json()["failed"] == "did not form within 60 s"
    untargeted = Measure("y", None, "s", failed="why")
    assert untargeted.verdict == "MISS", "a failure without a target is still a MISS"
    rep = Report("b", "title", [m])
    assert not rep.ok
    table = rep.format()
    assert "x: formation: MISS, did not form within 60 s" in table
    assert "n/a s" not in table, "no unit after a missing value"


def test_strict_less_than_target() -> None:
    assert Measure("cpu", 9.99, "%", "<", 10.0).verdict == "PASS"
    assert Measure("cpu", 10.0, "%", "<", 10.0).verdict == "MISS"


SAMPLE = {"exit_s": 33.0, "relaunch_s": 8.0, "killed_at_step": 170, "loaded_step": 99}


def test_msrun_rows_add_up_and_pass_at_five_percent() -> None:
    result = {"step_s": 0.02, "samples": [SAMPLE]}
    rows = _by_name(msrunrestart.rows(2.05, result, ckpt_every=100))
    total = rows["msrun restart: exit + relaunch + expected recompute"]
    assert total.value == pytest.approx(33.0 + 8.0 + 50 * 0.02)  # 42 s
    assert rows["msrun restart: expected recompute, 100/2 steps"].value == pytest.approx(1.0)
    assert rows["msrun restart: steps lost in this run (max)"].value == 71
    assert rows["msrun restart: steady step time"].value == pytest.approx(20.0)
    ratio = rows["recover-in-place MTTR / msrun restart"]
    assert ratio.value == pytest.approx(2.05 / 42 * 100)
    assert (ratio.limit, ratio.verdict) == (5.0, "PASS")
    worse = _by_name(msrunrestart.rows(2.2, result, ckpt_every=100))
    assert worse["recover-in-place MTTR / msrun restart"].verdict == "MISS"  # 5.2 %


def test_msrun_rows_of_a_failed_baseline_keep_their_names_and_miss() -> None:
    good = msrunrestart.rows(1.0, {"step_s": 0.01, "samples": [SAMPLE]}, 100)
    bad = msrunrestart.rows(1.0, {"failed": "msrun did not exit within 240 s"}, 100)
    assert [m.name for m in bad] == [m.name for m in good], "row names are stable"
    ratio = _by_name(bad)["recover-in-place MTTR / msrun restart"]
    assert ratio.value is None and ratio.verdict == "MISS"
    assert "msrun did not exit within 240 s" in ratio.failed
    empty = _by_name(msrunrestart.rows(1.0, {"step_s": 0.01, "samples": []}, 100))
    assert empty["recover-in-place MTTR / msrun restart"].failed.endswith("no sample")


def test_killed_at_advances_the_last_progress_record_by_elapsed_steps() -> None:
    assert msrunrestart.killed_at({"step": 50, "t": 100.0}, 100.095, 0.01) == 59
    assert msrunrestart.killed_at({"step": 50, "t": 100.0}, 99.0, 0.01) == 50


def test_plain_msrun_env_carries_nothing_of_ms_recover() -> None:
    base = {
        "PATH": "/usr/bin",
        "PYTHONPATH": os.pathsep.join([shims.path(), "/keep"]),
        "MS_ENABLE_TFT": "{ARF:1}",
        "MS_RECOVER_SECRET": "x",
        "MS_ROLE": "MS_WORKER",
        "HOME": "/root",
    }
    env = msrunrestart.msrun_env(base)
    assert env["PYTHONPATH"] == "/keep"
    assert "MS_ENABLE_TFT" not in env and "MS_RECOVER_SECRET" not in env and "MS_ROLE" not in env
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    assert env["HOME"] == "/root"


def test_msrun_program_trains_the_demo_model_sizes() -> None:
    """The plain-msrun program repeats the demo's sizes (to import no ms_recover): same job."""

    def sizes(path: Path) -> Any:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple):
                names = [t.id for t in node.targets[0].elts if isinstance(t, ast.Name)]
                if "IN_DIM" in names:
                    return dict(zip(names, ast.literal_eval(node.value), strict=True))
        raise AssertionError(f"no sizes in {path}")

    programs = REPO / "ms_recover" / "mindspore" / "programs"
    assert sizes(programs / "msrun_ckpt_train.py") == sizes(programs / "demo_train.py")


def _scale(ranks: int, formed: bool) -> dict[str, Any]:
    empty = {"n": 0, "median": None, "min": None, "max": None}
    stop = {"n": 2, "median": 0.25, "min": 0.2, "max": 0.3} if formed else empty
    return {
        "ranks": ranks,
        "agents": ranks // 8,
        "failed": "" if formed else "did not form within 60 s at heartbeat 0.5 s",
        "formation_s": 4.0 if formed else None,
        "idle": {
            "cpu_pct": 12.0,
            "in_per_s": 900.0,
            "out_per_s": 10.0,
            "window_s": 8.5,
            "judged": 2,
        }
        if formed
        else None,
        "stop_all": stop,
        "manager_cpu": {"n": 2, "median": 0.1, "min": 0.1, "max": 0.1} if formed else empty,
        "nodes_cpu": {"n": 2, "median": 0.2, "min": 0.2, "max": 0.2} if formed else empty,
        "fake_processes": 2,
        "final_round": {"phases": {"rebuild": 1.0}} if formed else {},
    }


def test_full_scale_rows_carry_design_targets() -> None:
    rows = _by_name(controlplane.scale_rows(_scale(16384, formed=True)))
    label = "16384 ranks / 2048 agents"
    form = rows[f"{label}: formation (connect -> running)"]
    assert (form.op, form.limit, form.verdict) == ("<=", 5.0, "PASS")
    stop = rows[f"{label}: stop-all (median)"]
    assert (stop.op, stop.limit, stop.verdict) == ("<=", 0.3, "PASS")
    cpu = rows[f"{label}: manager CPU between faults"]
    assert (cpu.op, cpu.limit, cpu.verdict) == ("<", 10.0, "MISS")  # 12 %
    assert cpu.note == "8.5 s window, 2 decisions judging every rank"
    assert rows[f"{label}: manager frames received"].value == 900.0
    nodes = rows[f"{label}: simulated nodes' CPU during stop-all"]
    assert (nodes.value, nodes.verdict) == (0.2, "-")  # context: the fakes share the cores
    assert "2 fake processes standing for 2048 nodes" in nodes.note


def test_a_scale_that_did_not_form_is_a_miss_with_the_reason_under_the_same_names() -> None:
    formed = controlplane.scale_rows(_scale(16384, formed=True))
    missing = controlplane.scale_rows(_scale(16384, formed=False))
    assert [m.name for m in missing] == [m.name for m in formed]
    rows = _by_name(missing)
    label = "16384 ranks / 2048 agents"
    for name in (
        "formation (connect -> running)",
        "manager CPU between faults",
        "stop-all (median)",
    ):
        row = rows[f"{label}: {name}"]
        assert row.verdict == "MISS" and row.value is None
        assert row.failed == "did not form within 60 s at heartbeat 0.5 s"


def test_targets_hold_up_to_16384_ranks_and_at_65536_and_131072() -> None:
    small = _by_name(controlplane.scale_rows(_scale(1024, formed=True)))
    verdicts = {n.split(": ")[1]: m.verdict for n, m in small.items() if m.verdict != "-"}
    assert verdicts == {
        "formation (connect -> running)": "PASS",
        "manager CPU between faults": "MISS",  # 12 %
        "stop-all (median)": "PASS",
    }
    big = _by_name(controlplane.scale_rows(_scale(65536, formed=True)))
    label = "65536 ranks / 8192 agents"
    limits = {n.split(": ")[1]: (m.op, m.limit, m.verdict) for n, m in big.items() if m.op}
    assert limits == {
        "formation (connect -> running)": ("<=", 5.0, "PASS"),
        "manager CPU between faults": ("<", 10.0, "MISS"),  # 12 %
        "stop-all (median)": ("<=", 0.3, "PASS"),
        "manager thread CPU during stop-all": ("<=", 0.05, "MISS"),  # 0.1 s
    }
    bad = _by_name(controlplane.scale_rows(_scale(65536, formed=False)))
    assert bad[f"{label}: formation (connect -> running)"].verdict == "MISS"
    assert bad[f"{label}: manager thread CPU during stop-all"].verdict == "MISS"
    largest = _by_name(controlplane.scale_rows(_scale(131072, formed=True)))
    limits = {n.split(": ")[1]: (m.op, m.limit) for n, m in largest.items() if m.op}
    assert limits == {
        "formation (connect -> running)": ("<=", 10.0),
        "stop-all (median)": ("<=", 0.5),
    }
    between = _by_name(controlplane.scale_rows(_scale(32768, formed=True)))
    assert all(m.verdict == "-" for m in between.values()), "no targets at 32,768 ranks"


def test_a_scale_beyond_the_open_file_limit_is_a_miss_with_the_reason_not_left_out() -> None:
    """131,072 ranks on 16,384 node agents need more connections than a host with 16,000
    open files allows the manager: the rows with targets are there, MISS, and say why."""
    rows = _by_name(controlplane.scale_rows(controlplane.not_run(131072, 8, False, 16000)))
    label = "131072 ranks / 16384 agents"
    for name in ("formation (connect -> running)", "stop-all (median)"):
        row = rows[f"{label}: {name}"]
        assert row.verdict == "MISS" and row.value is None
        assert "16384 connections need 16896 open files" in row.failed
        assert "every agent still holds its own connection" in row.failed


def test_a_run_without_the_job_secret_has_its_own_row_names() -> None:
    plain = controlplane.scale_rows({**_scale(65536, formed=True), "secret": False})
    assert all(m.name.startswith("65536 ranks / 8192 agents (no secret): ") for m in plain)
    skipped = controlplane.not_run(131072, 8, False, 20000, secret=False)
    assert all("(no secret)" in m.name for m in controlplane.scale_rows(skipped))


def test_the_direct_shape_has_its_own_row_names() -> None:
    direct = controlplane.scale_rows({**_scale(1024, formed=True), "relay": False})
    assert all(m.name.startswith("1024 ranks / 128 agents (direct): ") for m in direct)


def test_a_job_that_ends_while_forming_fails_formation_at_once_with_the_managers_reason() -> None:
    from types import SimpleNamespace

    from ms_recover.observability.events import EventLog
    from ms_recover.observability.schema import JobState
    from tests.eventlines import record

    scale = object.__new__(controlplane._Scale)
    scale.events = EventLog()
    scale.server = SimpleNamespace(model=SimpleNamespace(state=JobState.FORMING))
    assert scale._formed() is False
    scale.server.model.state = JobState.RUNNING
    assert scale._formed() is True
    scale.events.write(record("decision", strategy="exit", reason="rank 7 silent for 2 s"))
    scale.server.model.state = JobState.EXITING
    with pytest.raises(controlplane.JobEnded, match=r"exiting: rank 7 silent for 2 s"):
        scale._formed()


def _recovery_report(mttrs: list[float]) -> dict[str, Measure]:
    import argparse

    from ms_recover.bench import recoveryreport
    from ms_recover.observability.schema import PHASES

    def run(values: list[float]) -> dict[str, Any]:
        return {
            "step_s": 0.02,
            "footprint": None,
            "samples": [
                {"mttr_s": v, "phases": dict.fromkeys(PHASES, v / 6), "lost_steps": 0}
                for v in values
            ],
        }

    parts = {name: 1.0 for name, *_ in recoveryreport.RESTART_PARTS}
    base = {"step_s": 0.02, "samples": [{"restart_s": 9.0, "parts_median_over_ranks": parts}]}
    args = argparse.Namespace(nodes=2, procs_per_node=2, repeats=3, warm_steps=30, ckpt_every=100)
    args.spares = 0
    rep = recoveryreport.report(args, run(mttrs), run([3.0]), None, base, "w")
    return _by_name(rep.measures)


def test_the_default_recover_in_place_mttr_row_carries_the_design_target() -> None:
    name = "recover-in-place MTTR, median of 3"
    row = _recovery_report([0.2, 0.25, 0.4])[name]
    assert (row.value, row.limit, row.verdict) == (0.25, 0.3, "PASS")
    assert _recovery_report([0.2, 0.31, 0.4])[name].verdict == "MISS"
