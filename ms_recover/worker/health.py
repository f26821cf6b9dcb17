"""A rank's step timing, for the manager's hang and fail-slow detection (docs/design.md).

The training thread marks each commit and each collective's start and end (a clock read and a
few stores); the heartbeat thread turns that into the cheap report every heartbeat carries
(:data:`~ms_recover.protocol.messages.HEALTH_FIELDS`): how long since the last commit, how long
inside the current collective, the p99 of recent step times, and the rank's own compute time
per step (time outside collectives) over its last :data:`WINDOW` steps: the median, and the
tenth percentile, which scheduling noise on a loaded host barely moves (noise only adds time)
while a rank that is slow on (nearly) every step moves it all the way.

Guarantees:

* the first :data:`WARM` steps after a start or a recovery (compilation), the steps committed
  inside a declared long stretch (:meth:`StepClock.long_stretch`) and the step right after one
  are not timed; until :data:`MIN_TIMED` steps are timed the p99 is reported as -1 (the
  manager then keeps its fixed bound);
* a report is ``urgent`` (relayed at once, not folded into the agent's next report) while the
  rank has not committed for half its own hang limit, and once when its compute time (tenth
  percentile) shifts up by :data:`SHIFT` over its lowest since it last reported urgently (then on
  :data:`SHIFT_BEATS` heartbeats): the manager hears a hang or a slowdown within a heartbeat,
  not a report period.

Written by the training thread and read by the heartbeat thread: every value is one store, read
whole under the GIL; the rings are copied before they are sorted.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Iterator

WARM = 5  # steps after a start or a recovery that are not timed (compilation)
MIN_TIMED = 20  # timed steps before the p99 is reported
RING = 200  # step times kept for the p99
WINDOW = 24  # compute times kept for the median and tenth percentile
SHIFT = 1.2  # a compute time this many times the last urgent level is reported at once
SHIFT_BEATS = 4  # ... and on this many heartbeats, each with a fresher window


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank below); -1 for no values."""
    if not values:
        return -1.0
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


class StepClock:
    """One rank's step and collective timing (see the module docstring)."""

    def __init__(
        self,
        hang_k: float,
        hang_floor_s: float,
        clock: float | None = None,
    ) -> None:
        self.hang_k = hang_k
        self.hang_floor_s = hang_floor_s
        # The last RING timed step times and the last WINDOW timed compute times (wall clock):
        # bounded deques, which drop their oldest value themselves (no length test and delete
        # on the training thread's every commit).
        self.steps: collections.deque[float] = collections.deque(maxlen=RING)
        self.compute: collections.deque[float] = collections.deque(maxlen=WINDOW)
        self.long = 0  # depth of declared long stretches
        self.paused = False  # in a recovery, or done: nothing is timed or judged
        self._skip = WARM
        self._last = time.monotonic() if clock is None else clock
        # Written by the training thread around each collective (enter_collective and
        # leave_collective, or Session.allreduce's inline copy of them):
        self.coll_since = 0.0  # 0: not inside a collective
        self.coll_sum = 0.0  # time inside collectives in the current step
        self._shift_level = -1.0  # the lowest compute percentile since the last urgent report
        self.last_compute = 0.0  # of the last committed step, timed or not
        self._urgent_left = 0  # urgent heartbeats still to send after a shift

    # ------------------------------------------------------------------ training thread
    def committed(self, now: float) -> None:
        """A step was committed at ``now``: time it, unless it is not to be timed.

        Called on every commit, right after the step's graph (cold caches): no call but the
        two appends."""
        step_s = now - self._last
        compute = step_s - self.coll_sum
        if compute < 0.0:
            compute = 0.0
        self._last, self.coll_sum, self.last_compute = now, 0.0, compute
        if self._skip or self.long or self.paused:
            self._skip = max(self._skip - 1, 1 if self.long else 0)
            return
        self.steps.append(step_s)
        self.compute.append(compute)

    def enter_collective(self, now: float) -> None:
        self.coll_since = now

    def leave_collective(self, now: float) -> None:
        if self.coll_since:
            self.coll_sum += now - self.coll_since
        self.coll_since = 0.0

    def restart(self, now: float) -> None:
        """A recovery ended (or the rank started): time afresh after WARM steps."""
        self.steps.clear()
        self.compute.clear()
        self._skip, self._last, self.coll_sum, self.coll_since = WARM, now, 0.0, 0.0
        self._shift_level = -1.0
        self.paused = False

    @contextlib.contextmanager
    def long_stretch(self) -> Iterator[None]:
        """Steps committed inside are long on purpose (an evaluation, a checkpoint save)."""
        self.long += 1
        try:
            yield
        finally:
            self.long -= 1
            self._last = time.monotonic()  # the stretch is not the next step's time

    # ------------------------------------------------------------------ heartbeat thread
    def report(self, now: float, epoch: int) -> tuple[list[float], bool]:
        """The heartbeat's health values and whether it is urgent."""
        steps, compute = list(self.steps), list(self.compute)
        still = bool(self.long or self.paused)
        idle = now - self._last
        since = self.coll_since
        p99 = quantile(steps, 0.99) if len(steps) >= MIN_TIMED else -1.0
        med = lo = -1.0
        if len(compute) >= WINDOW:
            med, lo = quantile(compute, 0.5), quantile(compute, 0.1)
        values = [
            float(epoch),
            idle,
            now - since if since else -1.0,
            p99,
            med,
            lo,
            1.0 if still else 0.0,
        ]
        if not still and self._shifted(lo):
            self._urgent_left = SHIFT_BEATS
        urgent = self._urgent_left > 0
        self._urgent_left = max(self._urgent_left - 1, 0)
        return values, not still and (urgent or self._stalled(idle, p99))

    def _stalled(self, idle: float, p99: float) -> bool:
        return p99 >= 0 and idle >= max(self.hang_k * p99, self.hang_floor_s) / 2

    def _shifted(self, lo: float) -> bool:
        if lo < 0:
            return False
        if self._shift_level < 0 or lo >= SHIFT * self._shift_level:
            first = self._shift_level < 0
            self._shift_level = lo
            return not first
        self._shift_level = min(self._shift_level, lo)  # the level follows the rank's best
        return False
