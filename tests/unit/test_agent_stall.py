"""The agent's loop logs an iteration long enough to put its node near the manager's silence."""

from __future__ import annotations

import logging

import pytest

from ms_recover.agent import agent as agent_mod


def test_a_long_iteration_is_logged_with_its_cpu(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = iter([10.0, 10.5, 12.0])
    cpu = iter([1.0, 1.1, 1.15])
    monkeypatch.setattr(agent_mod.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(agent_mod.time, "process_time", lambda: next(cpu))
    watch = agent_mod.StallWatch(1.0)
    with caplog.at_level(logging.WARNING, logger="ms_recover.agent"):
        assert watch.lap() == pytest.approx(0.5)
        assert not caplog.records
        assert watch.lap() == pytest.approx(1.5)
    (record,) = caplog.records
    assert record.getMessage() == "agent loop stalled 1.50s (this process ran 0.05s of CPU)"
