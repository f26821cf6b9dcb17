"""What the manager keeps of each rank's step timing (``WorkerHeartbeat.health``).

One :class:`RankHealth` per rank, updated by each report (folded into its agent's heartbeat,
or relayed at once when urgent) and replaced by its first report of a new epoch. :func:`note`
is the one way in; a report of the wrong length is ignored. The pure detection over these
records is :mod:`ms_recover.manager.detection`. Pure: no zmq, numpy or msgpack.
"""

from __future__ import annotations

import dataclasses
import typing

from ms_recover.protocol.messages import HEALTH_FIELDS

if typing.TYPE_CHECKING:
    from ms_recover.manager.model import JobModel

BASELINE_REPORTS = 3  # own-history reports whose median is a rank's baseline (jobs of < 3 ranks)

#: Where each field of a report sits in :attr:`RankHealth.values` (HEALTH_FIELDS' order):
#: the epoch the rank is in; seconds since its last commit; seconds inside its current
#: collective (-1: in none); its step time's p99 (-1: too few steps timed); the median compute
#: time per step over its window and its tenth percentile (-1: too few; scheduling noise only
#: adds time); nonzero inside a declared long stretch, paused or done.
EPOCH, IDLE, COLL, P99, COMPUTE, COMPUTE_LO, LONG = map(
    HEALTH_FIELDS.index, ("epoch", "idle_s", "coll_s", "p99_s", "compute_s", "compute_lo_s", "long")
)


@dataclasses.dataclass(slots=True)  # not frozen: a third of the cost of making one
class RankHealth:
    """One rank's last timing report, heard at ``at`` (the manager's clock). The rank's next
    report of the same epoch updates it in place (at 65,536 ranks: 26,000 reports a second):
    the report's list is kept as it came (``values``, read by the indices above when a rule
    judges it, every few seconds); its first report of an epoch replaces it. Read within one
    decision, never kept."""

    at: float
    epoch: int
    step: int  # the committed step of the report
    values: list[float]  # the report, laid out as HEALTH_FIELDS
    #: The percentile of the rank's previous report of this epoch (-1: none): a rank is
    #: judged slow only on two reports in a row.
    prev_lo_s: float = -1.0
    #: The rank's first compute percentiles of this epoch, for a baseline of its own.
    early: tuple[float, ...] = ()

    def baseline(self) -> float:
        """The median of the rank's first BASELINE_REPORTS percentiles of this epoch, or -1."""
        if len(self.early) < BASELINE_REPORTS:
            return -1.0
        return sorted(self.early)[len(self.early) // 2]


def note(m: JobModel, rank: int, step: int, values: list[float], now: float) -> None:
    """Record ``rank``'s report ``values`` (laid out as HEALTH_FIELDS), heard at ``now``."""
    if len(values) != _FIELDS:
        return
    m.health_rev += 1
    h = m.health.get(rank)
    lo = values[COMPUTE_LO]
    if h is None or h.epoch != values[EPOCH]:  # the rank's first report of its epoch
        early = (lo,) if lo > 0 else ()
        m.health[rank] = RankHealth(now, int(values[EPOCH]), step, values, -1.0, early)
        return
    if lo > 0 and len(h.early) < BASELINE_REPORTS:
        h.early = (*h.early, lo)
    h.prev_lo_s = h.values[COMPUTE_LO]
    h.at, h.step, h.values = now, step, values


_FIELDS = len(HEALTH_FIELDS)
