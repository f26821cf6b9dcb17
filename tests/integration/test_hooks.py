"""The scheduler hook: starting, reusing and stopping the real manager on 127.0.0.1.

Every test runs `ms-recover manager` on a free ephemeral port with MS_SCHED_HOST == POD_IP ==
127.0.0.1 and its own run directory, and the `procs` fixture reaps every process by pid.
"""

from __future__ import annotations

import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from ms_recover.integrations.hook import autostart
from ms_recover.integrations.hook import command as hooks

pytestmark = pytest.mark.timeout(90)

ROOT = pathlib.Path(__file__).resolve().parents[2]
HOOK = ROOT / "ms_recover" / "integrations" / "hook" / "ms_recover_hook.sh"
TRAIN_START = ROOT / "samples" / "train_start.sh"
DEADLINE_S = 20.0
OUR_VARS = (
    "MS_ROLE",
    "MS_SCHED_HOST",
    "POD_IP",
    "MINDX_TASK_ID",
    "MS_RECOVER_EVENTS",
    "MS_RECOVER_AUTOSTART",
    "MS_RECOVER_RUN_DIR",
    "MS_RECOVER_PORT",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(condition: Callable[[], bool], what: str, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def env(tmp_path: pathlib.Path) -> dict[str, str]:
    """A scheduler-pod environment with its own port and run directory."""
    base = {k: v for k, v in os.environ.items() if k not in OUR_VARS}
    return {
        **base,
        "MS_SCHED_HOST": "127.0.0.1",
        "POD_IP": "127.0.0.1",
        "MINDX_TASK_ID": f"hooktest-{uuid.uuid4().hex[:8]}",
        "MS_RECOVER_NODE_NUMS": "1",
        "MS_LOCAL_WORKER": "1",
        "MS_RECOVER_PORT": str(free_port()),
        "MS_RECOVER_RUN_DIR": str(tmp_path / "run"),
        "MS_RECOVER_START_TIMEOUT": str(DEADLINE_S),
    }


@pytest.fixture
def procs(env: dict[str, str]) -> Iterator[list[int]]:
    """Pids to reap at teardown; the manager in the run directory's pid file is added too."""
    pids: list[int] = []
    yield pids
    recorded = hooks.read_pid(hooks.run_files(env))
    for pid in pids + ([recorded] if recorded else []):
        reap(pid)


def reap(pid: int) -> None:
    if hooks.is_alive(pid):
        os.kill(pid, signal.SIGKILL)
    try:
        os.waitpid(pid, 0)  # the hook started it from this process: collect its exit status
    except ChildProcessError:  # someone else's child: wait until it is gone
        wait_for(lambda: not hooks.is_alive(pid), f"pid {pid} to be reaped", 5.0)


def start(env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = hooks.main(["start"], env)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def manager_pid(env: dict[str, str]) -> int:
    pid = hooks.read_pid(hooks.run_files(env))
    assert pid is not None
    return pid


def test_start_twice_gives_one_manager_then_stop_reaps_it(
    env: dict[str, str], procs: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = start(env, capsys)
    assert code == 0, out
    pid = manager_pid(env)
    procs.append(pid)
    assert f"started manager pid {pid}" in out
    assert hooks.port_open("127.0.0.1", int(env["MS_RECOVER_PORT"]))
    assert hooks.run_files(env).log.exists()
    environ = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert b"MS_RECOVER_AUTOSTART=0" in environ  # no recursive autostart in the manager

    code, out = start(env, capsys)
    assert code == 0
    assert f"reusing manager pid {pid}" in out
    assert manager_pid(env) == pid

    assert hooks.main(["stop"], env) == 0
    assert not hooks.is_alive(pid)
    assert not hooks.run_files(env).pid.exists()
    assert not hooks.port_open("127.0.0.1", int(env["MS_RECOVER_PORT"]))
    assert hooks.main(["stop"], env) == 0
    assert hooks.main(["status"], env) == hooks.NOT_RUNNING


def test_concurrent_starts_share_one_manager(env: dict[str, str], procs: list[int]) -> None:
    command = [sys.executable, "-m", "ms_recover", "hook", "start"]
    runs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [run.communicate(timeout=DEADLINE_S * 2)[0] for run in runs]
    procs.append(manager_pid(env))
    assert [run.returncode for run in runs] == [0, 0]
    pids = {int(m) for out in outputs for m in re.findall(r"manager pid (\d+)", out)}
    assert pids == {manager_pid(env)}, hooks.run_files(env).log.read_text()[-3000:]
    assert sum("started manager" in out for out in outputs) == 1


def test_stop_escalates_to_sigkill(env: dict[str, str], procs: list[int]) -> None:
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time; signal.signal(signal.SIGTERM, "
            "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)",
            "ms_recover-stub",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    procs.append(stubborn.pid)
    assert stubborn.stdout is not None and stubborn.stdout.readline() == "ready\n"
    files = hooks.run_files(env)
    files.directory.mkdir(parents=True)
    files.pid.write_text(f"{stubborn.pid}\n")
    assert hooks.main(["stop", "--timeout", "0.2"], env) == 0
    # It ignores SIGTERM, so only the SIGKILL after the deadline can have ended it.
    assert not hooks.is_alive(stubborn.pid)
    assert not hooks.run_files(env).pid.exists()


def test_stale_pid_file_is_not_trusted(
    env: dict[str, str], procs: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    files = hooks.run_files(env)
    files.directory.mkdir(parents=True)
    files.pid.write_text(f"{os.getpid()}\n")  # alive, but not a manager
    assert hooks.main(["stop"], env) == 0
    assert "nothing to stop" in capsys.readouterr().out
    code, out = start(env, capsys)
    procs.append(manager_pid(env))
    assert code == 0 and "started manager" in out
    assert manager_pid(env) != os.getpid()


def test_not_the_scheduler_pod_does_nothing(
    env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    env.update(MS_SCHED_HOST="10.0.0.1", POD_IP="10.0.0.2", MS_ROLE="MS_WORKER")
    code, out = start(env, capsys)
    assert code == 0
    assert out.strip().splitlines() == [
        "ms_recover hook: not the scheduler pod (MS_SCHED_HOST=10.0.0.1 != POD_IP=10.0.0.2): "
        "nothing to start"
    ]
    assert not hooks.run_files(env).directory.exists()


def test_missing_env_is_explained_and_nothing_starts(
    env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    del env["MS_SCHED_HOST"], env["POD_IP"]
    code = hooks.main(["start"], env)
    err = capsys.readouterr().err
    assert code == 0
    assert "MS_SCHED_HOST and POD_IP not set and MS_ROLE is unset (not MS_SCHED)" in err
    assert "not starting the manager" in err
    assert not hooks.run_files(env).directory.exists()


def test_manager_that_dies_at_start_is_reported(
    env: dict[str, str], procs: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    env["MS_RECOVER_NODE_NUMS"] = "abc"
    code, out = start(env, capsys)
    procs.append(manager_pid(env))
    assert code == 1
    assert "exited before listening on 127.0.0.1" in out
    assert "MS_RECOVER_NODE_NUMS='abc' is not an integer" in out  # the log tail


def test_placement_rules() -> None:
    assert hooks.placement({"MS_ROLE": "MS_SCHED"}).is_scheduler
    assert hooks.placement({"MS_SCHED_HOST": "1.2.3.4", "POD_IP": "1.2.3.4"}).is_scheduler
    assert not hooks.placement({"MS_SCHED_HOST": "1.2.3.4", "POD_IP": "1.2.3.5"}).is_scheduler
    assert hooks.placement({"POD_IP": "1.2.3.4"}).missing == ("MS_SCHED_HOST",)
    assert hooks.run_files({"MINDX_TASK_ID": "../a b"}).directory == pathlib.Path(
        "/tmp/ms-recover/_a_b"
    )


def test_shell_hook_and_train_start(env: dict[str, str], tmp_path: pathlib.Path) -> None:
    """train_start.sh under `set -euo pipefail`: manager up while the agent runs, the agent's
    exit status becomes the script's, and the EXIT trap stops the manager."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    agent = fake_bin / "ms-recover"
    agent.write_text(
        '#!/usr/bin/env bash\necho "agent $*"\n'
        f'"{sys.executable}" -m ms_recover hook status\nexit 86\n'
    )
    agent.chmod(0o755)
    env.update(MS_RECOVER_PYTHON=sys.executable, MS_NODE_RANK="0", PATH=f"{fake_bin}:{env['PATH']}")
    result = subprocess.run(
        ["bash", str(TRAIN_START), "--lr", "0.1"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S * 2,
    )
    pid = int(re.findall(r"started manager pid (\d+)", result.stdout)[0])
    assert result.returncode == 86, result.stderr
    assert "agent agent --node-rank 0 -- python train.py --lr 0.1" in result.stdout
    assert f"manager pid {pid} running, accepting connections" in result.stdout
    assert f"stopped manager pid {pid}" in result.stdout
    assert not hooks.is_alive(pid)


def test_autostart_no_op_paths(env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    for extra in (
        {},
        {"MS_RECOVER_AUTOSTART": "1", "MS_ROLE": "MS_WORKER"},
        {"MS_RECOVER_AUTOSTART": "0", "MS_ROLE": "MS_SCHED"},
    ):
        assert autostart.maybe_start({**env, **extra}) is False
    assert not hooks.run_files(env).directory.exists()
    blocked = pathlib.Path(env["MS_RECOVER_RUN_DIR"])
    blocked.write_text("a file where the run directory should be")
    on = {**env, "MS_RECOVER_AUTOSTART": "1", "MS_ROLE": "MS_SCHED"}
    assert autostart.maybe_start(on) is False  # fails, but never raises
    assert "ms_recover autostart: warning: manager not started" in capsys.readouterr().err


def test_pth_autostart_from_a_scheduler_process(
    env: dict[str, str], procs: list[int], tmp_path: pathlib.Path
) -> None:
    site_dir = tmp_path / "site"
    assert hooks.main(["install-pth", "--site-dir", str(site_dir)]) == 0
    assert (site_dir / hooks.PTH_NAME).read_text() == hooks.PTH_LINE
    env.update(MS_RECOVER_AUTOSTART="1", MS_ROLE="MS_SCHED")
    scheduler = [sys.executable, "-c", f"import site; site.addsitedir({str(site_dir)!r})"]
    runs = [
        subprocess.run(
            scheduler, env=env, check=True, timeout=DEADLINE_S, capture_output=True, text=True
        )
        for _ in range(2)
    ]
    pid = manager_pid(env)
    procs.append(pid)
    # The second "scheduler process" finds the first one's manager alive and spawns none.
    assert [r.stderr.count("started manager pid") for r in runs] == [1, 0]
    port = int(env["MS_RECOVER_PORT"])
    wait_for(lambda: hooks.port_open("127.0.0.1", port), "the autostarted manager's port")
    assert hooks.main(["stop"], env) == 0
    assert not hooks.is_alive(pid)


def test_python_m_ms_recover_hook_imports_only_the_hook(env: dict[str, str]) -> None:
    """The hook script's ``python -m ms_recover hook CMD`` is ``ms-recover hook CMD``, and it
    imports the hook's module alone, not the manager, the agent, the demo or the bench."""
    code = (
        "import sys\n"
        "from ms_recover import cli\n"
        "status = cli.main(['hook', 'status'])\n"
        "print(status, *sorted(m for m in sys.modules if m.startswith('ms_recover.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    status, *loaded = out.stdout.splitlines()[-1].split()
    assert int(status) == hooks.NOT_RUNNING, out.stderr
    assert "ms_recover.integrations.hook.command" in loaded
    heavy = ("ms_recover.manager", "ms_recover.agent", "ms_recover.bench", "ms_recover.demo")
    assert [m for m in loaded if m.startswith(heavy)] == []
    by_module = subprocess.run(
        [sys.executable, "-m", "ms_recover", "hook", "status"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert by_module.returncode == hooks.NOT_RUNNING
    assert "no manager running" in by_module.stdout + by_module.stderr
