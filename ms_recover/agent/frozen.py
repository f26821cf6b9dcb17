"""Ranks stopped by a signal, as their agent sees them (docs/design.md §1e).

A process stopped by SIGSTOP (or SIGTSTP, SIGTTIN, SIGTTOU) runs nothing, its heartbeat thread
included, until someone continues it: to the manager it is only a silent rank, and a silent
rank is declared after ``rank_silence_s`` (10 s) because a heartbeat thread can be starved for
seconds. Its agent can tell the two apart: the kernel says the process is stopped
(``/proc/PID/stat``, state ``T``). :class:`FreezeWatch` samples the state of each rank the
agent started; a rank that stayed stopped for ``JobConfig.frozen_s`` (two heartbeats) is
reported once (:class:`~ms_recover.protocol.messages.RankFrozen`), and the manager declares a
hang naming it, without waiting for the others to stall.

"Stayed stopped" is not "seen stopped at every sample": a rank stopped and continued many times
a second (a fail-slow rank, as the duty-cycled SIGSTOP of the test kit makes one) is seen in
state ``T`` at a run of samples now and then. So while a process is stopped its main thread's
count of times it was scheduled (``/proc/PID/schedstat``; the context switches of
``/proc/PID/status`` where that is missing) must not move either: a continue wakes every thread
of the process, the main one included, whatever it was blocked in.

Not a stop: state ``t`` (stopped by a tracer: a debugger at a breakpoint, py-spy's sample),
which someone chose; a process in uninterruptible sleep (``D``: a stuck driver call) is not
judged here either (the manager's adaptive hang rule names it when its peers wait for it).
Linux only: where ``/proc`` cannot be read, nothing is reported and the other rules apply.
"""

from __future__ import annotations

from collections.abc import Callable

STOPPED = "T"  # job-control stop; 't' (a tracer's stop) is left alone
SAMPLE_S = 0.1  # how often the states are read: one small /proc read per rank


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def process_state(pid: int) -> str:
    """The one-letter state of process ``pid`` (``R``, ``S``, ``T``...), or '' if unknown."""
    # "pid (comm) state ...": comm may hold spaces and parentheses, so split at the last ')'.
    fields = _read(f"/proc/{pid}/stat").rpartition(b")")[2].split(None, 1)
    return fields[0].decode("ascii", "replace") if fields else ""


def times_run(pid: int) -> int:
    """How many times the main thread of ``pid`` was scheduled so far, or -1 if unknown."""
    fields = _read(f"/proc/{pid}/schedstat").split()
    if len(fields) == 3 and fields[2].isdigit():
        return int(fields[2])
    lines = _read(f"/proc/{pid}/status").splitlines()
    switches = [int(line.split()[1]) for line in lines if b"ctxt_switches:" in line]
    return sum(switches) if len(switches) == 2 else -1


def probe(pid: int) -> tuple[str, int]:
    """The state of ``pid`` and, when it is stopped, :func:`times_run` (else -1)."""
    state = process_state(pid)
    return state, times_run(pid) if state == STOPPED else -1


class FreezeWatch:
    """Which ranks have stayed stopped for ``limit_s``: each stop reported once per process."""

    def __init__(
        self,
        limit_s: float,
        every_s: float = SAMPLE_S,
        read: Callable[[int], tuple[str, int]] = probe,
    ) -> None:
        self.limit_s = limit_s
        self.every_s = every_s
        self._probe = read
        # pid -> (since when it has been stopped, its main thread's times_run then)
        self._since: dict[int, tuple[float, int]] = {}
        self._told: set[int] = set()  # pids reported for their current stop
        self._next = 0.0

    def sample(self, pids: dict[int, int], now: float) -> list[tuple[int, int, float]]:
        """``(rank, pid, stopped_s)`` of each rank stopped for ``limit_s`` and not yet
        reported, given each rank's pid; at most one read per ``every_s``."""
        if now < self._next:
            return []
        self._next = now + self.every_s
        live = set(pids.values())
        for gone in [p for p in self._since if p not in live]:
            del self._since[gone]
            self._told.discard(gone)
        out = []
        for rank, pid in pids.items():
            state, ran = self._probe(pid)
            since = self._since.get(pid)
            if state != STOPPED or ran < 0 or since is None or since[1] != ran:
                self._told.discard(pid)  # continued since: a later stop is a new one
                if state == STOPPED and ran >= 0:
                    self._since[pid] = (now, ran)
                else:
                    self._since.pop(pid, None)
                continue
            stopped_s = now - since[0]
            if stopped_s >= self.limit_s and pid not in self._told:
                self._told.add(pid)
                out.append((rank, pid, stopped_s))
        return out
