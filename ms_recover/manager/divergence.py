"""Replica divergence: comparing the state digests of data-parallel replicas. Pure.

Every replica of a shard holds the same bits at the same committed step: gradients are reduced
to identical bits on every rank (the host ring computes each segment once and forwards the
bytes), the update is deterministic, and repair copies a replica's whole state. So two
replicas of one shard at one step whose digests differ mean that one of them holds corrupted
state (silent data corruption, a bad repair, a non-deterministic kernel). The manager compares
the digests ranks send with STOPPED at every stop, and the ones they send every
``digest_every_steps`` steps in steady state.

Rule: within each (shard, step) group of at least two replicas, the digest held by a strict
majority is the truth and the ranks holding any other digest are the *minority*, to be repaired
from the majority. Without a strict majority (two replicas that differ, a 2-2 split, three
different digests among four) nothing can say which copy is right: the manager never guesses,
and no replica of that shard may serve as a repair source. Ranks with an empty digest (no state
provider) or no committed step yet are not compared.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from ms_recover.manager.model import Fault, JobModel
from ms_recover.observability.schema import DivergenceRecord, FaultKind, JobState

#: The fault kind of a replica whose state differs from its replicas' (the rank is alive).
DIVERGED = FaultKind.DIVERGED
#: Steady-state digests kept per rank: a few checks back is all a late peer needs.
KEEP_DIGESTS = 4
_ENDED = (JobState.EXITING, JobState.FINISHED)


@dataclasses.dataclass(frozen=True)
class Report:
    """One rank's digest of its state at a committed step."""

    shard: int
    step: int
    digest: str


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A (shard, step) group whose replicas disagree.

    ``minority`` are the ranks to repair from ``majority``; both are empty when no digest has
    a strict majority (``decided`` is then False and ``reason`` says so).
    """

    shard: int
    step: int
    digests: dict[int, str]
    majority: tuple[int, ...]
    minority: tuple[int, ...]

    @property
    def decided(self) -> bool:
        return bool(self.majority)

    @property
    def ranks(self) -> tuple[int, ...]:
        """The ranks this verdict is about: the minority, or every replica when undecided."""
        return self.minority if self.decided else tuple(sorted(self.digests))

    @property
    def reason(self) -> str:
        where = f"replicas of shard {self.shard} at step {self.step}"
        if self.decided:
            return (
                f"{where} diverged: ranks {list(self.minority)} differ from the majority "
                f"{list(self.majority)} (digest {self.digests[self.majority[0]]}); "
                "repair them from the majority"
            )
        return (
            f"{where} disagree with no majority ({_groups(self.digests)}): no replica can be "
            "trusted as a repair source"
        )

    def record(self) -> DivergenceRecord:
        """The ``divergence`` event."""
        return DivergenceRecord(
            shard=self.shard,
            step=self.step,
            ranks=list(self.ranks),
            majority=list(self.majority),
            digests={str(r): d for r, d in sorted(self.digests.items())},
            outcome="repair" if self.decided else "escalate",
            reason=self.reason,
        )


def compare(reports: Mapping[int, Report]) -> list[Verdict]:
    """Every (shard, step) group of ``reports`` (rank -> report) whose digests disagree."""
    groups: dict[tuple[int, int], dict[int, str]] = {}
    for rank, rep in reports.items():
        if rep.digest and rep.step >= 0:
            groups.setdefault((rep.shard, rep.step), {})[rank] = rep.digest
    verdicts = []
    for (shard, step), digests in sorted(groups.items()):
        verdict = judge(shard, step, digests)
        if verdict is not None:
            verdicts.append(verdict)
    return verdicts


def judge(shard: int, step: int, digests: Mapping[int, str]) -> Verdict | None:
    """None if every replica of the group holds the same digest, else the verdict."""
    by_digest: dict[str, list[int]] = {}
    for rank, digest in sorted(digests.items()):
        by_digest.setdefault(digest, []).append(rank)
    if len(by_digest) <= 1:
        return None
    best = max(by_digest.values(), key=len)
    if 2 * len(best) <= len(digests):
        return Verdict(shard, step, dict(digests), (), ())
    minority = tuple(sorted(r for r in digests if r not in best))
    return Verdict(shard, step, dict(digests), tuple(best), minority)


def faults_of(verdict: Verdict, node_of: Callable[[int], int], now: float) -> list[Fault]:
    """One ``diverged`` fault per rank the verdict is about, each marked corrupt: a decided
    verdict's minority is repaired from the majority; an undecided verdict makes every replica
    of the shard unusable as a source, so no repairing strategy is feasible for it."""
    return [
        Fault(
            FaultKind.DIVERGED,
            node_of(r),
            r,
            f"rank {r} holds digest {verdict.digests[r]}: {verdict.reason}",
            now,
            0.0,
            corrupt=True,
        )
        for r in verdict.ranks
    ]


def on_digest(m: JobModel, rank: int, step: int, digest: str, now: float) -> list[Verdict]:
    """Steady state: record ``rank``'s digest of ``step``; once every live, running replica of
    its shard has sent one, compare them. Each verdict about a rank not already being dealt
    with is returned, and its ``diverged`` faults (those ranks only) join ``m.pending``.

    A digest is a fact about a committed step whatever the job is doing, so it is taken in any
    state but an ended job's (a fast job sends its first ones before the manager has seen it
    running). Only the last :data:`KEEP_DIGESTS` steps are kept per rank.
    """
    info = m.ranks[rank]
    if rank not in m.active or m.state in _ENDED:
        return []
    info.digests[step] = digest
    for old in sorted(info.digests)[:-KEEP_DIGESTS]:
        del info.digests[old]
    reports = reports_of(m, info.shard, step)
    if reports is None:
        return []
    for r in reports:
        del m.ranks[r].digests[step]
    busy = handled(m)
    found = []
    for verdict in compare(reports):
        faults = [f for f in faults_of(verdict, m.config.node_of, now) if f.rank not in busy]
        if faults:
            found.append(verdict)
            m.pending.extend(faults)
            for f in faults:  # a repeat within diverge_window_s flags it (manager.subhealth)
                m.diverged_at.setdefault(f.rank, []).append(now)
                del m.diverged_at[f.rank][:-KEEP_DIGESTS]
    return found


def reports_of(m: JobModel, shard: int, step: int) -> dict[int, Report] | None:
    """The steady-state digests of ``step`` from every live, running replica of ``shard``,
    or None while one of them has not sent it yet."""
    replicas = {r: i for r, i in m.members().items() if i.shard == shard and i.alive and not i.done}
    if any(step not in i.digests for i in replicas.values()):
        return None
    return {r: Report(shard, step, i.digests[step]) for r, i in replicas.items()}


def handled(m: JobModel) -> frozenset[int]:
    """Ranks already being dealt with: a pending ``diverged`` fault, or the current recovery
    round's untrusted or replaced ranks (a later check must not report them again)."""
    busy = {f.rank for f in m.pending if f.kind is FaultKind.DIVERGED}
    if m.round is not None and m.in_recovery:
        busy |= m.round.untrusted | m.round.replace_ranks
    return frozenset(busy)


def _groups(digests: Mapping[int, str]) -> str:
    by_digest: dict[str, list[int]] = {}
    for rank, digest in sorted(digests.items()):
        by_digest.setdefault(digest, []).append(rank)
    return ", ".join(f"{d}: ranks {ranks}" for d, ranks in sorted(by_digest.items()))
