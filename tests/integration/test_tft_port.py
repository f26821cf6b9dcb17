"""The manager also serves MindSpore's MindIO processors at MS_TFT_PORT (issue 12)."""

from __future__ import annotations

import socket

import pytest

from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError
from ms_recover.manager.server import ManagerServer
from ms_recover.observability.status import query


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_manager_answers_on_its_port_and_on_ms_tft_port() -> None:
    tft = _free_port()
    server = ManagerServer(
        JobConfig.from_env({"MS_TFT_PORT": str(tft)}, job_id="tft", manager_port=0),
        bind="127.0.0.1",
    )
    thread = server.start_thread()
    try:
        for port in (server.port, tft):  # one ROUTER, two endpoints
            status = query(server.config.replace(manager_port=port), timeout_s=10)
            assert status is not None, f"no answer on port {port}"
            assert status["job_id"] == "tft"
    finally:
        server.stop()
        thread.join(10)
    assert not thread.is_alive()


def test_a_bad_ms_tft_port_is_a_one_line_error() -> None:
    with pytest.raises(ConfigError, match=r"MS_TFT_PORT=70000 is not in 0\.\.65535"):
        JobConfig.from_env({"MS_TFT_PORT": "70000"})
