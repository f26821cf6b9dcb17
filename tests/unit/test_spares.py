"""Pre-warmed spares: the pool hands a rank's environment to a waiting process, or frees it."""

from __future__ import annotations

import subprocess
import sys

from ms_recover.agent.spares import SparePool

SPARE = [
    sys.executable,
    "-c",
    (
        "import os, sys\n"
        "from ms_recover.agent.spares import await_assignment\n"
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
