"""The MindSpore cluster runner of ``bench allreduce``, with stand-in processes.

A small stand-in program speaks the worker's report format instead of MindSpore, so this checks
the runner's own behaviour in a few seconds: it reads the reports and retries a cluster that
does not form. It also kills and reaps every process it started, whether the attempt succeeds,
fails, runs out of time or is interrupted. Real MindSpore runs only under ``ms-recover bench``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ms_recover.bench import mscluster
from ms_recover.bench.mscluster import Limits, Plan

from .jobs import running_with

pytestmark = pytest.mark.timeout(60)

STAND_IN = """\
import argparse, os, sys, time
from ms_recover.bench.mscluster import event_line
p = argparse.ArgumentParser()
p.add_argument("--counts", type=int, nargs="+")
p.add_argument("--repeats", type=int)
p.add_argument("--out")
a = p.parse_args()
mode = os.environ["STAND_IN_MODE"]
rank = os.environ.get("MS_NODE_ID")
if mode == "die" and rank == "1":
    sys.exit(3)
if os.environ["MS_ROLE"] == "MS_SCHED" or mode == "hang":
    time.sleep(600)  # the runner must kill it
with open(os.path.join(a.out, f"rank-{rank}.jsonl"), "a") as f:
    f.write(event_line("formed"))
    f.flush()
    f.write(event_line("result", times={str(n): [0.001 * (int(rank) + 1)] * a.repeats
                                        for n in a.counts}))
"""
PLAN = Plan(counts=(4, 16), world=2, repeats=3)


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    program = tmp_path / "stand_in_worker.py"
    program.write_text(STAND_IN)
    monkeypatch.setattr(mscluster, "PROGRAM", [sys.executable, str(program)])
    monkeypatch.setattr(mscluster, "EXIT_GRACE_S", 0.1)
    return program


def test_reports_are_collected_and_every_process_is_reaped(
    stand_in: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAND_IN_MODE", "ok")
    out = mscluster.measure(PLAN, tmp_path / "work", Limits(form_s=30, run_s=30, tries=1))
    assert out.reason == "" and out.tries == ()
    assert out.times == {4: [[0.001] * 3, [0.002] * 3], 16: [[0.001] * 3, [0.002] * 3]}
    assert running_with(str(stand_in)) == [], "the sleeping scheduler was left behind"


def test_a_cluster_that_never_forms_is_retried_then_reported_not_measured(
    stand_in: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAND_IN_MODE", "hang")
    out = mscluster.measure(PLAN, tmp_path / "work", Limits(form_s=0.5, run_s=30, tries=2))
    assert out.times is None
    assert [t.split(": ", 1)[1] for t in out.tries] == [
        "the cluster did not form within 0.5 s (init() returned on ranks [] of 2)"
    ] * 2
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["try-1", "try-2"]
    assert running_with(str(stand_in)) == []


def test_a_worker_that_dies_before_forming_is_named(
    stand_in: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAND_IN_MODE", "die")
    out = mscluster.measure(PLAN, tmp_path / "work", Limits(form_s=30, run_s=30, tries=1))
    assert out.times is None
    assert out.tries == ("try 1: rank 1 exited with code 3 before the cluster formed",)
    assert running_with(str(stand_in)) == []


def test_an_interrupt_kills_and_reaps_the_cluster(
    stand_in: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAND_IN_MODE", "hang")

    def interrupted(*args: object) -> mscluster.Verdict:
        raise KeyboardInterrupt

    monkeypatch.setattr(mscluster, "assess", interrupted)
    with pytest.raises(KeyboardInterrupt):
        mscluster.measure(PLAN, tmp_path / "work", Limits(form_s=30, run_s=30, tries=3))
    assert running_with(str(stand_in)) == []
