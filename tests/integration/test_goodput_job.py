"""The goodput ledger of a real local job: the manager's ``goodput`` event and the ledger
rebuilt from the events file agree, and account the whole job."""

from __future__ import annotations

import os

import pytest

from ms_recover.localrun.faults import Faults
from ms_recover.observability.events import read_events
from ms_recover.observability.goodput import ledger_from_file
from ms_recover.observability.schema import GoodputRecord, RecoveryRecord

from .jobs import run_to_end, trainer_job


def test_goodput_of_a_job_with_one_killed_rank(tmp_path):
    events_path = os.path.join(str(tmp_path), "events.jsonl")
    with trainer_job(str(tmp_path), Faults().kill(rank=1, step=8), events_path=events_path) as job:
        run_to_end(job)
        assert job.exit_code == 0
    events, bad = read_events(events_path)
    assert bad == 0
    (written,) = [e.record for e in events if isinstance(e.record, GoodputRecord)]
    (end,) = [e for e in events if e.event == "job_end"]
    (rec,) = [e.record for e in events if isinstance(e.record, RecoveryRecord)]
    ledger, until = ledger_from_file(events_path)
    assert until == end.ts
    times = ledger.snapshot(until)
    assert ledger.start == events[0].ts
    assert sum(times.values()) == pytest.approx(end.ts - events[0].ts, abs=1e-6)
    assert written.seconds == {k: round(v, 4) for k, v in times.items()}
    assert written.ettr == pytest.approx(ledger.ettr(until), abs=1e-6)
    assert 0.0 < written.ettr < 1.0
    # The recovery's span and its detection are accounted to its phases (mttr_s holds both).
    phases = ("stop", "replace", "rebuild", "repair", "resume")
    round_s = rec.mttr_s - rec.phases["detect"]
    assert sum(times[p] for p in phases) == pytest.approx(round_s, abs=1e-3)
    assert times["detect"] >= rec.phases["detect"] - 1e-6
    # The ledger ends the round at the recovery event's stamp, taken when it is written, after
    # the phase events; its durations end at the decision's clock reading just before. What
    # lies between the two is counted as ``other``: microseconds, but 8 ms once on a loaded
    # 2-core CI host. More than a stamping delay would be time the ledger cannot place.
    assert times["startup"] > 0.0 and times["other"] < 0.05
