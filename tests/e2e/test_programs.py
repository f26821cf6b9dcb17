"""The training programs' package: its formats match their readers."""

from __future__ import annotations

import pytest

pytest.importorskip("mindspore")

from ms_recover.bench import mscluster  # noqa: E402
from ms_recover.mindspore.programs import allreduce_bench  # noqa: E402

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
