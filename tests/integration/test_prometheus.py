"""A real Prometheus scrapes a live manager through a fault (issue 29, item 4): the recovery is
counted, as Prometheus' HTTP API reports it. Prometheus (Debian's package) runs on an ephemeral
127.0.0.1 port with its data in a tmp dir and is reaped by PID. Slow: Prometheus' own start."""

from __future__ import annotations

import json
import pathlib
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from ms_recover.localrun.faults import Faults
from ms_recover.localrun.wait import wait_for
from ms_recover.observability.metrics import serve_metrics

from .jobs import trainer_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def prometheus(tmp_path: pathlib.Path) -> Iterator[tuple[int, int]]:
    """(Prometheus' port, the metrics port it scrapes every second)."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed: apt-get install prometheus (.ci/run does)"
    target, port = _free_port(), _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: ms-recover\n    static_configs: [{{targets: ['127.0.0.1:{target}']}}]\n"
    )
    with open(tmp_path / "prometheus.log", "wb") as log:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: _ready(port), 60, "Prometheus to be ready")
        yield port, target
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _query(port: int, expr: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _value(port: int, expr: str) -> float:
    result = _query(port, expr)
    return float(result[0]["value"][1]) if result else -1.0


def test_prometheus_counts_the_recovery_of_a_live_job(
    prometheus: tuple[int, int], tmp_path: pathlib.Path
) -> None:
    port, target = prometheus
    job = trainer_job(str(tmp_path / "out"), Faults().kill(rank=1, step=10), steps=40)
    server = serve_metrics(target, job.server.status, job.events, host="127.0.0.1")
    try:
        with job:
            wait_for(lambda: _value(port, "ms_recover_world_size") == 4, 60, "a first scrape")
            assert _value(port, 'ms_recover_recoveries_total{outcome="ok"}') == 0
            assert job.wait(120), job.status()
            ok = 'sum(ms_recover_recoveries_total{outcome="ok"})'
            wait_for(lambda: _value(port, ok) >= 1, 30, "Prometheus to count the recovery")
            assert _value(port, 'ms_recover_faults_total{kind="rank_exit"}') >= 1
            assert _value(port, "ms_recover_recovery_duration_seconds_count") >= 1
            assert _value(port, 'ms_recover_job_state{state="finished"}') == 1
            assert _value(port, 'ms_recover_build_info{version!=""}') == 1
            assert _value(port, 'up{job="ms-recover"}') == 1
    finally:
        server.shutdown()
        server.server_close()
