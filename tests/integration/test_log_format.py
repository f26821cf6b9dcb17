"""``MS_RECOVER_LOG_FORMAT=json``: the manager's log lines are JSON objects (the agent logs
through the same ``ms-recover`` entry point)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)


def test_the_manager_logs_json_lines() -> None:
    env = {**os.environ, "MS_RECOVER_LOG_FORMAT": "json"}
    env.pop("MS_RECOVER_SECRET", None)  # it then warns at once: a first line to read
    proc = subprocess.Popen(
        [sys.executable, "-m", "ms_recover.cli", "manager", "--port", "0", "--job-id", "j"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # the test's timeout bounds the wait
        record = json.loads(line)
        assert record["logger"] == "ms_recover.manager" and record["level"] == "WARNING"
        assert "INSECURE" in record["message"]
    finally:
        proc.terminate()
        proc.wait(timeout=20)
