"""MsrunHands against msrun's own process manager (MindSpore's ``_ProcessManager``, the object
whose bound methods msrun registers as KILL_WORKER / START_ALL_WORKER / START_WORKER_LIST /
MONITOR), with tiny worker processes: every quirk of those callbacks, for real."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import pytest

from ms_recover.agent.agent import Agent
from ms_recover.agent.hands import LauncherError
from ms_recover.config import JobConfig
from ms_recover.integrations.msrun.hands import UNKNOWN_NOTE, MsrunHands
from ms_recover.localrun.msrunjob import free_port
from ms_recover.localrun.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

WORKER = """
import json, os, pathlib, sys, time
d = pathlib.Path(os.environ["HANDS_DIR"]); r = os.environ["RANK_ID"]
keys = ("RANK_ID", "MS_NODE_RANK", "MS_LOCAL_WORKER", "MS_RECOVER_INCARNATION",
        "MS_RECOVER_LAUNCHER_PID", "MS_ROLE")
(d / f"env_{os.getpid()}.json").write_text(json.dumps({k: os.environ.get(k) for k in keys}))
from ms_recover.observability import lastwords  # as ms_recover.init() does
lastwords.install(os.environ["MS_RECOVER_ERROR_FILE"])
def load_shard():
    raise RuntimeError("shard is corrupt")
while True:
    f = d / f"exit_{r}"
    if f.exists():
        if f.read_text() == "raise":
            load_shard()
        sys.exit(int(f.read_text()))
    time.sleep(0.01)
"""
CONFIG = JobConfig(job_id="hands", node_nums=2, proc_per_node=2, node_rank=1)


@pytest.fixture
def msrun(tmp_path, monkeypatch, request):
    """msrun's process manager for node 1 of 2x2, as msrun builds it from its command line
    (``indirect`` param False: msrun started without ``--node_rank``)."""
    from mindspore.parallel.cluster.process_entity import _ProcessManager
    from mindspore.parallel.cluster.run import get_args

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    saved = dict(os.environ)  # msrun writes its workers' env into os.environ
    argv = ["msrun", "--worker_num", "4", "--local_worker_num", "2"]
    if getattr(request, "param", True):
        argv += ["--node_rank", "1"]
    argv += ["--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    argv += ["--log_dir", str(tmp_path / "logs"), "python", str(script)]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.delenv("MS_ENABLE_TFT", raising=False)
    monkeypatch.setenv("HANDS_DIR", str(tmp_path))
    # msrun runs `python` from PATH: this interpreter's.
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    pm = _ProcessManager(get_args())
    try:
        yield pm
    finally:
        pm.kill_all_workers()
        for p in pm.proc_rank_map.values():
            p.wait(10)
        os.environ.clear()
        os.environ.update(saved)


def callbacks(pm, calls: list | None = None) -> dict:
    def kill(pids):
        if calls is not None:
            calls.append(list(pids))
        return pm.kill_workers(pids)

    return {
        "KILL_WORKER": kill,
        "START_ALL_WORKER": pm.start_all_workers,
        "START_WORKER_LIST": pm.start_worker_list,
        "MONITOR": pm.monitor_rank_status,
    }


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except (ProcessLookupError, FileNotFoundError):
        return True


def _crash(tmp: Path, rank: int, code: int) -> None:
    (tmp / f"exit_{rank}").write_text(str(code))


def test_a_crash_reads_pid_gone_and_is_reported_once(msrun, tmp_path):
    hands = MsrunHands(CONFIG, callbacks(msrun))
    hands.start_all([2, 3])
    pids = hands.pids()
    assert set(pids) == {2, 3}
    _crash(tmp_path, 2, 3)
    exited = wait_for(hands.poll, 20, "rank 2's exit")
    # msrun reaps the child before asking whether its pid exists: the exit code 3 is lost.
    assert msrun.monitor_rank_status([0])[0]["status"] == 300
    assert [(e.rank, e.pid, e.exit_code, e.signal) for e in exited] == [(2, pids[2], 1, 0)]
    assert hands.poll() == []
    assert hands.pids() == {3: pids[3]}


def test_a_python_exception_under_msrun_is_reported_with_its_traceback(msrun, tmp_path):
    hands = MsrunHands(CONFIG, callbacks(msrun))
    try:
        hands.start_all([2, 3])
        (tmp_path / "exit_2").write_text("raise")
        (exited,) = wait_for(hands.poll, 20, "rank 2's exit")
        assert (exited.rank, exited.exit_code, exited.signal) == (2, 1, 0)
        assert "load_shard" in exited.log_tail
        assert "RuntimeError: shard is corrupt" in exited.log_tail
        _crash(tmp_path, 3, 3)  # sys.exit(3): msrun hides the code, and we say so
        (other,) = wait_for(hands.poll, 20, "rank 3's exit")
        assert other.log_tail == UNKNOWN_NOTE and other.exit_code == 1
    finally:
        hands.close()


def test_our_kill_is_reported_by_pid_with_its_signal_and_never_again(msrun):
    hands = MsrunHands(CONFIG, callbacks(msrun))
    hands.start_all([2, 3])
    pid = hands.pids()[3]
    exited = hands.kill([3])
    assert [(e.rank, e.pid, e.exit_code, e.signal) for e in exited] == [(3, pid, 137, 9)]
    assert _gone(pid)
    assert hands.poll() == []
    assert hands.kill([3]) == []


def test_a_dead_pid_is_never_handed_to_kill_worker(msrun, tmp_path):
    calls: list = []
    hands = MsrunHands(CONFIG, callbacks(msrun, calls))
    hands.start_all([2, 3])
    pid = hands.pids()[2]
    _crash(tmp_path, 2, 5)
    wait_for(lambda: msrun.monitor_rank_status([0])[0]["status"] is not None, 20, "rank 2 ends")
    exited = hands.kill([2])  # the manager's kill arrives after the crash
    assert [(e.rank, e.pid, e.exit_code) for e in exited] == [(2, pid, 1)]
    assert calls == []  # msrun would only warn and keep a stale entry
    pid3 = hands.pids()[3]
    hands.kill([3])
    assert calls == [[pid3]]


def _env_of(tmp: Path, pid: int) -> dict:
    path = tmp / f"env_{pid}.json"
    return wait_for(lambda: path.exists() and json.loads(path.read_text()), 20, f"env of {pid}")


@pytest.mark.parametrize("msrun", [False], indirect=True)
def test_without_node_rank_each_worker_still_gets_its_own_rank(msrun, tmp_path):
    hands = MsrunHands(CONFIG, callbacks(msrun))
    hands.start_all([2, 3])
    assert {r: _env_of(tmp_path, pid)["RANK_ID"] for r, pid in hands.pids().items()} == {
        2: "2",
        3: "3",
    }


def test_a_restart_kills_the_old_process_first_and_gives_the_node_env(msrun, tmp_path):
    hands = MsrunHands(CONFIG, callbacks(msrun))
    hands.start_all([2, 3])
    old = hands.pids()[3]
    new = hands.start(3)  # msrun's START_WORKER_LIST alone would leave `old` running
    assert new != old and _gone(old)
    env = wait_for(
        lambda: (
            (tmp_path / f"env_{new}.json").exists()
            and json.loads((tmp_path / f"env_{new}.json").read_text())
        ),
        20,
        "the restarted worker's env",
    )
    assert env == {
        "RANK_ID": "3",
        "MS_NODE_RANK": "1",
        "MS_LOCAL_WORKER": "2",
        "MS_RECOVER_INCARNATION": "1",
        "MS_RECOVER_LAUNCHER_PID": str(os.getpid()),
        "MS_ROLE": "MS_WORKER",
    }
    hands.close()
    assert _gone(new) and hands.pids() == {}


def test_a_raising_callback_stops_the_node_with_one_log_line(caplog):
    def boom(*args):
        raise RuntimeError("boom")

    cbs = {"KILL_WORKER": boom, "START_ALL_WORKER": boom, "START_WORKER_LIST": boom}
    cbs["MONITOR"] = boom
    hands = MsrunHands(CONFIG.replace(manager_port=free_port()), cbs, environ={})
    with pytest.raises(LauncherError, match=r"msrun's MONITOR\(\[-1\]\) failed: RuntimeError"):
        hands._monitor()
    agent = Agent(hands.config, [], hands=hands)
    with caplog.at_level(logging.ERROR, logger="ms_recover"):
        assert agent.serve(start=True) == 1
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "START_WORKER_LIST([0]) failed: RuntimeError('boom')" in errors[0].getMessage()
    assert errors[0].exc_info is None


def test_missing_callbacks_are_named():
    with pytest.raises(LauncherError, match="no START_WORKER_LIST, MONITOR callback"):
        MsrunHands(CONFIG, {"KILL_WORKER": print, "START_ALL_WORKER": print})
