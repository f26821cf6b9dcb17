"""The Prometheus collector: recoveries, phases and lost steps from events, gauges from status."""

from __future__ import annotations

from ms_recover.observability.events import EventLog
from ms_recover.observability.metrics import ManagerCollector


def _status() -> dict:
    return {
        "world_size": 4,
        "epoch": 3,
        "ranks": [{"alive": True}, {"alive": True}, {"alive": False}, {"alive": True}],
    }


def test_collector_reports_recoveries_and_live_state():
    events = EventLog()
    collector = ManagerCollector(_status, events)
    phases = {
        "detect": 0.1,
        "stop": 0.2,
        "replace": 1.5,
        "rebuild": 0.1,
        "repair": 0.3,
        "resume": 0.4,
    }
    events.write(
        "recovery", ok=True, strategy="recover-in-place", mttr_s=2.5, phases=phases, lost_steps=0
    )
    events.write(
        "recovery", ok=False, strategy="recover", mttr_s=9.0, phases=phases, lost_steps=None
    )
    events.write("fault", kind="rank_exit")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in collector.collect()
        for s in family.samples
    }
    assert (
        samples[("ms_recover_recoveries_total", (("ok", "true"), ("strategy", "recover-in-place")))]
        == 1
    )
    assert samples[("ms_recover_recoveries_total", (("ok", "false"), ("strategy", "recover")))] == 1
    assert samples[("ms_recover_last_mttr_seconds", ())] == 9.0
    assert samples[("ms_recover_phase_seconds_total", (("phase", "replace"),))] == 3.0
    assert samples[("ms_recover_lost_steps_total", ())] == 0
    assert samples[("ms_recover_live_ranks", ())] == 3
    assert samples[("ms_recover_epoch", ())] == 3
