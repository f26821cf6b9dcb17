"""Up to when the manager has heard everything sent to it (``JobModel.heard_at``), so that its own
stall is never taken for its members' silence (docs/design.md §1d, "The manager's own stall").

Silence is judged as of ``heard_at`` (:func:`~ms_recover.manager.decide.detect_silence`): the
time of the manager's last read that found nothing waiting. That is sound while the process
runs. When it does not (a host starved by other work, a SIGSTOP, a VM paused), its members'
heartbeats keep arriving in the kernel's socket buffers, and when it runs again its thread can
find ZeroMQ's queue empty before ZeroMQ's I/O thread has read them: every node looked silent
for as long as the stall, and a stall longer than a silence window (2 s) declared every node
lost at once.

:class:`Hearing` measures the manager thread's stalls when a read returns and when a read finds
the queue empty: the wall time since the last measure less the thread's own CPU time in it and
the waits it asked for (a read's timeout, a rest).
After a stall of ``limit_s`` or more, an empty read no longer moves ``heard_at`` for ``hold_s``:
silence stays judged as of before the stall until ZeroMQ has had ``hold_s`` to deliver what
came meanwhile. A manager that keeps stalling (a host starved for minutes) keeps judging as of
its last stall-free read: a member that is really gone is declared once the manager runs again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ms_recover.manager.model import JobModel

log = logging.getLogger("ms_recover.manager")

WARN_EVERY_S = 10.0  # a stall of a heartbeat or more is a warning, at most this often


class Hearing:
    """Moves ``model.heard_at`` on empty reads, except within ``hold_s`` of a stall."""

    def __init__(
        self,
        model: JobModel,
        clock: Callable[[], float],
        limit_s: float,
        hold_s: float,
        wall: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        self.model = model
        self.clock = clock
        self.limit_s, self.hold_s = limit_s, hold_s
        self._wall, self._cpu = wall, cpu
        self._at, self._cpu_at = 0.0, 0.0
        self.start()
        self._hold_until = -1e18
        self.stalls = 0  # stalls of limit_s or more so far
        self._warned_at = -1e18
        self.longest_s = 0.0

    def start(self) -> None:
        """Measure from now, in the calling thread (the one that reads; its CPU clock)."""
        self._at, self._cpu_at = self._wall(), self._cpu()

    def mark(self, asked_s: float) -> float:
        """Right after a read returned, before its frames or its emptiness are taken: the
        stall since the last mark, given the waits asked for since (the read's timeout and
        any rest), in seconds (0 if none)."""
        wall, cpu = self._wall(), self._cpu()
        stalled = (wall - self._at) - (cpu - self._cpu_at) - asked_s
        self._at, self._cpu_at = wall, cpu
        if stalled < self.limit_s:
            return 0.0
        self._hold_until = wall + self.hold_s
        self.stalls += 1
        self.longest_s = max(self.longest_s, stalled)
        loud = stalled >= self.model.config.heartbeat_s and wall - self._warned_at >= WARN_EVERY_S
        self._warned_at = wall if loud else self._warned_at
        log.log(
            logging.WARNING if loud else logging.DEBUG,
            "manager stalled %.2fs (not scheduled: a starved host, a stop); silence is judged "
            "as of before it until %.2fs after (stall %d)",
            stalled,
            self.hold_s,
            self.stalls,
        )
        return stalled

    def vouch(self) -> None:
        """A read found nothing waiting: everything sent until now was heard, unless the
        manager stalled within ``hold_s`` (also since the last mark: a stop in mid-drain)."""
        self.mark(0.0)
        if self._wall() >= self._hold_until:
            self.model.heard_at = self.clock()
