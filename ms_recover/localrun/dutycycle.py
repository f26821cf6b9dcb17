"""A fail-slow fault injected from outside the rank: a duty-cycled SIGSTOP/SIGCONT.

:class:`DutyCycle` stops the processes a ``targets`` callable names for ``stop_s`` of every
``period_s`` (a thread of the test or the demo, the harness's fault injector). A rank stopped a
third of the time runs at two thirds of its speed: its CPU work and any wait made of short
sleeps take 1.5x as long, and it reports that as compute time (time outside collectives), so
the fail-slow rule flags it. Its heartbeat thread stops too, for ``stop_s`` at a time: far
below any silence limit.

The targets are looked up again every ``refresh_s``: the slowness can belong to a pod (the
ranks its agent started, :func:`pod_rank_pids`), so a rank restarted in the same pod is slowed
again and one moved to a new pod is not. :meth:`DutyCycle.stop` (and leaving the ``with``
block) sends SIGCONT to every process it stopped, so nothing is left stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable


class DutyCycle:
    """Stop ``targets()`` for ``stop_s`` of every ``period_s`` until :meth:`stop`."""

    def __init__(
        self,
        targets: Callable[[], list[int]],
        stop_s: float = 0.004,
        period_s: float = 0.012,
        refresh_s: float = 0.5,
    ) -> None:
        if not 0 < stop_s < period_s:
            raise ValueError(f"stop_s {stop_s} must be in (0, period_s {period_s})")
        self.targets = targets
        self.stop_s, self.period_s, self.refresh_s = stop_s, period_s, refresh_s
        self.cycles = 0  # stop/cont cycles done (a test can check the fault ran)
        self.errors = 0  # lookups of the targets that failed (the last targets are kept)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="duty-cycle", daemon=True)

    def start(self) -> DutyCycle:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)

    def __enter__(self) -> DutyCycle:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        pids: list[int] = []
        looked = -self.refresh_s
        while not self._done.is_set():
            now = time.monotonic()
            if now - looked >= self.refresh_s:
                pids, looked = self._lookup(pids), now
            stopped = _signal(pids, signal.SIGSTOP)
            try:
                time.sleep(self.stop_s)
            finally:
                _signal(stopped, signal.SIGCONT)  # never leave a process stopped
            self.cycles += 1
            self._done.wait(self.period_s - self.stop_s)

    def _lookup(self, last: list[int]) -> list[int]:
        """The targets now; the last ones if the lookup fails (a status query that timed out
        on a loaded host must not end the fault)."""
        try:
            return self.targets()
        except Exception:
            self.errors += 1
            return last


def _signal(pids: list[int], sig: int) -> list[int]:
    """Send ``sig`` to each of ``pids`` that still exists; those it reached."""
    reached = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
            reached.append(pid)
    return reached


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (Linux /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
            # Field 4 (ppid) follows the command in parentheses, which may hold spaces.
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def pod_rank_pids(agent_pid: int, rank_pid: Callable[[], int]) -> list[int]:
    """The rank's process (``rank_pid()``: its registered pid) if the agent ``agent_pid`` (one
    pod's) started it; else none: the slowness stays with that pod."""
    pid = rank_pid()
    return [pid] if pid > 0 and pid in children(agent_pid) else []
