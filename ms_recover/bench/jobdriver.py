"""Driving a running :class:`~ms_recover.localrun.job.LocalJob` from a benchmark.

While a benchmark waits it also plays the pod supervisor (``LocalPods.poll``: reap exited pods,
recreate the ones to reschedule), which ``LocalJob.wait`` would otherwise do.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from ms_recover.env import SPARE_FD
from ms_recover.localrun.job import LocalJob
from ms_recover.localrun.wait import wait_for


class JobDriver:
    def __init__(self, job: LocalJob, timeout_s: float) -> None:
        self.job = job
        self.timeout_s = timeout_s

    def wait(self, cond: Callable[[], Any], what: str) -> Any:
        """``cond()``'s first truthy value, supervising pods meanwhile; Timeout at the deadline."""

        def check() -> Any:
            self.job.pods.poll()
            return cond()

        return wait_for(check, self.timeout_s, what)

    def steps(self) -> list[int]:
        return [r["step"] for r in self.job.status()["ranks"]]

    def until_running(self, min_step: int) -> None:
        """Wait until the job runs and every rank is ``min_step`` steps past the slowest now."""
        floor = min(self.steps()) + min_step

        def ready() -> bool:
            st = self.job.status()
            return st["state"] == "running" and all(
                r["alive"] and r["step"] >= floor for r in st["ranks"]
            )

        self.wait(ready, f"every rank running past step {floor}")

    def step_time(self, window_s: float) -> float:
        """Seconds per step over a window of steady training (slowest rank)."""
        s0, t0 = min(self.steps()), time.monotonic()
        self.wait(
            lambda: time.monotonic() - t0 >= window_s and min(self.steps()) > s0,
            "training progress",
        )
        return (time.monotonic() - t0) / (min(self.steps()) - s0)

    def new_event(self, event: str, seen: int, **match: Any) -> dict[str, Any]:
        """The first ``event`` matching ``match`` after the ``seen`` already there."""
        found = self.wait(lambda: self.job.find(event, **match)[seen:], f"{event} {match}")
        return dict(found[0])

    def count(self, event: str, **match: Any) -> int:
        return len(self.job.find(event, **match))

    def pid_of(self, rank: int) -> int:
        return int(next(r["pid"] for r in self.job.status()["ranks"] if r["rank"] == rank))

    def kill_rank(self, rank: int) -> float:
        """SIGKILL one rank process (a grandchild we started, by pid); the wall time of the kill."""
        pid = self.pid_of(rank)
        t_kill = time.time()
        os.kill(pid, signal.SIGKILL)
        return t_kill

    def warm_spares(self) -> int:
        """Spares of this job's agents ready to take a rank: blocked reading their still-open
        assignment pipe, i.e. past MindSpore's import, the model build and the program's
        warm-up (Linux ``/proc``)."""
        return len(self.warm_spare_pids())

    def warm_spare_pids(self) -> list[int]:
        return warm_spare_pids({proc.pid for proc in self.job.pods.procs.values()})

    def rank_pids(self) -> list[int]:
        return [int(r["pid"]) for r in self.job.status()["ranks"] if r.get("pid")]


def warm_spare_pids(agents: set[int]) -> list[int]:
    """Spare processes of the agents ``agents`` (pids) ready to take a rank (see
    :meth:`JobDriver.warm_spares`)."""
    return [
        int(entry)
        for entry in os.listdir("/proc")
        if entry.isdigit() and _is_warm_spare(int(entry), agents)
    ]


def _is_warm_spare(pid: int, parents: set[int]) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        if ppid not in parents:
            return False
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = dict(v.partition(b"=")[::2] for v in fh.read().split(b"\0") if v)
        fd = env.get(SPARE_FD.encode())
        with open(f"/proc/{pid}/wchan") as fh:
            blocked = "pipe_read" in fh.read()
        # Blocked reading the assignment pipe itself (the read's first argument is its fd): a
        # warm-up's compile also blocks in short pipe reads (measured), and is not ready yet.
        with open(f"/proc/{pid}/syscall") as fh:
            call = fh.read().split()
        if fd is None or len(call) < 2 or int(call[1], 16) != int(fd):
            return False
        return blocked and os.path.exists(f"/proc/{pid}/fd/{int(fd)}")
    except (OSError, ValueError, IndexError):
        return False  # gone meanwhile, or not ours to read
