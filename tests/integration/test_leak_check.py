"""The suite's leak check (tests/conftest.py ``no_leaks``) fails a test for each kind of leak,
names what leaked, and leaves the next test a clean process; the tiers' markers follow the
directory. Run as a pytest of its own in a fresh interpreter, on a copy of the conftest."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

HERE = pathlib.Path(__file__).resolve().parents[1]

PROBE = """
import signal, socket, subprocess, sys, threading

_keep = []


def test_a_thread():
    stop = threading.Event()
    _keep.append(stop)
    threading.Thread(target=stop.wait, args=(60,), name="leaky-thread", daemon=True).start()


def test_a_handler():
    signal.signal(signal.SIGTERM, lambda signum, frame: None)


def test_b_handler_is_back():
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_child():
    _keep.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))


def test_a_socket():
    _keep.append(socket.socket())


def test_a_restored_handler_and_a_joined_thread():
    old = signal.signal(signal.SIGINT, lambda signum, frame: None)
    worker = threading.Thread(target=lambda: None)
    worker.start()
    worker.join()
    signal.signal(signal.SIGINT, old)
"""


def test_each_leak_fails_its_test_and_names_what_leaked(tmp_path: pathlib.Path) -> None:
    tier = tmp_path / "tests" / "integration"
    tier.mkdir(parents=True)
    shutil.copy(HERE / "conftest.py", tmp_path / "tests" / "conftest.py")
    (tier / "test_probe.py").write_text(PROBE)
    env = {**os.environ, "MSR_TEST_LEAK_GRACE_S": "0.2"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider"]
        + ["-m", "integration", "-o", "addopts=", "--rootdir", str(tmp_path), str(tier)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "6 passed, 4 errors" in text, text
    assert "test_a_thread leaked: 1 thread(s) still running: leaky-thread" in text
    assert "test_a_handler leaked: signal handler(s) not restored: SIGTERM -> <function" in text
    assert "test_a_child leaked: 1 child process(es) not reaped: pid " in text
    assert "import time; time.sleep(60)" in text
    assert "test_a_socket leaked: 1 socket(s) left open: socket:[" in text
    for clean in ("test_b_handler_is_back", "test_a_restored_handler", "test_a_child PASSED"):
        assert f"{clean} leaked" not in text
