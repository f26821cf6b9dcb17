"""`ms-recover report`: text timeline, Gantt PNG, malformed and missing input."""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

import pytest

from ms_recover import cli
from ms_recover.observability import report
from ms_recover.observability.schema import FaultRecord
from tests.eventlines import line

pytestmark = pytest.mark.timeout(60)

T0 = 1_700_000_000.0
PHASES = {"detect": 0.1, "stop": 0.2, "replace": 1.0, "rebuild": 0.3, "repair": 0.4, "resume": 0.5}


def ev(dt: float, event: str, epoch: int = 0, **fields: Any) -> dict[str, Any]:
    return line(T0 + dt, event, epoch, **fields)


def recovery_log() -> list[dict[str, Any]]:
    """Two recoveries: the first with timed phases, the second as the manager writes them
    today (phase durations only, logged together just before the recovery event)."""
    timed = [
        ev(10.0 + i, "phase", 1, phase=p, start=T0 + 10.0 + i, end=T0 + 10.5 + i, duration_s=0.5)
        for i, p in enumerate(PHASES)
    ]
    return [
        ev(0.0, "job_start", phases={}),
        ev(0.5, "member", role="agent", node_rank=0),
        ev(0.6, "member", role="worker", rank=0),
        ev(0.7, "member", role="worker", rank=1),
        ev(9.9, "fault", 1, kind="process_exit", rank=1, node_rank=0, detail="rank 1 exit -9"),
        ev(9.95, "decision", 1, strategy="recover-in-place", reason="healthy replica exists"),
        *timed,
        ev(
            16.0,
            "recovery",
            1,
            ok=True,
            strategy="recover-in-place",
            mttr_s=6.1,
            phases={p: 0.5 for p in PHASES},
            lost_steps=0,
        ),
        ev(20.0, "fault", 2, kind="node_lost", node_rank=0, detail="agent silent"),
        *[ev(22.5, "phase", 2, phase=p, duration_s=d) for p, d in PHASES.items()],
        ev(
            22.5,
            "recovery",
            2,
            ok=False,
            strategy="recover",
            mttr_s=2.5,
            phases=PHASES,
            lost_steps=None,
        ),
        ev(23.0, "job_end", 2, exit_code=87, reason="recover failed"),
    ]


def write_log(path: pathlib.Path, events: list[dict[str, Any]], extra: str = "") -> pathlib.Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events) + extra)
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["report", *argv])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, captured.out, captured.err


def test_text_timeline(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    log = write_log(tmp_path / "events.jsonl", recovery_log())
    code, out, err = run(capsys, str(log))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["+0.000s", "epoch", "0", "job_start", "phases={}"]
    assert lines[1].split() == ["+0.500s", "member", "x3"]
    assert "+9.900s  epoch 1    fault      kind=process_exit rank=1 node_rank=0" in out
    assert "decision   strategy=recover-in-place reason=healthy replica exists" in out
    assert "+10.000s  epoch 1    phase      detect 0.500s" in out
    assert "recovery   ok strategy=recover-in-place mttr=6.1s lost_steps=0" in out
    assert "recovery   FAILED strategy=recover mttr=2.5s lost_steps=None" in out
    assert "2 fault(s), 2 recovery(ies), 1 ok" in out
    assert "MTTR: mean 6.100s, max 6.100s" in out


def test_plot_writes_png(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib")
    log = write_log(tmp_path / "events.jsonl", recovery_log())
    png = tmp_path / "timeline.png"
    code, out, _ = run(capsys, str(log), "--plot", str(png))
    assert code == 0
    assert f"wrote {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bars_use_real_times_or_lay_durations_end_to_end() -> None:
    first, second = report.incidents(report.load_events(map(json.dumps, recovery_log())).events)
    timed = report.bars(first, T0)
    assert [(b.phase, b.start, b.duration) for b in timed[:2]] == [
        ("detect", 10.0, 0.5),
        ("stop", 11.0, 0.5),
    ]
    laid = report.bars(second, T0)
    assert [b.phase for b in laid] == list(PHASES)
    assert laid[0].start == pytest.approx(22.5 - 2.5)
    assert laid[1].start == pytest.approx(laid[0].start + PHASES["detect"])
    assert [f.record.kind for f in second.faults if isinstance(f.record, FaultRecord)] == [
        "node_lost"
    ]
    assert second.label == "epoch 2 recover (FAILED)"


def test_malformed_lines_are_skipped_and_counted(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    bad = '{"ts": 1\n[1, 2]\n{"ts": "yesterday", "event": "fault"}\n\n{"ts": 5.0}\n'
    log = write_log(tmp_path / "events.jsonl", recovery_log(), extra=bad)
    code, out, err = run(capsys, str(log))
    assert code == 0
    first_bad = len(recovery_log()) + 1
    assert f"skipped 4 malformed line(s) (first at line {first_bad}: not JSON" in err
    assert "recovery(ies)" in out


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "events.jsonl: no such file"),
        ("", "events.jsonl: no events"),
        ("not json\n", "events.jsonl: no events"),
    ],
)
def test_missing_or_empty_log_fails(
    capsys: pytest.CaptureFixture[str],
    tmp_path: pathlib.Path,
    content: str | None,
    expected: str,
) -> None:
    path = tmp_path / "events.jsonl"
    if content is not None:
        path.write_text(content)
    code, _, err = run(capsys, str(path))
    assert code == 1
    assert expected in err


def test_plot_without_matplotlib_explains(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    log = write_log(tmp_path / "events.jsonl", recovery_log())
    code, _, err = run(capsys, str(log), "--plot", str(tmp_path / "t.png"))
    assert code == 1
    assert "install ms-recover[plot]" in err
    assert not (tmp_path / "t.png").exists()


def test_a_fault_shows_its_host_and_traceback_escaped(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    tail = 'Traceback (most recent call last):\n  File "t.py", line 4\nRuntimeError: bad\x1b[2J'
    fault = ev(1.0, "fault", 1, kind="rank_exit", rank=1, host="node-a", pid=42, log_tail=tail)
    log = write_log(tmp_path / "events.jsonl", [ev(0.0, "job_start", phases={}), fault])
    assert cli.main(["report", str(log)]) == 0
    out = capsys.readouterr().out
    assert "fault      kind=rank_exit rank=1 node_rank=0 " in out
    assert " host=node-a pid=42" in out
    assert "| Traceback (most recent call last):" in out
    assert "| RuntimeError: bad\\x1b[2J" in out and "\x1b" not in out
