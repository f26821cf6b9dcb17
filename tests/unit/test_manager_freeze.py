"""The manager of a large job freezes its heap (``gc.freeze``) once per epoch that runs."""

from __future__ import annotations

import gc

import pytest

from ms_recover.config import JobConfig
from ms_recover.manager.server import FREEZE_MIN_RANKS, ManagerServer
from ms_recover.observability.events import EventLog
from ms_recover.observability.schema import JobState


def _server(ranks: int) -> ManagerServer:
    cfg = JobConfig(job_id="gc", node_nums=ranks // 8, proc_per_node=8, manager_port=0)
    return ManagerServer(cfg, events=EventLog(), bind="127.0.0.1")


def test_a_large_job_freezes_once_per_running_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append(1))  # the test process stays as is
    srv = _server(FREEZE_MIN_RANKS)
    try:
        m = srv.model
        srv._freeze_when_running()
        assert calls == []  # still forming
        m.state = JobState.RUNNING
        srv._freeze_when_running()
        srv._freeze_when_running()
        assert calls == [1]
        m.epoch, m.state = m.epoch + 1, JobState.STOPPING
        srv._freeze_when_running()
        assert calls == [1]
        m.state = JobState.RUNNING
        srv._freeze_when_running()
        assert calls == [1, 1]
    finally:
        srv.close()


def test_a_small_job_leaves_the_heap_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append(1))
    srv = _server(FREEZE_MIN_RANKS // 2)
    try:
        srv.model.state = JobState.RUNNING
        srv._freeze_when_running()
        assert calls == []
    finally:
        srv.close()
