"""Logs and configuration (issue 29, item 7): ``MS_RECOVER_LOG_FORMAT=json`` log lines,
``ms-recover config`` with the source of every value, and ``check-job`` warnings shown next to
errors."""

from __future__ import annotations

import json
import logging
import pathlib
import sys

import pytest

from ms_recover import cli
from ms_recover.errors import ConfigError
from ms_recover.observability import logfmt

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_a_json_log_line_carries_time_level_logger_message_and_traceback() -> None:
    try:
        raise ValueError("bad shard")
    except ValueError:
        record = logging.LogRecord(
            "ms_recover.agent", logging.ERROR, __file__, 1, "rank %d: %s", (3, "x"), sys.exc_info()
        )
    line = logfmt.JsonFormatter().format(record)
    assert "\n" not in line
    out = json.loads(line)
    assert out["level"] == "ERROR" and out["logger"] == "ms_recover.agent"
    assert out["message"] == "rank 3: x" and out["time"].endswith("Z")
    assert "ValueError: bad shard" in out["exc"]


def test_a_bad_log_format_names_the_valid_ones() -> None:
    assert logfmt.format_from_env({}) == "text"
    assert logfmt.format_from_env({"MS_RECOVER_LOG_FORMAT": "JSON"}) == "json"
    with pytest.raises(ConfigError, match="MS_RECOVER_LOG_FORMAT='xml' is not one of: text, json"):
        logfmt.format_from_env({"MS_RECOVER_LOG_FORMAT": "xml"})


def test_config_names_the_source_of_every_value(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key in ("MS_RECOVER_STRATEGY", "MS_RECOVER_NODE_NUMS", "MS_RECOVER_PORT", "POD_IP"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MINDX_TASK_ID", "job-7")
    monkeypatch.setenv("MS_WORKER_NUM", "8")
    monkeypatch.setenv("MS_LOCAL_WORKER", "4")
    monkeypatch.setenv("MS_ENABLE_TFT", "{ARF:1}")
    monkeypatch.setenv("MS_RECOVER_HEARTBEAT_S", "2")
    monkeypatch.setenv("MS_RECOVER_SECRET", "do-not-print-me")
    assert cli.main(["config", "--port", "7000", "--json"]) == 0
    out = capsys.readouterr().out
    assert "do-not-print-me" not in out
    shown = json.loads(out)
    assert shown["manager_port"] == {"value": 7000, "source": "flag --port"}
    assert shown["job_id"] == {"value": "job-7", "source": "MindCluster MINDX_TASK_ID"}
    assert shown["node_nums"]["value"] == 2 and "MS_WORKER_NUM" in shown["node_nums"]["source"]
    assert shown["strategies"] == {"value": "recover,exit", "source": "MindCluster MS_ENABLE_TFT"}
    assert shown["heartbeat_s"] == {"value": 2.0, "source": "env MS_RECOVER_HEARTBEAT_S"}
    assert shown["secret"] == {"value": "(set, 15 bytes)", "source": "env MS_RECOVER_SECRET"}
    assert shown["phase_timeout_s"]["source"] == "default"


def test_check_job_shows_warnings_next_to_errors(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (ROOT / "samples" / "ascendjob-recover.yaml").read_text()
    bad = text.replace('fault-scheduling: "grace"', 'fault-scheduling: "off"').replace(
        "kind: AscendJob\n", "kind: AscendJob\nbogus: 1\n", 1
    )
    path = tmp_path / "job.yaml"
    path.write_text(bad)
    assert cli.main(["check-job", str(path)]) == 1
    out = capsys.readouterr().out
    assert "bogus: error: unknown field 'bogus'" in out
    assert "metadata.labels.fault-scheduling: warning: is off" in out
    assert "1 error(s), 1 warning(s)" in out
