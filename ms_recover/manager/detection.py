"""Detecting what does not crash: hangs fitted to the job's step time, their culprit, and
fail-slow ranks. Pure functions of the :class:`JobModel` and the clock (no zmq, numpy or
msgpack), called by :func:`~ms_recover.manager.decide.decide`.

**Hangs.** Each rank's heartbeat says how long since it last committed a step, whether it is
inside a collective and for how long, and the p99 of its recent step times
(:mod:`ms_recover.worker.health`). A hang is declared when no rank has committed for
``max(hang_k x p99, hang_floor_s)`` (the p99 is the highest any rank reports), at most
``hang_timeout_s``. The rule applies only while every member's report is of the current epoch
and has a p99: at the start and after a recovery (compilation) a rank reports none until it has
timed enough steps, and a rank inside a declared long stretch (``session.long_stretch``) says
so; then, and when ``MS_RECOVER_HANG_TIMEOUT_S`` is set, the fixed ``hang_timeout_s`` of
:func:`~ms_recover.manager.decide.detect_silence` applies. A report is trusted for at most one
heartbeat past its arrival: a late report delays a declaration, it never causes one.

**The culprit.** When some members wait inside a collective, the hang names the ones that do
not (stuck in their own compute, their heartbeat thread alive): the recovery replaces only them.
A rank whose reports stopped altogether (a frozen process) is named by the others' fresh
reports: when every other member is in a collective and has not committed for the whole
limit, and the rank has been silent as long, it is the culprit (:func:`silent_culprits`),
without waiting for ``rank_silence_s``.

**Fail-slow.** Each rank reports the median of its compute time per step
(outside collectives) and its tenth percentile over its last steps. A rank whose percentile is
``slow_ratio`` times the members' median percentile (jobs of three ranks or more) or its own
early median (fewer) on two of its reports in a row is flagged once, as a ``flagged`` event
with the evidence. A low
percentile, not a mean: a rank must be slow on nearly every step, not on a few; scheduling
noise on a loaded host only adds time to some steps; and a host that slows everyone alike flags
no one. Compute is wall-clock time (an accelerator's kernels run on
the device whatever the host's load); a rank that merely gets less of an oversubscribed host's
CPUs for CPU-bound work can look slow, and is not told apart (see the tests' notes).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from ms_recover.config import JobConfig
from ms_recover.manager.health import COLL, COMPUTE, COMPUTE_LO, IDLE, LONG, P99, RankHealth
from ms_recover.manager.model import Fault, JobModel, RankInfo
from ms_recover.observability.schema import FaultKind, FlaggedRecord

MIN_COMPUTE_S = 0.002  # compute times below this are timer and scheduler noise: never judged
PEERS = 3  # members with a compute time needed to judge a rank against its peers


@dataclasses.dataclass(frozen=True)
class HangLimit:
    """The adaptive limit in force, and the rule that set it (for the fault's detail)."""

    seconds: float
    rule: str


def reports(m: JobModel, ranks: Iterable[RankInfo]) -> list[tuple[RankInfo, RankHealth]] | None:
    """Each rank with its report of the current epoch, or None if one has none (one pass,
    stopping at the first rank without one)."""
    get, epoch = m.health.get, m.epoch
    found = []
    for info in ranks:
        h = get(info.rank)
        if h is None or h.epoch != epoch:
            return None
        found.append((info, h))
    return found


def busy_reports(m: JobModel) -> list[tuple[RankInfo, RankHealth]] | None:
    """:func:`reports` of the live members still training (a judging decision of a
    65,536-rank job reads them once for the hang and fail-slow rules together)."""
    active = m.active
    return reports(m, (i for i in m.ranks.values() if i.alive and not i.done and i.rank in active))


def hang_limit(cfg: JobConfig, timed: list[RankHealth]) -> HangLimit | None:
    """The adaptive hang limit for these reports, or None when the fixed bound applies."""
    if not cfg.hang_adaptive or not timed:
        return None
    p99 = -1.0
    for h in timed:  # one pass, each report's list read once
        v = h.values
        if v[LONG] or v[P99] < 0:
            return None
        if v[P99] > p99:
            p99 = v[P99]
    seconds = min(cfg.hang_timeout_s, max(cfg.hang_k * p99, cfg.hang_floor_s))
    rule = f"max({cfg.hang_k:g} x p99 {p99 * 1000:.0f}ms, floor {cfg.hang_floor_s:g}s)"
    return HangLimit(seconds, rule)


def stalled(h: RankHealth, heard: float, cap: float) -> float:
    """How long the rank has not committed, from its report extrapolated by at most ``cap``."""
    return h.values[IDLE] + min(max(heard - h.at, 0.0), cap)


def detect_hang(
    m: JobModel, now: float, heard: float, pairs: list[tuple[RankInfo, RankHealth]] | None = None
) -> list[Fault]:
    """A hang by the adaptive rule: one fault per culprit, or none. ``pairs``: the busy
    ranks' reports (:func:`busy_reports`) if the caller read them already."""
    pairs = busy_reports(m) if pairs is None else pairs
    if not pairs:
        return []
    limit = hang_limit(m.config, [h for _, h in pairs])
    if limit is None:
        return []
    cap, quiet = m.config.heartbeat_s, math.inf
    for _, h in pairs:  # min(stalled(h, heard, cap)), without two calls per rank
        late = heard - h.at
        late = cap if late > cap else 0.0 if late < 0.0 else late
        if h.values[IDLE] + late < quiet:
            quiet = h.values[IDLE] + late
    if quiet < limit.seconds:
        return silent_culprits(pairs, limit, now, heard, m.config.heartbeat_s)
    named = culprits(pairs)
    why = "not waiting in a collective while the others are"
    if not named:
        named = [min((i for i, _ in pairs), key=lambda i: (i.committed_step, i.rank))]
        why = "no rank stands out: the lowest committed step"
    detail = f"no rank committed a step for {quiet:.1f}s (limit {limit.seconds:.1f}s: {limit.rule})"
    return [
        Fault(
            FaultKind.HANG,
            i.node_rank,
            i.rank,
            f"{detail}; rank {i.rank} at step {i.committed_step}: {why}",
            now,
            quiet,
        )
        for i in named
    ]


def silent_culprits(
    pairs: list[tuple[RankInfo, RankHealth]], limit: HangLimit, now: float, heard: float, cap: float
) -> list[Fault]:
    """The ranks that fell silent (a frozen process: SIGSTOP, a stuck driver call) while every
    other member reports, fresh, that it waits in a collective and has not committed for the
    whole limit. The others' own reports are the evidence; a silent rank's late report alone
    never is."""
    silent = [(i, heard - h.at) for i, h in pairs if heard - h.at >= limit.seconds]
    if not silent:  # the common case, on every judging decision of a running job
        return []
    fresh = [h for _, h in pairs if heard - h.at <= cap]
    if not fresh or len(fresh) + len(silent) != len(pairs):
        return []
    if any(h.values[COLL] < 0 for h in fresh):  # one of the others is not waiting on anyone
        return []
    waited = min(stalled(h, heard, cap) for h in fresh)
    if waited < limit.seconds:
        return []
    why = (
        f"the others wait in a collective, no commit for {waited:.1f}s "
        f"(limit {limit.seconds:.1f}s: {limit.rule})"
    )
    return [
        Fault(
            FaultKind.HANG,
            i.node_rank,
            i.rank,
            f"rank {i.rank} at step {i.committed_step} silent for {age:.1f}s while {why}",
            now,
            age,
        )
        for i, age in silent
    ]


def culprits(pairs: list[tuple[RankInfo, RankHealth]]) -> list[RankInfo]:
    """The ranks not inside a collective, when at least one other rank is in one."""
    if not any(h.values[COLL] >= 0 for _, h in pairs):
        return []
    return [i for i, h in pairs if h.values[COLL] < 0]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def slow_flags(
    m: JobModel, pairs: list[tuple[RankInfo, RankHealth]] | None = None
) -> list[FlaggedRecord]:
    """The members whose compute time is persistently slow, not flagged before. ``pairs``:
    the busy ranks' reports (:func:`busy_reports`) if the caller read them already."""
    pairs = (busy_reports(m) if pairs is None else pairs) or []
    timed = [
        (i, h)
        for i, h in pairs
        if not h.values[LONG] and h.values[COMPUTE] > 0 and h.values[COMPUTE_LO] > 0
    ]
    peers = median([h.values[COMPUTE_LO] for _, h in timed]) if len(timed) >= PEERS else -1.0
    ratio = m.config.slow_ratio
    if peers > 0:  # the rule below against the members' median, as one filter first
        if peers < MIN_COMPUTE_S:
            return []
        bar = ratio * peers  # slow on this report and the one before
        timed = [(i, h) for i, h in timed if h.values[COMPUTE_LO] >= bar and h.prev_lo_s >= bar]
    out = []
    for info, h in timed:
        if info.rank in m.flagged:
            continue
        ref, basis = (peers, "the members' median") if peers > 0 else (h.baseline(), "its own")
        lo = h.values[COMPUTE_LO]
        slow = min(lo, h.prev_lo_s)  # on this report and the one before
        if ref < MIN_COMPUTE_S or slow < ratio * ref:
            continue
        agent = m.agents.get(info.node_rank)
        out.append(
            FlaggedRecord(
                rank=info.rank,
                node=info.node_rank,
                host=agent.pod_ip if agent is not None else "",
                step=h.step,
                reason="slow",
                detail=(
                    f"compute time per step {h.values[COMPUTE] * 1000:.1f}ms (tenth percentile "
                    f"{lo * 1000:.1f}ms) is {lo / ref:.2f}x {basis} "
                    f"{ref * 1000:.1f}ms (flagged at >= {m.config.slow_ratio:g}x)"
                ),
                score=round(lo / ref, 3),
                compute_s=round(h.values[COMPUTE], 6),
                reference_s=round(ref, 6),
            )
        )
    return out
