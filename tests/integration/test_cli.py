"""The ms-recover command line and the taskd-compatible manager API, as a user runs them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ms_recover import exitcodes
from ms_recover.cli import COMMANDS, main
from ms_recover.errors import ConfigError
from ms_recover.integrations.taskd import manager_api as api
from ms_recover.localrun.wait import wait_for

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def _listen_then_sigterm(
    argv: list[str], port: int, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """Run a manager until its port listens, SIGTERM it; (exit code, stderr). Always reaped."""
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: _listening(port), 20, f"port {port} of {argv[-1]}")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    return proc.returncode, proc.stderr.read()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ms_recover.cli", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["manager", "--strategy", "recovr"], {}, "'recovr' is not one of: retry"),
        (["manager", "--node-nums", "0"], {}, "node_nums must be a positive integer"),
        (["manager"], {"MS_RECOVER_PORT": "http"}, "MS_RECOVER_PORT='http' is not an integer"),
        (["agent", "--node-rank", "5", "--", "true"], {}, "node_rank 5 is outside"),
        (["agent", "--node-rank", "0"], {}, "missing the rank command"),
        (["manager", "--bogus"], {}, "unrecognized arguments: --bogus"),
    ],
)
def test_bad_flags_and_env_exit_2_with_one_line(args, env, needle):
    out = _cli(*args, env=env)
    assert out.returncode == 2
    assert needle in out.stderr
    assert "Traceback" not in out.stderr
    assert len([ln for ln in out.stderr.splitlines() if "error" in ln]) == 1


@pytest.mark.parametrize("command", [name for name, _, _ in COMMANDS])
def test_every_command_has_complete_help(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: ms-recover " + command)
    assert len(text.splitlines()) > 4


def test_manager_listens_and_stops_cleanly_on_sigterm(tmp_path):
    port = _free_port()
    events = tmp_path / "events.jsonl"
    code, stderr = _listen_then_sigterm(
        [
            sys.executable,
            "-m",
            "ms_recover.cli",
            "manager",
            "--port",
            str(port),
            "--job-id",
            "j1",
            "--node-nums",
            "2",
            "--proc-per-node",
            "2",
            "--events",
            str(events),
        ],
        port,
    )
    # The only manager was asked to stop (its pod deleted): the job ends as asked, 143.
    assert code == exitcodes.STOPPED, stderr[-2000:]
    assert "Traceback" not in stderr
    text = events.read_text()
    assert '"event": "manager_start"' in text
    (end,) = [e for e in map(json.loads, text.splitlines()) if e["event"] == "job_end"]
    assert end["reason"].startswith("asked to stop: node 0, which hosts the manager"), end


def test_init_taskd_manager_validates(monkeypatch):
    monkeypatch.setenv("MINDX_TASK_ID", "job-7")
    assert api.init_taskd_manager({"job_id": "job-7", "node_nums": 2, "proc_per_node": 8})
    for bad, needle in [
        ({"node_nums": 0, "proc_per_node": 1}, "node_nums"),
        ({"node_nums": 1, "proc_per_node": -2}, "proc_per_node"),
        ({"node_nums": 1, "proc_per_node": 1, "nodes": 3}, "unknown taskd"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            api.init_taskd_manager(bad)


def test_documented_manager_script_runs_with_our_api(tmp_path):
    port = _free_port()
    env = {
        **os.environ,
        "MINDX_TASK_ID": "sample-job",
        "MS_RECOVER_PORT": str(port),
        "MS_RECOVER_EVENTS": str(tmp_path / "ev.jsonl"),
    }
    _, stderr = _listen_then_sigterm(
        [sys.executable, str(ROOT / "samples" / "manager.py")], port, env
    )
    assert "Traceback" not in stderr
    assert "sample-job" in (tmp_path / "ev.jsonl").read_text()


def test_manager_serves_prometheus_metrics(tmp_path):
    import urllib.request

    port, metrics = _free_port(), _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ms_recover.cli",
            "manager",
            "--port",
            str(port),
            "--node-nums",
            "1",
            "--proc-per-node",
            "2",
            "--metrics-port",
            str(metrics),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: _listening(metrics), 20, "the metrics port")
        body = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    text = body.decode()
    assert "ms_recover_world_size 2.0" in text
    assert "ms_recover_ranks_alive 0.0" in text
    assert "ms_recover_epoch 0.0" in text


def test_agent_sigterm_reaps_its_ranks(tmp_path):
    port = _free_port()  # no manager: the agent still launches its ranks
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ms_recover.cli",
            "agent",
            "--node-rank",
            "0",
            "--node-nums",
            "1",
            "--proc-per-node",
            "2",
            "--port",
            str(port),
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(120)",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    children_file = Path(f"/proc/{agent.pid}/task/{agent.pid}/children")

    def children() -> list[int]:
        try:
            return [int(p) for p in children_file.read_text().split()]
        except OSError:
            return []

    try:
        ranks = wait_for(lambda: len(children()) == 2 and children(), 20, "two rank processes")
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=20) == 128 + signal.SIGTERM
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    for pid in ranks:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    assert "Traceback" not in agent.stderr.read()


def test_a_sigterm_while_the_manager_binds_still_stops_it_cleanly():
    # A supervisor may send SIGTERM as soon as the port listens, before the serve loop runs
    # (a CI flake: the process died of the signal, exit -15). Here it arrives even earlier.
    program = (
        "import os, signal, sys\n"
        "from ms_recover.config import JobConfig\n"
        "from ms_recover.manager.main import hold_sigterm, serve_in_foreground\n"
        "from ms_recover.manager.server import ManagerServer\n"
        "hold_sigterm()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "server = ManagerServer(JobConfig(manager_port=0), bind='127.0.0.1')\n"
        "sys.exit(serve_in_foreground(server))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == exitcodes.STOPPED, run.stderr[-2000:]  # the job ends as asked
    assert "Traceback" not in run.stderr
