"""Pre-warmed spares: the pool hands a rank's environment to a waiting process, or frees it."""

from __future__ import annotations

import os
import subprocess
import sys

from ms_recover.agent.spares import SparePool
from ms_recover.bench.jobdriver import _is_warm_spare
from ms_recover.testing.wait import wait_for

SPARE = [
    sys.executable,
    "-c",
    (
        "import os, sys\n"
        "from ms_recover.worker.spare import await_assignment\n"
        "print('warm', flush=True)\n"
        "if not await_assignment(): sys.exit(3)\n"
        "fd = 'fd' if 'MS_RECOVER_SPARE_FD' in os.environ else ''\n"
        "print('rank', os.environ['RANK_ID'], fd)\n"
    ),
]


def _pool(count: int) -> SparePool:
    return SparePool(SPARE, {"PATH": "/usr/bin:/bin"}, count, subprocess.PIPE, lambda: None)


def test_an_activated_spare_takes_the_rank_environment():
    pool = _pool(1)
    pool.fill()
    proc = pool.activate({"RANK_ID": "5"})
    assert proc is not None
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert out.decode().split("\n")[:2] == ["warm", "rank 5 "]  # the fd variable is consumed
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
