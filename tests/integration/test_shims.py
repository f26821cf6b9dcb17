"""The opt-in shim directory: never on sys.path by default, MindCluster's taskd.api surface,
a real taskd never shadowed silently, and the scheduler process that must not train."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ms_recover import env as E
from ms_recover.cli import main
from ms_recover.integrations import shims
from ms_recover.localrun.msrunjob import free_port
from ms_recover.localrun.wait import wait_for

pytestmark = pytest.mark.timeout(60)

#: MindCluster's taskd.api.__all__ (Ascend/mind-cluster, component/taskd/taskd/api/__init__.py).
MINDCLUSTER_ALL = [
    "init_taskd_manager",
    "start_taskd_manager",
    "init_taskd_worker",
    "start_taskd_worker",
    "init_taskd_agent",
    "start_taskd_agent",
    "register_func",
    "init_taskd_proxy",
    "destroy_taskd_proxy",
]


def _python(code: str, pythonpath: str = "", timeout: float = 30, **env: str):
    full = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", E.ROLE)}
    full.update(env)
    if pythonpath:
        full["PYTHONPATH"] = pythonpath
    return subprocess.run(
        [sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=timeout
    )


def test_shim_path_prints_the_directory_holding_taskd(capsys):
    assert main(["shim-path"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == shims.path() and (Path(printed) / "taskd" / "api").is_dir()


def test_taskd_is_not_importable_without_the_opt_in():
    done = _python("import taskd")
    assert done.returncode == 1 and "No module named 'taskd'" in done.stderr


def test_every_name_of_mindclusters_taskd_api_is_there():
    code = (
        "import taskd.api as a; import json; "
        "print(json.dumps([a.__all__, [callable(getattr(a, n)) for n in a.__all__]]))"
    )
    done = _python(code, shims.path())
    assert done.returncode == 0, done.stderr
    names, ok = __import__("json").loads(done.stdout)
    assert names == MINDCLUSTER_ALL and all(ok)


def test_worker_and_proxy_calls_say_what_ms_recover_does_instead():
    code = (
        "from taskd.api import *; "
        "print(init_taskd_worker(0), start_taskd_worker(), init_taskd_proxy({}), "
        "destroy_taskd_proxy())"
    )
    done = _python(code, shims.path())
    assert done.stdout.split() == ["False"] * 4
    assert "a training process joins recovery through ms_recover.init()" in done.stderr
    assert "ms_recover needs no TaskD proxy" in done.stderr


def test_a_real_taskd_later_on_the_path_is_named_not_silently_shadowed(tmp_path):
    other = tmp_path / "site" / "taskd"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("REAL = True\n")
    path = f"{shims.path()}:{tmp_path / 'site'}"
    done = _python("import taskd; print(hasattr(taskd, 'REAL'))", path)
    assert done.stdout.strip() == "False"  # the shim wins: it is first on sys.path
    assert f"shadows the taskd at {other}" in done.stderr
    assert "PYTHONPATH precedes site-packages" in done.stderr
    cli = subprocess.run(
        [sys.executable, "-m", "ms_recover.cli", "shim-path"],
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert cli.stdout.strip() == shims.path()
    assert f"taskd is also installed at {other}" in cli.stderr


def test_taskd_process_enable_off_starts_no_manager():
    port = free_port()
    code = (
        "from taskd.api import init_taskd_manager, start_taskd_manager; "
        "init_taskd_manager({'job_id': 'j', 'node_nums': 1, 'proc_per_node': 1}); "
        "print(start_taskd_manager())"
    )
    done = _python(code, shims.path(), TASKD_PROCESS_ENABLE="off", MS_RECOVER_PORT=str(port))
    assert done.returncode == 0 and done.stdout.strip() == "0"
    assert "TASKD_PROCESS_ENABLE=off" in done.stderr


TRAIN = "import ms_recover; ms_recover.init(); print('TRAINED')"


@pytest.mark.parametrize(
    "env",
    [
        {},
        {E.AUTOSTART: "1", E.POD_IP: "127.0.0.2", E.SCHED_HOST: "127.0.0.1"},
    ],
)
def test_the_scheduler_process_never_trains(env):
    done = _python(TRAIN, **{E.ROLE: E.ROLE_SCHED, E.AUTOSTART: "0", **env})
    assert done.returncode == 0 and "TRAINED" not in done.stdout
    assert "does not train and hosts no manager" in done.stderr


def test_the_scheduler_process_hosts_the_manager_under_autostart(tmp_path):
    port = free_port()
    env = {
        **os.environ,
        E.ROLE: E.ROLE_SCHED,
        E.AUTOSTART: "1",
        E.POD_IP: "127.0.0.1",
        E.SCHED_HOST: "127.0.0.1",
        E.PORT: str(port),
        "MS_RECOVER_RUN_DIR": str(tmp_path),
    }
    proc = subprocess.Popen([sys.executable, "-c", TRAIN], env=env, stdout=subprocess.PIPE)
    try:
        wait_for(lambda: _listening(port), 30, "the manager's port")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert b"TRAINED" not in out


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_worker_dies_with_its_msrun():
    """bind_to_launcher: the kernel kills the worker when its launcher dies."""
    child = (
        "from ms_recover.integrations.msrun.sched_process import bind_to_launcher; "
        "import os, time; "
        "bind_to_launcher(os.environ); print('bound', flush=True); time.sleep(60)"
    )
    launcher = (
        "import os, subprocess, sys, time; "
        f"env = dict(os.environ, {E.LAUNCHER_PID}=str(os.getpid())); "
        f"p = subprocess.Popen([sys.executable, '-c', {child!r}], env=env, start_new_session=True);"
        " print(p.pid, flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(proc.stdout.readline())
        assert proc.stdout.readline().strip() == "bound"
    finally:
        proc.kill()
        proc.wait()
    wait_for(lambda: not _cmdline(worker), 20, "the worker to die with its launcher")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_a_worker_whose_launcher_is_already_gone_exits():
    code = (
        "from ms_recover.integrations.msrun.sched_process import bind_to_launcher; import os; "
        "bind_to_launcher(os.environ); print('ran')"
    )
    done = _python(code, **{E.LAUNCHER_PID: "1"})  # pid 1 is not our parent
    assert done.returncode == 1 and "ran" not in done.stdout
