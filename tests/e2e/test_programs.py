"""The training programs' package: its formats match their readers, and the old paths work."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("mindspore")

from ms_recover.bench import mscluster  # noqa: E402
from ms_recover.mindspore.programs import allreduce_bench, demo_train, fit_train  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_the_allreduce_program_writes_what_the_bench_reads() -> None:
    lines = [
        allreduce_bench.event_line("formed", rank=1, world=2),
        allreduce_bench.event_line("result", rank=1, world=2, times={"8": [0.5, 0.25]}),
    ]
    assert lines == [
        mscluster.event_line("formed", rank=1, world=2),
        mscluster.event_line("result", rank=1, world=2, times={"8": [0.5, 0.25]}),
    ]
    progress = mscluster.parse_progress("".join(lines))
    assert progress == mscluster.RankProgress(True, {8: [0.5, 0.25]}, "")


def test_the_old_program_paths_re_export_the_programs() -> None:
    from ms_recover.testing.record import write_rank_record

    from ms_recover.mindspore import demo_train as old_demo
    from ms_recover.mindspore import fit_train as old_fit
    from ms_recover.worker import record

    assert old_demo.build is demo_train.build and old_demo.main is demo_train.main
    assert (old_demo.CLASSES, old_demo.IN_DIM, old_demo.SEED) == (
        demo_train.CLASSES,
        demo_train.IN_DIM,
        demo_train.SEED,
    )
    assert old_fit.StepRecorder is fit_train.StepRecorder and old_fit.main is fit_train.main
    assert write_rank_record is record.write_rank_record


def test_the_old_module_path_still_runs_the_program() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ms_recover.mindspore.demo_train", "--help"],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode == 0, out.stderr
    assert "--steps" in out.stdout and "demo's training program" in out.stdout
