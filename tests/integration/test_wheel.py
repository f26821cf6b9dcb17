"""The release artefact works on its own (issue 29, item 1): ``python -m build`` makes an sdist
and a wheel; the wheel, installed into a fresh venv with no checkout on the path, carries the
hook script and the shims, starts the manager through the hook, and runs a numpy job through
a fault and its recovery. Slow: the build alone takes tens of seconds."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import zipfile
from collections.abc import Iterator

import pytest
import zmq

from ms_recover.localrun.faults import Faults

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pathlib.Path]:
    """A fresh venv with only the built wheel installed (its dependencies, but not ms_recover,
    come from this interpreter's site-packages through a .pth)."""
    tmp = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(tmp / "dist"), str(ROOT)],
        cwd=tmp,  # not the checkout: its build/ directory (pip's) would shadow the package
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    (wheel,) = (tmp / "dist").glob("*.whl")
    assert list((tmp / "dist").glob("*.tar.gz")), "no sdist built"
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "v")], check=True, timeout=120)
    py = tmp / "v" / "bin" / "python"
    subprocess.run(
        [py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        timeout=120,
    )
    deps = pathlib.Path(zmq.__file__).resolve().parents[1]
    purelib = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    pathlib.Path(purelib, "deps-from-test.pth").write_text(f"{deps}\n")
    # The dependencies' directory may hold an installed ms_recover too (a non-editable install,
    # as in CI): .pth directories come after the venv's own, so the wheel's copy must win.
    where = subprocess.run(
        [py, "-c", "import ms_recover; print(ms_recover.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp,
    ).stdout.strip()
    assert where.startswith(purelib), where
    yield tmp


def _env(tmp: pathlib.Path, **extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("MS_", "PYTHON", "MINDX"))}
    return {**keep, "PATH": f"{tmp / 'v' / 'bin'}:{keep['PATH']}", **extra}


def test_the_wheel_carries_the_hook_and_the_shims_and_pins_no_numpy(venv: pathlib.Path) -> None:
    (wheel,) = (venv / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "ms_recover/integrations/hook/ms_recover_hook.sh" in names
    assert "ms_recover/integrations/shims/taskd/api/taskd_agent_api.py" in names
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    pins = [line for line in meta.splitlines() if line.startswith("Requires-Dist: numpy")]
    assert all("<" not in p or "extra ==" in p for p in pins), pins
    env = _env(venv)
    where = subprocess.run(
        ["ms-recover", "hook-path"], cwd=venv, env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert where.startswith(str(venv / "v")) and where.endswith("ms_recover_hook.sh")
    shims = subprocess.run(
        ["ms-recover", "shim-path"], cwd=venv, env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert pathlib.Path(shims, "taskd").is_dir() and shims.startswith(str(venv / "v"))
    version = subprocess.run(
        ["ms-recover", "--version"], cwd=venv, env=env, capture_output=True, text=True, check=True
    )
    assert version.stdout.startswith("ms-recover ")


def test_the_hook_and_a_job_run_from_the_wheel(venv: pathlib.Path) -> None:
    run_dir, out = venv / "run", venv / "out"
    env = _env(
        venv,
        MS_SCHED_HOST="127.0.0.1",
        POD_IP="127.0.0.1",
        MINDX_TASK_ID="wheeljob",
        MS_RECOVER_NODE_NUMS="1",
        MS_LOCAL_WORKER="2",
        MS_RECOVER_PORT=str(_free_port()),
        MS_RECOVER_RUN_DIR=str(run_dir),
        MS_RECOVER_PYTHON=str(venv / "v" / "bin" / "python"),
        MS_RECOVER_STRATEGY="recover-in-place,exit",
        OPENBLAS_NUM_THREADS="1",
    )
    start = subprocess.run(
        ["bash", "-c", 'source "$(ms-recover hook-path)"'],
        cwd=venv,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    pid = int((run_dir / "manager.pid").read_text().split()[0])
    try:
        assert start.returncode == 0, start.stderr
        agent = subprocess.run(
            [
                *"ms-recover agent --node-rank 0 --node-nums 1 --proc-per-node 2 --".split(),
                str(venv / "v" / "bin" / "python"),
                "-m",
                "ms_recover.localrun.numpy_trainer",
                "--steps",
                "20",
                "--out",
                str(out),
            ],
            cwd=venv,
            env={**env, **Faults().kill(rank=1, step=6).to_env()},
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert agent.returncode == 0, agent.stderr[-3000:]
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        recoveries = [e for e in events if e["event"] == "recovery"]
        assert recoveries and all(e["ok"] for e in recoveries), recoveries
        files = {e["event"] for e in events}
        assert "fault" in files
    finally:
        stop = subprocess.run(
            ["bash", "-c", 'source "$(ms-recover hook-path)"; ms_recover_hook_stop'],
            cwd=venv,
            env={**env, "MS_RECOVER_HOOK_AUTOSTART": "0"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            pass
        else:
            os.kill(pid, signal.SIGKILL)
    assert stop.returncode == 0, stop.stderr
