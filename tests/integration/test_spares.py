"""Pre-warmed spares: the pool hands a rank's environment to a waiting process, or frees it."""

from __future__ import annotations

import os
import subprocess
import sys
import types

from ms_recover import env as E
from ms_recover.agent import spares
from ms_recover.agent.ranks import RANK_IDENTITY, rank_env, spare_env
from ms_recover.agent.spares import SparePool
from ms_recover.bench.jobdriver import _is_warm_spare
from ms_recover.comm.local import LocalBackend
from ms_recover.config import JobConfig
from ms_recover.localrun.wait import wait_for
from ms_recover.worker.session import Session

SPARE = [
    sys.executable,
    "-c",
    (
        "import os, sys\n"
        "from ms_recover.worker.spare import await_assignment\n"
        "print('warm', flush=True)\n"
        "if not await_assignment(lambda: print('compiled', flush=True)): sys.exit(3)\n"
        "fd = 'fd' if 'MS_RECOVER_SPARE_FD' in os.environ else ''\n"
        "print('rank', os.environ['RANK_ID'], fd)\n"
    ),
]
# A spare that, once it has a rank, commits its first step when the file GO appears, then
# trains until the file STOP appears.
SETTLING_SPARE = [
    sys.executable,
    "-c",
    (
        "import os, sys, time\n"
        "from ms_recover.worker.spare import await_assignment, settled\n"
        "if not await_assignment(): sys.exit(3)\n"
        "while not os.path.exists(os.environ['GO']): time.sleep(0.01)\n"
        "settled()\n"
        "while not os.path.exists(os.environ['STOP']): time.sleep(0.01)\n"
    ),
]


def _pool(count: int, command: list[str] = SPARE) -> SparePool:
    return SparePool(command, {"PATH": "/usr/bin:/bin"}, count, subprocess.PIPE, lambda: None)


def test_an_activated_spare_takes_the_rank_environment():
    pool = _pool(1)
    pool.fill()
    proc = pool.activate({"RANK_ID": "5"})
    assert proc is not None
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    # The warm-up ran before the wait, and the fd variables are consumed.
    assert out.decode().split("\n")[:3] == ["warm", "compiled", "rank 5 "]
    pool.fill()  # a new spare replaces the used one
    assert len(pool.spares) == 1
    pool.close()
    assert pool.spares == []


def test_unused_spares_exit_when_released_and_dead_ones_are_skipped():
    pool = _pool(2)
    pool.fill()
    first, second = (s.proc for s in pool.spares)
    first.kill()
    first.wait()
    proc = pool.activate({"RANK_ID": "1"})
    assert proc is second  # the dead spare was skipped
    proc.communicate(timeout=30)
    pool.close()
    assert pool.activate({"RANK_ID": "2"}) is None


def test_released_spare_exits_without_training():
    pool = _pool(1)
    pool.fill()
    (spare,) = pool.spares
    pool.close()
    assert spare.proc.returncode == 3


def test_a_spare_is_seen_warm_only_while_it_waits_for_its_rank():
    pool = _pool(1)
    pool.fill()
    (spare,) = pool.spares
    pid = spare.proc.pid
    try:
        wait_for(lambda: _is_warm_spare(pid, {os.getpid()}), 30, "the spare blocked on its pipe")
        assert not _is_warm_spare(pid, {pid})  # not a child of that parent
        proc = pool.activate({"RANK_ID": "4"})
        assert proc is not None and not _is_warm_spare(pid, {os.getpid()})
        proc.communicate(timeout=30)
        assert not _is_warm_spare(pid, {os.getpid()})  # gone
    finally:
        pool.close()


def test_a_process_blocked_on_a_pipe_without_a_spare_fd_is_not_a_spare():
    read, write = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.read({read}, 1)"], pass_fds=(read,)
    )
    try:
        wait_for(
            lambda: "pipe_read" in open(f"/proc/{proc.pid}/wchan").read(), 30, "a blocked read"
        )
        assert not _is_warm_spare(proc.pid, {os.getpid()})
    finally:
        os.write(write, b"x")
        proc.wait(timeout=30)
        os.close(read)
        os.close(write)


def test_an_ordinary_rank_process_does_not_run_the_spare_warm_up():
    code = (
        "from ms_recover.worker.spare import await_assignment\n"
        "assert await_assignment(lambda: print('compiled'))\n"
        "print('rank')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, check=True, timeout=30
    ).stdout
    assert out.decode().split() == ["rank"]


def test_the_pool_refills_only_once_the_taken_spare_committed_its_first_step(tmp_path):
    go, stop = tmp_path / "go", tmp_path / "stop"
    pool = _pool(1, SETTLING_SPARE)
    pool.fill()
    proc = pool.activate({"RANK_ID": "1", "GO": str(go), "STOP": str(stop)})
    assert proc is not None
    try:
        pool.fill()  # what the agent does right after a takeover: too early
        pool.poll()
        assert pool.spares == [] and len(pool.settling) == 1
        go.touch()  # its first commit

        def refilled() -> bool:
            pool.poll()
            return len(pool.spares) == 1

        wait_for(refilled, 30, "a new spare after the first commit")
        assert proc.poll() is None  # settled by its byte, not by exiting
        assert pool.settling == []
    finally:
        stop.touch()
        proc.wait(timeout=30)
        pool.close()


def test_a_spare_that_never_commits_is_settled_by_the_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(spares, "SETTLE_TIMEOUT_S", 0.0)
    stop = tmp_path / "stop"
    pool = _pool(1, SETTLING_SPARE)
    pool.fill()
    proc = pool.activate({"RANK_ID": "1", "GO": str(tmp_path / "never"), "STOP": str(stop)})
    assert proc is not None
    try:
        pool.poll()
        assert len(pool.spares) == 1 and proc.poll() is None
    finally:
        stop.touch()
        proc.kill()
        proc.wait(timeout=30)
        pool.close()


def test_a_spare_sees_the_job_environment_but_no_rank_identity():
    config = JobConfig(job_id="j", node_nums=2, proc_per_node=2, node_rank=1)
    env = spare_env(config)
    assert env[E.RANK_SIZE] == "4" and env[E.NODE_RANK] == "1" and env[E.TASK_ID] == "j"
    assert not set(RANK_IDENTITY) & set(env)
    assert set(env) | set(RANK_IDENTITY) == set(rank_env(config, 2, 0))


def test_the_first_commit_callback_runs_once():
    session = Session(JobConfig(), 0, LocalBackend(), standalone=True)
    session.connect()
    calls = []
    session.on_first_commit = lambda: calls.append(1)
    for step in session.steps(3):
        assert step >= 0
    assert calls == [1] and session.committed == 2


def test_a_spare_blocked_reading_another_pipe_is_not_warm_yet():
    # A spare's warm-up (MindSpore compiling) blocks in short reads of other pipes; only the
    # read of its assignment pipe means it is ready for a rank.
    (assignment, unused), (read, write) = os.pipe(), os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.read({read}, 1); os.read({assignment}, 1)"],
        pass_fds=(read, assignment),
        env={**os.environ, E.SPARE_FD: str(assignment)},
    )
    try:
        wait_for(
            lambda: "pipe_read" in open(f"/proc/{proc.pid}/wchan").read(), 30, "a blocked read"
        )
        assert not _is_warm_spare(proc.pid, {os.getpid()})
        os.write(write, b"x")  # now it reads its assignment pipe: warm
        wait_for(lambda: _is_warm_spare(proc.pid, {os.getpid()}), 30, "the assignment read")
    finally:
        os.write(unused, b"x")
        os.write(write, b"x")
        proc.wait(timeout=30)
        for fd in (assignment, unused, read, write):
            os.close(fd)


def test_a_waiting_spare_that_dies_is_replaced_after_a_pause_that_doubles(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(spares, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    pool = _pool(1)
    pool.fill()
    try:
        first = pool.spares[0].proc
        first.kill()
        first.wait()
        pool.poll()  # seen dead: a new one after RESPAWN_MIN_S
        assert [s.proc for s in pool.spares] == [first] and pool.respawns == 0
        clock[0] += spares.RESPAWN_MIN_S
        pool.poll()
        second = pool.spares[0].proc
        assert second is not first and second.poll() is None and pool.respawns == 1
        second.kill()
        second.wait()
        pool.poll()  # died early again: twice the pause
        clock[0] += spares.RESPAWN_MIN_S
        pool.poll()
        assert pool.spares[0].proc is second, "still pausing"
        clock[0] += spares.RESPAWN_MIN_S
        pool.poll()
        third = pool.spares[0].proc
        assert third is not second and pool.respawns == 2
        clock[0] += spares.RESPAWN_RESET_S  # this one lived long: the pause starts over
        third.kill()
        third.wait()
        pool.poll()
        clock[0] += spares.RESPAWN_MIN_S
        pool.poll()
        assert pool.spares[0].proc is not third and pool.respawns == 3
    finally:
        pool.close(kill=True)
