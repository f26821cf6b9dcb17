"""The Prometheus collector: counters ending in _total, histograms, build info, the job state,
faults by kind, flagged ranks; nothing that reads as a real value before it has one."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest

from ms_recover import __version__
from ms_recover.manager.status import flagged
from ms_recover.observability.events import EventLog
from ms_recover.observability.metrics import ManagerCollector, registry_for
from tests.eventlines import record

PHASES = {"detect": 0.1, "stop": 0.2, "replace": 1.5, "rebuild": 0.1, "repair": 0.3, "resume": 0.4}


def _status(steps: tuple[int, ...] = (10, 12, 11, 12), state: str = "running") -> dict[str, Any]:
    return {
        "world_size": 4,
        "epoch": 3,
        "state": state,
        "strategies": "recover-in-place,recover,exit",
        "ranks": [{"alive": i != 2, "step": s} for i, s in enumerate(steps)],
    }


def _samples(collector: ManagerCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in collector.collect()
        for s in family.samples
    }


def test_recoveries_are_counted_by_strategy_and_outcome_with_histograms() -> None:
    events = EventLog()
    collector = ManagerCollector(_status, events)
    events.write(
        record(
            "recovery",
            ok=True,
            strategy="recover-in-place",
            mttr_s=2.5,
            phases=PHASES,
            lost_steps=3,
        )
    )
    events.write(
        record(
            "recovery", ok=False, strategy="recover", mttr_s=90.0, phases=PHASES, lost_steps=None
        )
    )
    events.write(record("fault", kind="rank_exit"))
    s = _samples(collector)
    rec = "ms_recover_recoveries_total"
    assert s[(rec, (("outcome", "ok"), ("strategy", "recover-in-place")))] == 1
    assert s[(rec, (("outcome", "failed"), ("strategy", "recover")))] == 1
    assert s[(rec, (("outcome", "failed"), ("strategy", "exit")))] == 0  # declared at 0
    assert s[("ms_recover_lost_steps_total", ())] == 3
    assert s[("ms_recover_faults_total", (("kind", "rank_exit"),))] == 1
    assert s[("ms_recover_faults_total", (("kind", "node_lost"),))] == 0
    dur = "ms_recover_recovery_duration_seconds"
    assert s[(dur + "_count", ())] == 2 and s[(dur + "_sum", ())] == 92.5
    assert s[(dur + "_bucket", (("le", "5"),))] == 1
    assert s[(dur + "_bucket", (("le", "+Inf"),))] == 2
    phase = "ms_recover_recovery_phase_seconds"
    assert s[(phase + "_sum", (("phase", "replace"),))] == 3.0
    assert s[(phase + "_bucket", (("le", "1"), ("phase", "replace")))] == 0
    assert s[(phase + "_bucket", (("le", "2.5"), ("phase", "replace")))] == 2


def test_gauges_from_status_and_one_series_per_state() -> None:
    s = _samples(ManagerCollector(lambda: _status(state="repairing"), EventLog()))
    assert s[("ms_recover_ranks_alive", ())] == 3
    assert s[("ms_recover_world_size", ())] == 4
    assert s[("ms_recover_epoch", ())] == 3
    assert s[("ms_recover_committed_step", ())] == 10
    assert s[("ms_recover_build_info", (("version", __version__),))] == 1
    states = {k[1][0][1]: v for k, v in s.items() if k[0] == "ms_recover_job_state"}
    assert states["repairing"] == 1 and sum(states.values()) == 1 and "running" in states


def test_nothing_reads_as_a_value_before_it_has_one() -> None:
    s = _samples(ManagerCollector(lambda: _status(steps=(-1, 4, 4, 4)), EventLog()))
    assert ("ms_recover_committed_step", ()) not in s  # a rank has not committed yet
    assert s[("ms_recover_recovery_duration_seconds_count", ())] == 0
    assert not any("mttr" in name for name, _ in s)  # no last-value MTTR gauge reading 0.0


def test_flagged_ranks_count_until_replaced() -> None:
    events = EventLog()
    collector = ManagerCollector(lambda: {**_status(), "flagged": flagged(events.recent())}, events)
    for rank in (1, 3, 1):
        events.write(record("flagged", rank=rank, node=0, host="h", step=7, reason="slow"))
    assert _samples(collector)[("ms_recover_ranks_flagged", ())] == 2
    events.write(
        record(
            "recovery",
            ok=True,
            strategy="recover",
            mttr_s=4,
            phases=PHASES,
            lost_steps=0,
            replaced=[3],
        )
    )
    assert _samples(collector)[("ms_recover_ranks_flagged", ())] == 1


def test_the_registry_exports_process_metrics_and_text_format() -> None:
    text = generate_latest(registry_for(_status, EventLog())).decode()
    assert "process_cpu_seconds_total" in text or "process_resident_memory_bytes" in text
    assert "# TYPE ms_recover_recoveries_total counter" in text
    assert "# TYPE ms_recover_recovery_duration_seconds histogram" in text


def test_goodput_ratio_and_time_by_category_follow_the_ledger() -> None:
    clock = iter([1000.0, 1010.0, 1110.0])
    events = EventLog(clock=lambda: next(clock))
    collector = ManagerCollector(_status, events)
    before = _samples(collector)
    assert not any(name.startswith("ms_recover_goodput") for name, _ in before)  # no value yet
    events.write(record("member"))
    events.write(record("job_start"))
    events.write(record("job_end", reason="every rank finished training", exit_code=0))
    s = _samples(collector)
    assert s[("ms_recover_time_seconds_total", (("category", "startup"),))] == 10.0
    assert s[("ms_recover_time_seconds_total", (("category", "productive"),))] == 100.0
    assert abs(s[("ms_recover_goodput_ratio", ())] - 100.0 / 110.0) < 1e-9
