"""The goodput ledger on synthetic event streams with a fake clock."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ms_recover.observability.events import EventLog
from ms_recover.observability.goodput import (
    CATEGORIES,
    GoodputLedger,
    ledger_from_events,
    ledger_from_file,
)
from ms_recover.observability.schema import decode
from tests.eventlines import line, record

PHASES = {"detect": 0.5, "stop": 0.2, "replace": 0.6, "rebuild": 0.1, "repair": 0.1, "resume": 0.2}


def ev(ts: float, event: str, **fields: Any) -> dict[str, Any]:
    return line(ts, event, **fields)


def _ledger(events: list[dict[str, Any]]) -> GoodputLedger:
    return ledger_from_events([decode(e) for e in events])


def recovery(ts: float, mttr: float = 1.0, lost: int | None = 0, **fields: Any) -> dict[str, Any]:
    """A recovery event whose round lasted ``mttr`` s; its ``mttr_s`` also holds the detection,
    as the manager writes it (from the incident's start, the last sign of life)."""
    phases = fields.pop("phases", PHASES)
    mttr_s = mttr + phases.get("detect", 0.0)
    base = dict(ok=True, strategy="recover-in-place", mttr_s=mttr_s, phases=phases, target_step=10)
    return ev(ts, "recovery", **{**base, "lost_steps": lost, **fields})


def one_recovery() -> list[dict[str, Any]]:
    """Start-up 0-10 s; a rank dies at 49.5 s, detected at 50 s; recovered at 51 s."""
    return [
        ev(0.0, "manager_start"),
        ev(10.0, "job_start", phases={}),
        ev(50.0, "fault", detect_s=0.5, rank=1),
        ev(50.0, "decision", strategy="recover-in-place", replace=[1], nodes=[]),
        recovery(51.0),
        ev(100.0, "job_end", exit_code=0),
    ]


def approx(x: float) -> Any:
    return pytest.approx(x, abs=1e-9)


def test_no_fault_ettr_is_one_minus_startup() -> None:
    ledger = _ledger([ev(0.0, "manager_start"), ev(5.0, "job_start", phases={})])
    assert ledger.snapshot(100.0)["startup"] == approx(5.0)
    assert ledger.snapshot(100.0)["productive"] == approx(95.0)
    assert ledger.ettr(100.0) == approx(0.95)
    assert ledger.ettr(1000.0) == approx(0.995)  # the clock is the argument


def test_every_second_in_one_category() -> None:
    ledger = _ledger(one_recovery())
    times = ledger.snapshot(100.0)
    assert set(times) == set(CATEGORIES)
    assert sum(times.values()) == approx(100.0)
    assert min(times.values()) >= 0.0


def test_one_recovery_phases_and_detection_gap() -> None:
    times = _ledger(one_recovery()).snapshot(100.0)
    # The half second before the fault event, when the rank was already dead, is detection.
    assert times["detect"] == approx(0.5)
    assert times["stop"] == approx(0.2)
    # stop and replace both run from the round's start: the replace time past the stop counts.
    assert times["replace"] == approx(1.0 - 0.2 - 0.4)
    assert times["rebuild"] == approx(0.1)
    assert times["repair"] == approx(0.1)
    assert times["resume"] == approx(0.2)
    assert times["startup"] == approx(10.0)
    assert times["productive"] == approx(100.0 - 10.0 - 0.5 - 1.0)
    assert times["other"] == approx(0.0)


def test_job_end_stops_the_clock() -> None:
    ledger = _ledger(one_recovery())
    assert ledger.snapshot(500.0) == ledger.snapshot(100.0)


def test_unfinished_recovery_is_other_until_its_event() -> None:
    events = one_recovery()[:4]
    times = _ledger(events).snapshot(50.7)
    assert times["other"] == approx(0.7)
    assert times["detect"] == approx(0.5)
    assert times["productive"] == approx(50.0 - 10.0 - 0.5)


def test_live_ledger_follows_new_events() -> None:
    events = one_recovery()
    ledger = _ledger(events[:4])
    assert ledger.snapshot(60.0)["other"] == approx(10.0)  # the recovery is still under way
    ledger.on_event(events[4])
    after = ledger.snapshot(60.0)
    assert after["other"] == approx(0.0)
    assert after["productive"] == approx(60.0 - 10.0 - 0.5 - 1.0)


def test_lost_steps_are_recomputed_after_the_recovery() -> None:
    # 10 s of start-up, then 39.5 s of training reached step 12 (target 10 + 2 lost).
    events = one_recovery()
    events[4] = recovery(51.0, lost=2)
    times = _ledger(events).snapshot(100.0)
    step = 39.5 / 12
    assert times["recompute"] == approx(2 * step)
    assert times["productive"] == approx(100.0 - 10.0 - 0.5 - 1.0 - 2 * step)


def test_node_restart_waits_for_a_rescheduled_pod() -> None:
    events = one_recovery()
    events[3] = ev(50.0, "decision", strategy="recover", replace=[2, 3], nodes=[1])
    times = _ledger(events).snapshot(100.0)
    assert times["reschedule"] == approx(0.4)
    assert times["replace"] == approx(0.0)


def test_dump_recovery_is_dump_time() -> None:
    events = one_recovery()
    events[4] = recovery(51.0, strategy="dump", ok=False, lost=None)
    times = _ledger(events).snapshot(100.0)
    assert times["dump"] == approx(1.0)
    assert times["other"] == approx(49.0)  # a recovery that gave up: no training after it


def test_out_of_order_events_land_where_they_happened() -> None:
    ordered = _ledger(one_recovery()).snapshot(100.0)
    shuffled = _ledger(list(reversed(one_recovery()))).snapshot(100.0)
    assert shuffled == ordered


def test_overlapping_recoveries_count_each_second_once() -> None:
    # A second fault during the first recovery: a round whose span covers the first one's.
    events = [
        ev(0.0, "manager_start"),
        ev(10.0, "job_start", phases={}),
        ev(50.0, "fault", detect_s=0.5, rank=1),
        ev(50.5, "fault", detect_s=0.1, rank=2),
        recovery(51.0, mttr=1.0),
        recovery(52.0, mttr=2.0),
        ev(100.0, "job_end", exit_code=0),
    ]
    times = _ledger(events).snapshot(100.0)
    assert sum(times.values()) == approx(100.0)
    assert times["productive"] == approx(100.0 - 10.0 - 0.5 - 2.0)
    assert times["detect"] == approx(0.5)


def test_the_detection_inside_mttr_is_counted_once() -> None:
    """A node loss as the manager reports it (bench goodput, a spare node): detected 2.05 s
    after the last heartbeat, the round 0.12 s; ``mttr_s`` 2.17 s holds both."""
    phases = {"detect": 2.05, "stop": 0.01, "replace": 0.02, "rebuild": 0.01, "repair": 0.05}
    events = [
        ev(0.0, "manager_start"),
        ev(10.0, "job_start", phases={}),
        ev(50.0, "fault", detect_s=2.05, rank=-1),
        ev(50.0, "decision", strategy="recover", replace=[2, 3], nodes=[1]),
        ev(50.12, "recovery", ok=True, strategy="recover", mttr_s=2.17, lost_steps=0,
           phases={**phases, "resume": 0.05}, target_step=10),
    ]  # fmt: skip
    times = _ledger(events).snapshot(100.0)
    assert times["detect"] == approx(2.05)
    # The round's 0.12 s is its phases; before the fix the 2.05 s of detection in mttr_s was
    # counted a second time, as waiting for a rescheduled pod.
    assert times["reschedule"] == approx(0.0)
    assert sum(times[k] for k in ("stop", "rebuild", "repair", "resume")) == approx(0.12)
    assert times["productive"] == approx(100.0 - 10.0 - 2.17)


def test_malformed_events_are_ignored() -> None:
    ledger = GoodputLedger()
    good = one_recovery()
    bad: list[Any] = [
        "not a dict",
        {"event": "fault"},
        ev(float("nan"), "job_start"),
        ev(20.0, "fault", detect_s="soon"),
        ev(30.0, "recovery", mttr_s=1.0, phases=["stop"]),
        ev(30.0, "recovery", mttr_s=-1.0, phases={}),
        {"ts": True, "event": "job_end"},
    ]
    for e in [*good[:3], *bad, *good[3:]]:
        ledger.on_event(e)
    assert ledger.ignored == len(bad)
    assert ledger.snapshot(100.0) == _ledger(good).snapshot(100.0)


def test_empty_ledger() -> None:
    ledger = GoodputLedger()
    assert ledger.ettr(10.0) == 0.0
    assert sum(ledger.snapshot(10.0).values()) == 0.0


def test_fed_by_the_event_log_with_a_fake_clock(tmp_path: Any) -> None:
    now = [0.0]
    log = EventLog(str(tmp_path / "events.jsonl"), clock=lambda: now[0])
    ledger = GoodputLedger()
    log.subscribe(ledger.on_event)
    for e in one_recovery():
        now[0] = e["ts"]
        log.write(decode(e).record)
    log.close()
    assert ledger.snapshot(100.0) == _ledger(one_recovery()).snapshot(100.0)
    from_file, end = ledger_from_file(str(tmp_path / "events.jsonl"))
    assert end == 100.0
    assert from_file.snapshot(end) == ledger.snapshot(100.0)
    fields = ledger.record(100.0).fields()
    assert fields["wall_s"] == approx(100.0)
    assert fields["ettr"] == pytest.approx((100.0 - 11.5) / 100.0, abs=1e-6)
    json.dumps(fields)  # an event's fields


def test_manager_writes_the_ledger_at_job_end() -> None:
    from ms_recover.config import JobConfig
    from ms_recover.manager import actions as A
    from ms_recover.manager.executor import Executor
    from ms_recover.manager.model import JobModel
    from ms_recover.observability.schema import JobEndRecord, JobStartRecord

    now = [0.0]
    log = EventLog(clock=lambda: now[0])
    sent: list[Any] = []

    class Sender:
        def send(self, identities: Any, msg: Any) -> None:
            sent.append(msg)

    ex = Executor(
        JobModel(JobConfig(job_id="g", node_nums=1, proc_per_node=2)), log, lambda: now[0], Sender()
    )
    log.write(record("manager_start"), epoch=0)
    now[0] = 4.0
    log.write(JobStartRecord({}), epoch=1)
    now[0] = 20.0
    ex.execute([A.Emit("done", JobEndRecord(0, "every rank finished training"))])
    (goodput,) = log.recent("goodput")
    assert goodput["ettr"] == approx(0.8)
    assert goodput["wall_s"] == approx(20.0)
    assert goodput["seconds"]["startup"] == approx(4.0)
    assert goodput["seconds"]["productive"] == approx(16.0)


def test_report_prints_the_ledger_and_plots_it(tmp_path: Any, capsys: Any) -> None:
    from ms_recover.cli import main

    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in one_recovery()))
    png = tmp_path / "goodput.png"
    assert main(["report", str(path), "--goodput-plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "goodput ledger over 100.000s of wall time:" in out
    assert "  startup           10.000s  10.00%" in out
    assert "ETTR (productive / wall): 88.50%" in out
    assert png.stat().st_size > 0
