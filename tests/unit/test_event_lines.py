"""Every event line names its job and the schema version of its layout."""

from __future__ import annotations

import json
from pathlib import Path

from ms_recover.config import JobConfig
from ms_recover.manager.server import ManagerServer
from ms_recover.observability.events import SCHEMA_VERSION, EventLog, read_events


def test_every_line_carries_the_job_id_and_the_schema(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    events = EventLog(str(path), clock=lambda: 12.5, job_id="job-a")
    events.write("fault", rank=3)
    events.write("recovery", epoch=2, strategy="recover-in-place")
    events.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(e["job_id"], e["schema"]) for e in lines] == [("job-a", SCHEMA_VERSION)] * 2
    assert lines[0] == {
        "ts": 12.5,
        "event": "fault",
        "job_id": "job-a",
        "schema": SCHEMA_VERSION,
        "rank": 3,
    }
    read, bad = read_events(str(path))
    assert bad == 0 and read == lines


def test_the_manager_names_its_job_on_an_event_log_built_without_one() -> None:
    cfg = JobConfig(job_id="job-b", node_nums=1, proc_per_node=1, manager_port=0)
    server = ManagerServer(cfg, events=EventLog(), bind="127.0.0.1")
    try:
        record = server.events.write("probe")
    finally:
        server.close()
    assert record["job_id"] == "job-b" and record["schema"] == SCHEMA_VERSION
