"""The per-rank restart budget: how often recoveries may restart one rank.

``max_tries`` bounds one incident; every successful recovery starts the count again, so a rank
(or a node) that fails a while after each recovery would loop forever. The budget bounds that:
each incident that restarts a rank counts once for it, and a rank that was restarted
``rank_restarts_per_hour`` times within the last hour is not restarted again. Its next fault
skips the strategies that restart ranks (``recover-in-place``, ``recover``,
``elastic-training``), so the job moves on to ``dump`` or ``exit``, and the decision event
says why. Pure functions of the job model and the clock (the executor records the restarts).
"""

from __future__ import annotations

from collections.abc import Iterable

from ms_recover.manager.model import JobModel

#: The window the budget counts restarts in, in seconds.
WINDOW_S = 3600.0


def recent(m: JobModel, rank: int, now: float) -> int:
    """How many incidents restarted ``rank`` within the last :data:`WINDOW_S`."""
    return sum(1 for t in m.restarts.get(rank, ()) if now - t < WINDOW_S)


def spent(m: JobModel, ranks: Iterable[int], now: float) -> tuple[tuple[int, int], ...]:
    """(rank, restarts within the window) of each of ``ranks`` whose budget is used up."""
    budget = m.config.rank_restarts_per_hour
    counts = ((r, recent(m, r, now)) for r in sorted(ranks))
    return tuple((r, n) for r, n in counts if n >= budget)


def reason(m: JobModel, over: tuple[tuple[int, int], ...]) -> str:
    """Why a strategy that restarts ranks is skipped for ``over`` (from :func:`spent`)."""
    who = ", ".join(f"rank {r} ({n})" for r, n in over)
    return (
        f"restart budget used up: {who} restarted by recoveries within the last hour "
        f"(rank_restarts_per_hour={m.config.rank_restarts_per_hour})"
    )


def record(m: JobModel, ranks: Iterable[int], now: float) -> None:
    """Count one restart of each of ``ranks`` at ``now``; entries older than the window go."""
    for r in ranks:
        kept = [t for t in m.restarts.get(r, ()) if now - t < WINDOW_S]
        kept.append(now)
        m.restarts[r] = kept
