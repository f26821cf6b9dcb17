"""Every event line names its job and the schema version of its layout."""

from __future__ import annotations

import json
from pathlib import Path

from ms_recover.config import JobConfig
from ms_recover.manager.server import ManagerServer
from ms_recover.observability.events import EventLog, read_events
from ms_recover.observability.schema import (
    SCHEMA_VERSION,
    EventLine,
    FaultRecord,
    ManagerRestoreRecord,
    RecoveryRecord,
)


def test_every_line_carries_the_job_id_and_the_schema(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    events = EventLog(str(path), clock=lambda: 12.5, job_id="job-a")
    fault = FaultRecord("rank_exit", 3, 0, "rank 3 died", 0.25, 7)
    recovery = RecoveryRecord(True, "recover-in-place", "", 1.5, {}, 7, 0, [], [3])
    events.write(fault)
    events.write(recovery, epoch=2, state="running")
    events.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(e["job_id"], e["schema"]) for e in lines] == [("job-a", SCHEMA_VERSION)] * 2
    assert lines[0] == {
        "ts": 12.5,
        "event": "fault",
        "job_id": "job-a",
        "schema": SCHEMA_VERSION,
        "kind": "rank_exit",
        "rank": 3,
        "node_rank": 0,
        "detail": "rank 3 died",
        "detect_s": 0.25,
        "reported_step": 7,
    }
    assert lines[1]["epoch"] == 2 and lines[1]["state"] == "running"
    read, bad = read_events(str(path))
    assert bad == 0
    assert read == [
        EventLine(12.5, fault, "job-a", SCHEMA_VERSION),
        EventLine(12.5, recovery, "job-a", SCHEMA_VERSION, 2, "running"),
    ]


def test_the_manager_names_its_job_on_an_event_log_built_without_one() -> None:
    cfg = JobConfig(job_id="job-b", node_nums=1, proc_per_node=1, manager_port=0)
    server = ManagerServer(cfg, events=EventLog(), bind="127.0.0.1")
    try:
        record = server.events.write(ManagerRestoreRecord())
    finally:
        server.close()
    assert record["job_id"] == "job-b" and record["schema"] == SCHEMA_VERSION
